//! Embedding jobs end to end through real NATS and S3.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

use sha2::{Digest, Sha256};
use sluice_schemas::npy;
use sluice_schemas::{Input, JobState, Outcome, Output};
use sluice_tests::deploy::Deployment;
use sluice_tests::fixtures::{cosine, encoder_family, jsonl, minilm_reference};
use sluice_tests::results::{next_error, wait_results};

#[tokio::test]
async fn embed_job_via_presigned_url_matches_reference_and_small_job_comes_inline() {
    let d = Deployment::start().await.unwrap();
    let reference = minilm_reference().unwrap();
    let consumer = d.start_consumer(&[]).await.unwrap();
    let mut results = d.producer.subscribe_results().await.unwrap();

    let texts: Vec<String> = reference.items.iter().map(|i| i.text.clone()).collect();
    let big = d
        .producer
        .embed_job_from_jsonl("ref-all", jsonl(&texts))
        .await
        .unwrap();
    d.producer.submit(&big).await.unwrap();
    let small = d.producer.embed_job(
        "ref-small",
        vec![Input::Inline {
            items: vec![
                texts[0].clone().into(),
                serde_json::json!({"text": texts[1]}),
            ],
        }],
    );
    d.producer.submit(&small).await.unwrap();

    let got = wait_results(&mut results, 2, Duration::from_secs(120)).await;
    let by_id: HashMap<_, _> = got
        .into_iter()
        .map(|r| (r.job_id.clone().unwrap_or_default(), r))
        .collect();

    // The big job: an .npy in S3 at a key of the job id and its delivery
    // (the first: stream sequence N, attempt 1).
    let r = &by_id["ref-all"];
    let Outcome::Ok {
        output: Output::S3(o),
    } = &r.outcome
    else {
        panic!("expected an S3 output, got {:?}", r.outcome);
    };
    let seq = o
        .key
        .strip_prefix("outputs/ref-all.")
        .and_then(|k| k.strip_suffix("-1.npy"))
        .unwrap_or_else(|| panic!("not the first delivery's key: {}", o.key));
    assert!(seq.parse::<u64>().is_ok(), "{}", o.key);
    assert_eq!(o.shape, vec![texts.len() as u64, 384]);
    assert_eq!(r.usage.items, texts.len() as u64);
    let over_limit = reference
        .items
        .iter()
        .filter(|i| i.tokens_untruncated > 256)
        .count();
    assert!(over_limit >= 2, "the reference set exercises truncation");
    assert_eq!(r.usage.truncated_items, over_limit as u64);
    assert_eq!(r.attempt, 1);
    for stage in [
        r.timings_ms.fetch,
        r.timings_ms.tokenize,
        r.timings_ms.inference,
        r.timings_ms.write,
        r.timings_ms.total,
    ] {
        assert!(
            stage.is_some(),
            "missing a stage timing: {:?}",
            r.timings_ms
        );
    }
    let bytes = d.read_object(&o.key).await.unwrap();
    assert_eq!(bytes.len() as u64, o.bytes);
    assert_eq!(hex::encode(Sha256::digest(&bytes)), o.sha256);
    let (rows, dim, values) = npy::decode_f32(&bytes).unwrap();
    assert_eq!((rows, dim), (texts.len(), 384));
    for (i, item) in reference.items.iter().enumerate() {
        let v = &values[i * dim..(i + 1) * dim];
        let c = cosine(v, &item.embedding);
        assert!(
            c >= 0.999,
            "item {i} ({} tokens): cosine {c}",
            item.tokens_untruncated
        );
    }

    // The small job: inline.
    let r = &by_id["ref-small"];
    let Outcome::Ok {
        output: Output::Inline { embeddings, .. },
    } = &r.outcome
    else {
        panic!("expected inline output, got {:?}", r.outcome);
    };
    assert_eq!(embeddings.len(), 2);
    for (v, item) in embeddings.iter().zip(&reference.items) {
        assert!(cosine(v, &item.embedding) >= 0.999);
        let norm: f32 = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-4, "normalized by default");
    }

    // The status records say done, with the output location.
    let status = d.producer.status("ref-all").await.unwrap().unwrap();
    assert_eq!(status.state, JobState::Done);
    let Outcome::Ok {
        output: Output::S3(answered),
    } = &by_id["ref-all"].outcome
    else {
        unreachable!()
    };
    assert_eq!(
        status.output.as_ref().map(|o| o.key.as_str()),
        Some(answered.key.as_str())
    );
    assert_eq!(
        d.producer.status("ref-small").await.unwrap().unwrap().state,
        JobState::Done
    );

    // Nothing left in the stream.
    assert_eq!(
        d.jobs_in_stream_settled(0).await,
        0,
        "jobs left in the stream"
    );
    consumer.shutdown(Duration::from_secs(10)).await.unwrap();
}

