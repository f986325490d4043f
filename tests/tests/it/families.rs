//! Other decoder families end to end through real NATS and S3: the real
//! Qwen2.5-Coder 0.5B answering a chat through its own template and stopping
//! at its own end-of-turn token, and the real Gemma 3 270M, a base model
//! with no chat template, taking raw prompts (BOS added as its GGUF says)
//! while refusing chats with an error that names the flag, until a consumer
//! started with `--chat-template` renders them.

use std::time::Duration;

use serde_json::json;
use sluice_schemas::{
    ErrorCode, FinishReason, Generation, Input, Job, JobState, Outcome, Output, Task,
};
use sluice_tests::deploy::Deployment;
use sluice_tests::results::wait_results;

fn gguf(dir: &str, file: &str) -> std::path::PathBuf {
    sluice_tests::models_dir().join(dir).join(file)
}

fn job(d: &Deployment, id: &str, model: &str, item: serde_json::Value, max_new: u32) -> Job {
    let mut job = d.producer.job(
        Task::Generate,
        id,
        vec![Input::Inline { items: vec![item] }],
    );
    job.model = model.into();
    job.parameters.generate.max_new_tokens = Some(max_new);
    job
}

/// A generate consumer of the GGUF at `path`, serving it as `model`.
async fn generate_consumer(
    d: &Deployment,
    path: &std::path::Path,
    model: &str,
    extra: &[&str],
) -> sluice_consumer::Consumer {
    let mut args = vec![
        "--task=generate".to_string(),
        "--max-items-per-job=4".to_string(),
        format!("--model-name={model}"),
    ];
    args.extend(extra.iter().map(|a| a.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    d.start_consumer_of(path, &args).await.unwrap()
}

fn generation(outcome: &Outcome) -> &Generation {
    match outcome {
        Outcome::Ok {
            output: Output::Inline { generations, .. },
        } if generations.len() == 1 => &generations[0],
        other => panic!("expected one inline generation, got {other:?}"),
    }
}

/// Qwen2.5-Coder's ChatML template (with its default system prompt) renders
/// the chat; the answer is code, and it ends at `<|im_end|>`, Qwen's
/// end-of-turn token, not at the length limit.
#[tokio::test]
async fn qwen25_answers_a_chat_through_its_own_template_and_stops_at_its_turn_end() {
    let d = Deployment::start().await.unwrap();
    let model = "qwen2.5-coder-0.5b";
    let path = gguf(
        "qwen2.5-coder-0.5b",
        "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    );
    let consumer = generate_consumer(&d, &path, model, &[]).await;
    let mut results = d.producer.subscribe_results().await.unwrap();
    let chat = json!({"messages": [{"role": "user", "content": "Write a Python function that adds two numbers. Only the code, no explanation."}]});
    d.producer
        .submit(&job(&d, "qwen-chat", model, chat, 200))
        .await
        .unwrap();
    let got = wait_results(&mut results, 1, Duration::from_secs(300)).await;
    let answer = generation(&got[0].outcome);
    eprintln!("qwen2.5-coder: {answer:?}");
    assert!(answer.text.contains("def "), "{:?}", answer.text);
    assert_eq!(answer.finish_reason, FinishReason::Eos, "{:?}", answer.text);
    assert!(!answer.text.contains("<|im_end|>"), "{:?}", answer.text);
    // The template's system prompt and markers: far more than the question.
    assert!(answer.prompt_tokens > 30, "{}", answer.prompt_tokens);
    consumer.shutdown(Duration::from_secs(10)).await.unwrap();
}

/// Gemma 3 270M has no chat template: raw prompts run (BOS added, as its
/// GGUF's add_bos_token says: 6 prompt tokens for 5 of text, as llama.cpp
/// counts them), a chat fails alone with `input_invalid` naming
/// `--chat-template`, dead-lettered; a consumer started with Gemma's chat
/// template file renders the same chat.
#[tokio::test]
async fn a_base_model_takes_raw_prompts_and_refuses_chats_until_given_a_template() {
    let d = Deployment::start().await.unwrap();
    let model = "gemma-3-270m";
    let path = gguf("gemma3-270m", "gemma-3-270m-Q4_K_M.gguf");
    let base = generate_consumer(&d, &path, model, &[]).await;
    let mut results = d.producer.subscribe_results().await.unwrap();
    let p = &d.producer;
    p.submit(&job(
        &d,
        "gemma-raw",
        model,
        json!("The capital of France is"),
        12,
    ))
    .await
    .unwrap();
    let chat = json!({"messages": [{"role": "user", "content": "What is the capital of France?"}]});
    p.submit(&job(&d, "gemma-chat", model, chat.clone(), 12))
        .await
        .unwrap();
    let got = wait_results(&mut results, 2, Duration::from_secs(300)).await;
    let by_id = |id: &str| {
        got.iter()
            .find(|r| r.job_id.as_deref() == Some(id))
            .unwrap()
    };
    let raw = generation(&by_id("gemma-raw").outcome);
    eprintln!("gemma raw prompt: {raw:?}");
    assert_eq!(raw.prompt_tokens, 6, "BOS and the 5 tokens llama.cpp reads");
    assert_eq!(raw.finish_reason, FinishReason::Length);
    assert!(!raw.text.trim().is_empty());
    let Outcome::Error { error } = &by_id("gemma-chat").outcome else {
        panic!("a chat ran on a model without a template");
    };
    eprintln!("gemma chat refused: {}", error.message);
    assert_eq!(error.code, ErrorCode::InputInvalid);
    for words in ["no chat template", "--chat-template"] {
        assert!(
            error.message.contains(words),
            "{:?} lacks {words:?}",
            error.message
        );
    }
    let status = p.status("gemma-chat").await.unwrap().unwrap();
    assert_eq!(status.state, JobState::Failed);
    assert_eq!(
        d.dead_letters().await,
        1,
        "the refused chat is dead-lettered"
    );
    base.shutdown(Duration::from_secs(10)).await.unwrap();

    let template =
        sluice_tests::models_dir().join("llama.cpp/templates/google-gemma-2-2b-it.jinja");
    let template = format!("--chat-template={}", template.display());
    let with_template = generate_consumer(&d, &path, model, &[&template]).await;
    p.submit(&job(&d, "gemma-chat-2", model, chat, 12))
        .await
        .unwrap();
    let got = wait_results(&mut results, 1, Duration::from_secs(300)).await;
    let answer = generation(&got[0].outcome);
    eprintln!("gemma chat with --chat-template: {answer:?}");
    // <bos><start_of_turn>user\n...<end_of_turn>\n<start_of_turn>model\n
    assert!(answer.prompt_tokens > 10, "{}", answer.prompt_tokens);
    with_template
        .shutdown(Duration::from_secs(10))
        .await
        .unwrap();
}

/// A `--chat-template` that does not compile stops the consumer at
/// start-up, naming the flag and the file.
#[tokio::test]
async fn a_chat_template_that_does_not_compile_is_refused_at_start() {
    let d = Deployment::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.jinja");
    std::fs::write(&bad, "{% for m in messages %}{{ m['content'] }").unwrap();
    let err = match d
        .start_consumer(&[
            "--task=generate",
            &format!("--chat-template={}", bad.display()),
        ])
        .await
    {
        Err(e) => format!("{e:#}"),
        Ok(_) => panic!("a consumer started with a broken template"),
    };
    eprintln!("start-up refused: {err}");
    for words in ["--chat-template", "bad.jinja", "does not compile"] {
        assert!(err.contains(words), "{err:?} lacks {words:?}");
    }
}
