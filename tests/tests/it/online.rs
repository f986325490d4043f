//! The gateway's online endpoints (`/v1/embeddings`, `/v1/chat/completions`,
//! `/v1/completions`, `/v1/models`), each request a job through the queue,
//! called by the official `openai` SDK (Python, from PyPI) and, for the
//! error cases, by plain HTTP.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sluice_schemas::JobState;
use sluice_tests::deploy::Deployment;
use sluice_tests::fixtures::{cosine, encoder_family, minilm_reference};

const KEY: &str = "sk-team-a-0123456789";
const KEYS: &str = "team-a:sk-team-a-0123456789";

const SDK_SCRIPT: &str = r#"
import json, sys
from openai import OpenAI
texts = json.loads(sys.argv[1])
client = OpenAI()
models = [m.id for m in client.models.list()]
emb = client.embeddings.create(model="all-minilm-l6-v2", input=texts)
chat = client.chat.completions.create(
    model="smollm2-135m-instruct",
    messages=[{"role": "user", "content": "What is 2 plus 2?"}],
    max_tokens=8, temperature=0)
comp = client.completions.create(
    model="smollm2-135m-instruct", prompt="The capital of France is", max_tokens=4, temperature=0)
# The same requests streamed.
stream = client.chat.completions.create(
    model="smollm2-135m-instruct",
    messages=[{"role": "user", "content": "What is 2 plus 2?"}],
    max_tokens=8, temperature=0, stream=True, stream_options={"include_usage": True})
deltas, roles, finish, usage, ids = [], [], None, None, set()
for chunk in stream:
    ids.add(chunk.id)
    if chunk.usage:
        usage = [chunk.usage.prompt_tokens, chunk.usage.completion_tokens]
    for c in chunk.choices:
        if c.delta.role:
            roles.append(c.delta.role)
        if c.delta.content:
            deltas.append(c.delta.content)
        finish = c.finish_reason or finish
comp_stream = client.completions.create(
    model="smollm2-135m-instruct", prompt="The capital of France is", max_tokens=4,
    temperature=0, stream=True)
comp_deltas = [c.text for chunk in comp_stream for c in chunk.choices]
print(json.dumps({
    "streamed": deltas,
    "streamed_roles": roles,
    "streamed_finish": finish,
    "streamed_usage": usage,
    "streamed_ids": len(ids),
    "completion_streamed": "".join(comp_deltas),
    "models": models,
    "vectors": [d.embedding for d in emb.data],
    "embed_tokens": emb.usage.prompt_tokens,
    "chat": chat.choices[0].message.content,
    "chat_finish": chat.choices[0].finish_reason,
    "chat_usage": [chat.usage.prompt_tokens, chat.usage.completion_tokens],
    "completion": comp.choices[0].text,
}))
"#;

/// Runs `script` with the official Python SDK against the gateway at
/// `base` (`texts` as its JSON argument); what it printed, parsed.
async fn run_sdk(script: &str, texts: &[impl serde::Serialize], base: &str) -> Value {
    let texts = serde_json::to_string(texts).unwrap();
    sluice_tests::sdk::run_python(script, &[texts], base, KEY, Duration::from_secs(300)).await
}