#[tokio::test]
async fn a_job_of_thousands_of_texts_spans_batches_and_mixed_jobs_share_them() {
    let d = Deployment::start().await.unwrap();
    let consumer = d
        .start_consumer(&["--max-batch-tokens=1024", "--max-wait-ms=50"])
        .await
        .unwrap();
    let mut results = d.producer.subscribe_results().await.unwrap();

    let many: Vec<String> = (0..2000)
        .map(|i| format!("text number {i} of a long job"))
        .collect();
    let job = d
        .producer
        .embed_job_from_jsonl("many", jsonl(&many))
        .await
        .unwrap();
    // Jobs of mixed lengths published together.
    let mut others = Vec::new();
    for j in 0..12 {
        let words = 3 + j * 15;
        let texts: Vec<String> = (0..4)
            .map(|k| format!("job {j} item {k} {}", "word ".repeat(words)))
            .collect();
        others.push(
            d.producer
                .embed_job_from_jsonl(&format!("mixed-{j}"), jsonl(&texts))
                .await
                .unwrap(),
        );
    }
    d.producer.submit(&job).await.unwrap();
    for o in &others {
        d.producer.submit(o).await.unwrap();
    }
    let got = wait_results(&mut results, 13, Duration::from_secs(300)).await;
    for r in &got {
        assert!(
            matches!(r.outcome, Outcome::Ok { .. }),
            "{:?} failed: {:?}",
            r.job_id,
            r.outcome
        );
    }
    let many_result = got
        .iter()
        .find(|r| r.job_id.as_deref() == Some("many"))
        .unwrap();
    assert_eq!(many_result.usage.items, 2000);

    let stats = &consumer.stats;
    let batches = stats.batches.load(Ordering::Relaxed);
    assert!(
        batches >= 20,
        "2000 items at <=1024 padded tokens need many batches, got {batches}"
    );
    assert!(stats.max_batch_padded_tokens.load(Ordering::Relaxed) <= 1024);
    assert!(
        stats.batches_multi_job.load(Ordering::Relaxed) > 0,
        "no batch mixed jobs"
    );
    assert!(
        stats.batches_mixed_length.load(Ordering::Relaxed) > 0,
        "no batch mixed lengths"
    );
    // The same figures on the metrics endpoint.
    let metrics = sluice_tests::get_text(&format!("http://{}/metrics", consumer.http_addr)).await;
    assert!(metrics.contains("sluice_jobs_ok_total 13"), "{metrics}");
    assert!(
        metrics.contains("sluice_batch_padded_tokens_max "),
        "{metrics}"
    );
    consumer.shutdown(Duration::from_secs(10)).await.unwrap();
}

#[tokio::test]
async fn truncation_off_refuses_long_items_with_a_clear_code() {
    let d = Deployment::start().await.unwrap();
    let consumer = d.start_consumer(&[]).await.unwrap();
    let mut results = d.producer.subscribe_results().await.unwrap();
    let long = "word ".repeat(600);
    let mut job = d.producer.embed_job(
        "too-long",
        vec![Input::Inline {
            items: vec!["short".into(), long.into()],
        }],
    );
    job.parameters.encoder.truncate = Some(false);
    d.producer.submit(&job).await.unwrap();
    let (_, error) = next_error(&mut results).await;
    assert_eq!(error.code, sluice_schemas::ErrorCode::ItemTooLong);
    assert!(
        error.message.contains("item 1 has more than 256 tokens"),
        "{}",
        error.message
    );
    assert!(!error.retryable);
    let status = d.producer.status("too-long").await.unwrap().unwrap();
    assert_eq!(status.state, JobState::Failed);
    // Not lost: the dead-letter stream holds it.
    assert_eq!(d.dead_letters().await, 1);
    consumer.shutdown(Duration::from_secs(10)).await.unwrap();
}

/// A model directory sluice would run differently from sentence-transformers
/// (here one whose pooling module asks for two modes at once, their vectors
/// concatenated, and a cross-encoder) stops the consumer at start-up with the file, the
/// field and what is supported; the job waiting for it stays in the stream
/// and is answered once a consumer with a model it runs starts.
#[tokio::test]
async fn a_model_the_encoder_would_run_wrong_is_refused_at_start_and_no_job_is_lost() {
    let d = Deployment::start().await.unwrap();
    let job = d.producer.embed_job(
        "waits-for-a-model",
        vec![Input::Inline {
            items: vec!["hello".into()],
        }],
    );
    d.producer.submit(&job).await.unwrap();

    let weights = sluice_tests::models_dir().join("all-minilm-l6-v2");
    let dir = tempfile::tempdir().unwrap();
    for file in ["config.json", "tokenizer.json", "model.safetensors"] {
        std::os::unix::fs::symlink(weights.join(file), dir.path().join(file)).unwrap();
    }
    std::fs::create_dir(dir.path().join("1_Pooling")).unwrap();
    std::fs::write(
        dir.path().join("1_Pooling/config.json"),
        r#"{"embedding_dimension": 768, "pooling_mode": ["cls", "mean"], "include_prompt": true}"#,
    )
    .unwrap();
    let mut refused = d.consumer_config(&[]);
    refused.model.model_dir = Some(dir.path().to_path_buf());
    let err = match sluice_consumer::start(refused).await {
        Err(e) => format!("{e:#}"),
        Ok(_) => panic!("a consumer started on two pooling modes"),
    };
    eprintln!("start-up refused: {err}");
    for words in [
        "1_Pooling/config.json",
        "pooling_mode = [\"cls\",\"mean\"] is not supported",
        "supported: one pooling_mode of cls, max, mean, mean_sqrt_len_tokens, weightedmean, lasttoken",
    ] {
        assert!(err.contains(words), "{err:?} lacks {words:?}");
    }
    // A cross-encoder (a reranker) is refused too: its encoder alone
    // would embed, wrongly.
    let reranker = tempfile::tempdir().unwrap();
    let mut config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(weights.join("config.json")).unwrap()).unwrap();
    config["architectures"] = serde_json::json!(["BertForSequenceClassification"]);
    std::fs::write(reranker.path().join("config.json"), config.to_string()).unwrap();
    for file in ["tokenizer.json", "model.safetensors"] {
        std::os::unix::fs::symlink(weights.join(file), reranker.path().join(file)).unwrap();
    }
    let err = match d.start_consumer_of(reranker.path(), &[]).await {
        Err(e) => format!("{e:#}"),
        Ok(_) => panic!("a consumer embedded with a cross-encoder"),
    };
    eprintln!("start-up refused: {err}");
    for words in [
        "config.json",
        "architectures = \"BertForSequenceClassification\"",
        "this is a cross-encoder",
    ] {
        assert!(err.contains(words), "{err:?} lacks {words:?}");
    }
    assert_eq!(d.jobs_in_stream().await, 1, "the job waits in the stream");

    let mut results = d.producer.subscribe_results().await.unwrap();
    let _consumer = d.start_consumer(&[]).await.unwrap();
    let got = wait_results(&mut results, 1, Duration::from_secs(60)).await;
    assert_eq!(got[0].job_id.as_deref(), Some("waits-for-a-model"));
    assert!(
        matches!(got[0].outcome, Outcome::Ok { .. }),
        "{:?}",
        got[0].outcome
    );
}