#[tokio::test]
async fn the_openai_sdk_calls_the_online_endpoints_through_the_queue() {
    let d = Deployment::start().await.unwrap();
    let embed = d.start_consumer(&[]).await.unwrap();
    let _generate = d
        .start_consumer(&[
            "--task=generate",
            "--max-new-tokens=16",
            "--max-prompt-tokens=256",
        ])
        .await
        .unwrap();
    let gateway = d.start_gateway(KEYS, &[]).await.unwrap();
    let base = format!("http://{}/v1", gateway.addr);
    let reference = minilm_reference().unwrap();
    let texts: Vec<&str> = reference
        .items
        .iter()
        .take(6)
        .map(|i| i.text.as_str())
        .collect();

    let got = run_sdk(SDK_SCRIPT, &texts, &base).await;
    assert_eq!(
        got["models"],
        json!([
            "all-minilm-l6-v2",
            "smollm2-135m-instruct",
            "whisper-tiny-en"
        ])
    );
    let vectors: Vec<Vec<f32>> = serde_json::from_value(got["vectors"].clone()).unwrap();
    let offline = sluice_tests::offline_vectors(&texts).await;
    assert_eq!(vectors.len(), texts.len());
    for (online, offline) in vectors.iter().zip(&offline) {
        let c = cosine(online, offline);
        assert!(c >= 0.9999, "online vs offline cosine {c}");
    }
    assert!(got["embed_tokens"].as_u64().unwrap() > 0, "{got}");
    assert!(!got["chat"].as_str().unwrap().is_empty(), "{got}");
    assert!(
        ["stop", "length"].contains(&got["chat_finish"].as_str().unwrap()),
        "{got}"
    );
    assert!(got["chat_usage"][0].as_u64().unwrap() > 0, "{got}");
    assert!(got["chat_usage"][1].as_u64().unwrap() > 0, "{got}");
    assert!(!got["completion"].as_str().unwrap().is_empty(), "{got}");
    // Streamed, the same greedy answer arrives in pieces: the deltas add up
    // to the whole answer, with its finish reason and usage.
    let deltas: Vec<String> = serde_json::from_value(got["streamed"].clone()).unwrap();
    assert_eq!(deltas.concat(), got["chat"].as_str().unwrap(), "{got}");
    assert!(deltas.len() >= 2, "the answer came in one piece: {got}");
    assert_eq!(got["streamed_roles"], json!(["assistant"]), "{got}");
    assert_eq!(got["streamed_finish"], got["chat_finish"], "{got}");
    assert_eq!(
        got["streamed_usage"], got["chat_usage"],
        "include_usage: {got}"
    );
    assert_eq!(got["streamed_ids"], 1, "one id per stream: {got}");
    assert_eq!(got["completion_streamed"], got["completion"], "{got}");
    // Each request was a job on the stream, published as the key's tenant.
    let tenants = embed.stats.tenant_tokens();
    assert!(
        tenants.iter().any(|(t, n)| t == "team-a" && *n > 0),
        "{tenants:?}"
    );

    // What cannot run is refused at once, in OpenAI's error shape.
    let http = reqwest::Client::new();
    let post = |path: &str, body: Value, key: Option<&str>| {
        let mut r = http
            .post(format!("{base}{path}"))
            .header("content-type", "application/json")
            .body(body.to_string());
        if let Some(key) = key {
            r = r.bearer_auth(key);
        }
        r.send()
    };
    for (path, body, key, status, code) in [
        (
            "/embeddings",
            json!({"model": "all-minilm-l6-v2", "input": "x", "stream": true}),
            Some(KEY),
            400,
            Value::Null,
        ),
        (
            "/embeddings",
            json!({"model": "text-embedding-3-small", "input": "x"}),
            Some(KEY),
            404,
            json!("model_not_found"),
        ),
        (
            "/chat/completions",
            json!({"model": "smollm2-135m-instruct", "messages": "not a list"}),
            Some(KEY),
            400,
            Value::Null,
        ),
        (
            "/embeddings",
            json!({"model": "all-minilm-l6-v2", "input": "x"}),
            None,
            401,
            json!("invalid_api_key"),
        ),
    ] {
        let r = post(path, body.clone(), key).await.unwrap();
        assert_eq!(r.status().as_u16(), status, "{path} {body}");
        let answer: Value = serde_json::from_slice(&r.bytes().await.unwrap()).unwrap();
        assert!(answer["error"]["message"].is_string(), "{answer}");
        if !code.is_null() {
            assert_eq!(answer["error"]["code"], code, "{answer}");
        }
    }
    let r = http
        .post(format!("{base}/embeddings"))
        .bearer_auth(KEY)
        .header("sluice-deadline-secs", "soon")
        .header("content-type", "application/json")
        .body(json!({"model": "all-minilm-l6-v2", "input": "x"}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 400);
}

/// A failure of ours reached the online caller in the consumer's own words:
/// the S3 SDK's text, naming the output bucket and the storage endpoint. Now the caller is told the code and a stable sentence naming
/// the job; the detail stays in the logs.
#[tokio::test]
async fn a_failure_of_ours_reaches_the_caller_without_its_internal_detail() {
    let mut d = Deployment::start_with(sluice_producer::provision::Settings {
        max_deliver: 2,
        ..Default::default()
    })
    .await
    .unwrap();
    let _consumer = d
        .start_consumer(&[
            "--inline-output-max-bytes=0",
            "--retry-base-ms=100",
            "--retry-max-ms=200",
        ])
        .await
        .unwrap();
    let gateway = d.start_gateway(KEYS, &[]).await.unwrap();
    // S3 goes away under the running consumer: its output write fails (an
    // online answer needs nothing else of S3).
    d.servers.s3.stop();
    let r = reqwest::Client::new()
        .post(format!("http://{}/v1/embeddings", gateway.addr))
        .bearer_auth(KEY)
        .header("content-type", "application/json")
        .body(json!({"model": "all-minilm-l6-v2", "input": "kept nowhere"}).to_string())
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let answer: Value = serde_json::from_slice(&r.bytes().await.unwrap()).unwrap();
    assert_eq!(status, 500, "{answer}");
    assert_eq!(answer["error"]["code"], "storage_unavailable", "{answer}");
    assert_eq!(answer["error"]["type"], "server_error", "{answer}");
    let message = answer["error"]["message"].as_str().unwrap();
    let endpoint = format!("127.0.0.1:{}", d.servers.s3.port);
    for secret in [d.bucket.as_str(), endpoint.as_str(), "s3://", "outputs/"] {
        assert!(
            !message.contains(secret),
            "the answer names {secret}: {message}"
        );
    }
    assert!(
        message.contains("try again") && message.contains("(job "),
        "{message}"
    );
    // The job's record keeps the detail, for the operator.
    let job_id = message
        .split("(job ")
        .nth(1)
        .and_then(|rest| rest.split(';').next())
        .unwrap();
    let status = d
        .producer
        .status_in(Some("team-a"), job_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(status.state, JobState::Failed);
    assert!(
        status.error.unwrap().message.contains(&d.bucket),
        "the record lost the detail"
    );
}

/// A request whose deadline passes while its job waits (no consumer runs)
/// is answered 504, and its job is cancelled: a consumer that starts later
/// never runs it.
#[tokio::test]
async fn an_online_request_past_its_deadline_gets_504_and_its_job_never_runs() {
    let d = Deployment::start().await.unwrap();
    let gateway = d
        .start_gateway(KEYS, &["--online-grace-secs=1"])
        .await
        .unwrap();
    let asked = Instant::now();
    let r = reqwest::Client::new()
        .post(format!("http://{}/v1/embeddings", gateway.addr))
        .bearer_auth(KEY)
        .header("sluice-deadline-secs", "1")
        .header("content-type", "application/json")
        .body(json!({"model": "all-minilm-l6-v2", "input": "too late"}).to_string())
        .send()
        .await
        .unwrap();
    let waited = asked.elapsed();
    assert_eq!(r.status().as_u16(), 504);
    let answer: Value = serde_json::from_slice(&r.bytes().await.unwrap()).unwrap();
    assert_eq!(answer["error"]["code"], "deadline_exceeded", "{answer}");
    assert!(
        waited < Duration::from_secs(10),
        "answered after {waited:?}"
    );
    let message = answer["error"]["message"].as_str().unwrap();
    assert!(message.contains("will not run"), "{message}");
    let job_id = message
        .split("its job ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .unwrap()
        .to_string();
    let status = d
        .producer
        .status_in(Some("team-a"), &job_id)
        .await
        .unwrap()
        .unwrap();
    assert!(
        matches!(status.state, JobState::Cancelled | JobState::Expired),
        "{status:?}"
    );
    // A consumer that starts now does not run it.
    let consumer = d.start_consumer(&[]).await.unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        consumer
            .stats
            .jobs_ok
            .load(std::sync::atomic::Ordering::Relaxed),
        0
    );
    let status = d
        .producer
        .status_in(Some("team-a"), &job_id)
        .await
        .unwrap()
        .unwrap();
    assert!(
        matches!(status.state, JobState::Cancelled | JobState::Expired),
        "{status:?}"
    );
    consumer.shutdown(Duration::from_secs(5)).await.unwrap();
}

const PROMPT_SCRIPT: &str = r#"
import json, sys
import openai
from openai import OpenAI
texts = json.loads(sys.argv[1])
client = OpenAI()
model = "all-minilm-l6-v2"
default = client.embeddings.create(model=model, input=texts)
passage = client.embeddings.create(model=model, input=texts, extra_body={"prompt_name": "passage"})
try:
    client.embeddings.create(model=model, input=texts, extra_body={"prompt_name": "doc"})
    refused = None
except openai.BadRequestError as e:
    refused = {"status": e.status_code, "code": e.code, "message": e.message}
print(json.dumps({
    "default": [d.embedding for d in default.data],
    "passage": [d.embedding for d in passage.data],
    "refused": refused,
}))
"#;

/// The official SDK names a model's prompt with `extra_body={"prompt_name":
/// ...}` (the field sentence-transformers servers take): the vectors are
/// sentence-transformers' of that prompt, none gives the default prompt's,
/// and a name the model lacks is a 400 `invalid_parameters` naming the
/// prompts it has. The model: the f16 random-weight fixture with e5's
/// prompts, served under the default name.
#[tokio::test]
async fn the_sdk_names_a_prompt_with_extra_body() {
    let d = Deployment::start().await.unwrap();
    let (dir, reference) = encoder_family("bert-mean-f16-prompts").unwrap();
    let _embed = d.start_consumer_of(&dir, &[]).await.unwrap();
    let gateway = d.start_gateway(KEYS, &[]).await.unwrap();
    let texts = &reference.texts[..];
    let got = run_sdk(PROMPT_SCRIPT, texts, &format!("http://{}/v1", gateway.addr)).await;
    for (name, expected) in [
        ("default", &reference.vectors),
        ("passage", &reference.prompt_vectors["passage"]),
    ] {
        let vectors: Vec<Vec<f32>> = serde_json::from_value(got[name].clone()).unwrap();
        assert_eq!(vectors.len(), texts.len(), "{name}");
        for (i, (v, e)) in vectors.iter().zip(expected).enumerate() {
            let c = cosine(v, e);
            assert!(c >= 0.9999, "{name}, text {i}: cosine {c}");
        }
    }
    let refused = &got["refused"];
    assert_eq!(refused["status"], 400, "{got}");
    assert_eq!(refused["code"], "invalid_parameters", "{got}");
    let message = refused["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("no prompt named \"doc\" (its prompts: document, passage, query)"),
        "{message}"
    );
}