/// A model with prompts (e5's "query: " / "passage: ", default "query";
/// the f16 random-weight fixture): a job that names a prompt gets
/// sentence-transformers' vectors of that prompt, a job that names none the
/// default's, and a job naming a prompt the model lacks fails alone with
/// `invalid_parameters` naming the prompts it has, dead-lettered, not lost.
/// Started without `--max-tokens-per-item`, the consumer cuts items at the
/// model's own 128 tokens (`sentence_bert_config.json`), as
/// sentence-transformers does.
#[tokio::test]
async fn a_job_names_the_prompt_its_texts_are_embedded_with() {
    let d = Deployment::start().await.unwrap();
    let (dir, reference) = encoder_family("bert-mean-f16-prompts").unwrap();
    let consumer = d.start_consumer_of(&dir, &[]).await.unwrap();
    let mut results = d.producer.subscribe_results().await.unwrap();
    let texts: Vec<serde_json::Value> = reference.texts[..]
        .iter()
        .map(|t| t.clone().into())
        .collect();
    let job = |id: &str, prompt: Option<&str>| {
        let mut job = d.producer.embed_job(
            id,
            vec![Input::Inline {
                items: texts.clone(),
            }],
        );
        job.parameters.embed.prompt_name = prompt.map(str::to_string);
        job.parameters.embed.normalize = Some(false);
        job
    };
    for (id, prompt) in [
        ("default-prompt", None),
        ("passage-prompt", Some("passage")),
        ("query-prompt", Some("query")),
        ("no-such-prompt", Some("doc")),
    ] {
        d.producer.submit(&job(id, prompt)).await.unwrap();
    }
    let got = wait_results(&mut results, 4, Duration::from_secs(60)).await;
    let by_id: HashMap<_, _> = got
        .into_iter()
        .map(|r| (r.job_id.clone().unwrap_or_default(), r))
        .collect();
    for (id, expected) in [
        ("default-prompt", &reference.vectors),
        ("passage-prompt", &reference.prompt_vectors["passage"]),
        ("query-prompt", &reference.prompt_vectors["query"]),
    ] {
        let Outcome::Ok {
            output: Output::Inline { embeddings, .. },
        } = &by_id[id].outcome
        else {
            panic!("{id}: {:?}", by_id[id].outcome);
        };
        assert_eq!(embeddings.len(), texts.len());
        for (i, (v, e)) in embeddings.iter().zip(expected).enumerate() {
            let c = cosine(v, e);
            assert!(c >= 0.9999, "{id}, text {i}: cosine {c}");
        }
    }
    // The prompt's tokens are counted, as the model reads them.
    let with_default: usize = reference.ids.iter().map(Vec::len).sum();
    assert_eq!(by_id["default-prompt"].usage.tokens, with_default as u64);
    assert_eq!(by_id["query-prompt"].usage.tokens, with_default as u64);
    let Outcome::Error { error } = &by_id["no-such-prompt"].outcome else {
        panic!("{:?}", by_id["no-such-prompt"].outcome);
    };
    eprintln!("refused: {}", error.message);
    assert_eq!(error.code, sluice_schemas::ErrorCode::InvalidParameters);
    assert!(
        error.message.contains(
            "the model has no prompt named \"doc\" (its prompts: document, passage, query)"
        ),
        "{}",
        error.message
    );
    assert_eq!(
        d.producer
            .status("no-such-prompt")
            .await
            .unwrap()
            .unwrap()
            .state,
        JobState::Failed
    );
    assert_eq!(
        d.dead_letters().await,
        1,
        "the refused job is dead-lettered"
    );
    assert_eq!(d.jobs_in_stream_settled(0).await, 0);
    consumer.shutdown(Duration::from_secs(10)).await.unwrap();
}
