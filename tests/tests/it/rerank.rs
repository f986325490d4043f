//! The rerank task end to end: a consumer started with `--task rerank` on a
//! random-weight cross-encoder (`tests/fixtures/rerankers/`), real
//! nats-server and SeaweedFS, jobs of (query, document) pairs scored as
//! sentence-transformers' `CrossEncoder.predict` scores them, and every
//! bad job answered with its error and dead-lettered, none lost.

use std::collections::HashMap;
use std::time::Duration;

use serde_json::{Value, json};
use sluice_schemas::{
    ErrorCode, Input, Job, Outcome, Output, OutputOptions, Parameters, VERSION, npy,
};
use sluice_tests::deploy::Deployment;
use sluice_tests::fixtures::{ranking, reranker_family, schema_example};
use sluice_tests::results::wait_results;

/// How far a score may be from sentence-transformers' (the bound).
const SCORE_BOUND: f32 = 1e-4;

fn rerank_job(id: &str, items: Vec<Value>) -> Job {
    Job {
        version: VERSION,
        id: id.into(),
        task: "rerank".into(),
        model: "reranker".into(),
        inputs: vec![Input::Inline { items }],
        parameters: Parameters::default(),
        token_estimate: None,
        deadline: None,
        submitted_at: None,
        output: OutputOptions::default(),
    }
}

fn pair_items(pairs: &[(String, String)]) -> Vec<Value> {
    pairs
        .iter()
        .map(|(q, d)| json!({"query": q, "document": d}))
        .collect()
}

/// The largest difference between `got` and `want`, item by item.
fn worst(got: &[f32], want: &[f32]) -> f32 {
    assert_eq!(got.len(), want.len());
    got.iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max)
}

/// BERT's cross-encoder (token types, sigmoid): a job's pairs get
/// sentence-transformers' scores within 1e-4 and its ranking, inline or as
/// a `.npy` of shape `[pairs]` in S3, with the pair tokens (the model's own
/// 128-token limit, cut longest text first) counted; a job that refuses
/// truncation, a job of texts instead of pairs and a job with an embed
/// parameter each fail alone with their code, dead-lettered; the same
/// pairs through `sluice submit --task rerank --wait` print their scores.
#[tokio::test]
async fn rerank_jobs_score_pairs_as_sentence_transformers_and_bad_ones_fail_alone() {
    let d = Deployment::start().await.unwrap();
    let (dir, reference) = reranker_family("bert-reranker").unwrap();
    let consumer = d.start_consumer_of(&dir, &["--task=rerank"]).await.unwrap();
    let mut results = d.producer.subscribe_results().await.unwrap();
    let items = pair_items(&reference.pairs);

    let mut to_s3 = rerank_job("scores-s3", items.clone());
    to_s3.output.always_s3 = Some(true);
    let mut uncut = rerank_job("uncut", items.clone());
    uncut.parameters.encoder.truncate = Some(false);
    let mut normalized = rerank_job("normalized", items.clone());
    normalized.parameters.embed.normalize = Some(true);
    let jobs = [
        rerank_job("scores", items.clone()),
        to_s3,
        uncut,
        rerank_job("texts", vec![json!("a text, not a pair")]),
        normalized,
    ];
    for job in &jobs {
        d.producer.submit(job).await.unwrap();
    }
    let got = wait_results(&mut results, jobs.len(), Duration::from_secs(60)).await;
    let by_id: HashMap<_, _> = got
        .into_iter()
        .map(|r| (r.job_id.clone().unwrap_or_default(), r))
        .collect();

    let r = &by_id["scores"];
    let Outcome::Ok {
        output: Output::Inline { scores, .. },
    } = &r.outcome
    else {
        panic!("scores: {:?}", r.outcome);
    };
    let scores = scores.as_slice();
    let diff = worst(scores, &reference.scores);
    eprintln!(
        "bert-reranker through the queue ({}): largest difference {diff:.2e} to CrossEncoder.predict over {} pairs",
        r.served_by.as_ref().map_or("?", |s| s.forward.as_str()),
        scores.len()
    );
    assert!(diff <= SCORE_BOUND, "{diff}");
    assert_eq!(ranking(scores), ranking(&reference.scores));
    let tokens: usize = reference.ids.iter().map(Vec::len).sum();
    assert_eq!(r.usage.items, reference.pairs.len() as u64);
    assert_eq!(r.usage.tokens, tokens as u64);
    assert!(
        r.usage.truncated_items >= 1,
        "the pairs exercise truncation: {:?}",
        r.usage
    );
    assert_eq!(
        r.served_by.as_ref().map(|s| s.model.as_str()),
        Some("reranker")
    );

    let Outcome::Ok {
        output: Output::S3(o),
    } = &by_id["scores-s3"].outcome
    else {
        panic!("scores-s3: {:?}", by_id["scores-s3"].outcome);
    };
    assert_eq!(
        (o.format.as_str(), o.shape.as_slice()),
        ("npy", &[reference.pairs.len() as u64][..])
    );
    let bytes = d.read_object(&o.key).await.unwrap();
    let (rows, dim, values) = npy::decode_f32(&bytes).unwrap();
    assert_eq!((rows, dim), (reference.pairs.len(), 1));
    assert_eq!(&values, scores, "the S3 scores are the inline ones");

    for (id, code, words) in [
        (
            "uncut",
            ErrorCode::ItemTooLong,
            "more than 128 tokens and the job set truncate=false",
        ),
        (
            "texts",
            ErrorCode::InputInvalid,
            "a rerank item must be an object {\"query\": \"...\", \"document\": \"...\"}, found a string",
        ),
        (
            "normalized",
            ErrorCode::InvalidParameters,
            "parameter `normalize` applies to the embed task only, not to rerank",
        ),
    ] {
        d.assert_failed(id, &by_id[id], code, words).await;
    }
    assert_eq!(d.dead_letters().await, 3, "each bad job is dead-lettered");
    assert_eq!(d.jobs_in_stream_settled(0).await, 0);

    // The CLI: one job of pairs from a JSONL file, waited for.
    let file = tempfile::NamedTempFile::new().unwrap();
    let jsonl: String = items.iter().map(|i| format!("{i}\n")).collect();
    std::fs::write(file.path(), jsonl).unwrap();
    let path = file.path().to_str().unwrap();
    let run = d
        .cli(
            &["submit", "--task", "rerank", "--wait", path],
            None,
            Duration::from_secs(60),
        )
        .await;
    eprintln!("{}", run.stdout);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(
        run.stdout
            .contains(&format!("ok, {} pairs, {tokens} tokens", items.len())),
        "{}",
        run.stdout
    );
    let printed: Vec<f32> = run
        .stdout
        .lines()
        .filter_map(|l| l.trim().strip_prefix('['))
        .filter_map(|l| l.split_once("] "))
        .map(|(_, score)| score.parse().unwrap())
        .collect();
    assert_eq!(&printed, scores, "the CLI prints each pair's score");
    // A JSONL of texts is refused before anything is published.
    std::fs::write(file.path(), "\"a text\"\n").unwrap();
    let run = d
        .cli(
            &["submit", "--task", "rerank", path],
            None,
            Duration::from_secs(60),
        )
        .await;
    assert_ne!(run.code, Some(0));
    assert!(
        run.stderr
            .contains("line 1: a rerank item must be an object"),
        "{}",
        run.stderr
    );
    consumer.shutdown(Duration::from_secs(10)).await.unwrap();
}

/// An embedding model's directory is refused by `--task rerank` at
/// start-up, naming the file, the field and what a reranker needs; the
/// rerank task with no `--model-dir` names the flag.
#[tokio::test]
async fn the_rerank_task_refuses_what_is_not_a_cross_encoder() {
    let d = Deployment::start().await.unwrap();
    let err = match d
        .start_consumer_of(
            &sluice_tests::repo_root().join("weights/all-minilm-l6-v2"),
            &["--task=rerank"],
        )
        .await
    {
        Err(e) => format!("{e:#}"),
        Ok(_) => panic!("a consumer reranked with an embedding model"),
    };
    eprintln!("start-up refused: {err}");
    for words in ["config.json", "architectures", "a cross-encoder's head"] {
        assert!(err.contains(words), "{err:?} lacks {words:?}");
    }
    let mut config = d.consumer_config(&["--task=rerank"]);
    config.model.model_dir = None;
    let err = match sluice_consumer::start(config).await {
        Err(e) => format!("{e:#}"),
        Ok(_) => panic!("a rerank consumer started with no model"),
    };
    eprintln!("start-up refused: {err}");
    assert!(
        err.contains("the rerank task needs --model-dir, a cross-encoder's directory"),
        "{err}"
    );
}

/// The schemas' rerank example is what a rerank consumer answers: the
/// `rerank-1` job of job.schema.json, run on the random-weight BERT
/// reranker served as `reranker`, gives the `rerank-1` result of
/// result.schema.json (its scores within 1e-4, its usage exactly; the
/// timings are from the run that made it).
#[tokio::test]
async fn the_schemas_rerank_example_is_what_the_model_answers() {
    let job = schema_example(sluice_schemas::json_schema::JOB, "id", "rerank-1");
    let d = Deployment::start().await.unwrap();
    let (dir, _) = reranker_family("bert-reranker").unwrap();
    let consumer = d.start_consumer_of(&dir, &["--task=rerank"]).await.unwrap();
    let mut results = d.producer.subscribe_results().await.unwrap();
    let job: Job = serde_json::from_value(job).unwrap();
    d.producer.submit(&job).await.unwrap();
    let got = wait_results(&mut results, 1, Duration::from_secs(60)).await;
    let got = serde_json::to_value(&got[0]).unwrap();
    eprintln!("this run's result: {got}");
    let expected = schema_example(sluice_schemas::json_schema::RESULT, "job_id", "rerank-1");
    let hint = "if the model or its kernels changed on purpose, put this run's result in result.schema.json";
    let scores = |v: &Value| -> Vec<f32> {
        serde_json::from_value(v["output"]["scores"].clone()).unwrap_or_default()
    };
    let (got_scores, want) = (scores(&got), scores(&expected));
    assert!(!want.is_empty(), "the example has scores");
    assert!(worst(&got_scores, &want) <= SCORE_BOUND, "{hint}:\n{got}");
    assert_eq!(got["usage"], expected["usage"], "{hint}:\n{got}");
    assert_eq!(got["served_by"]["model"], "reranker");
    consumer.shutdown(Duration::from_secs(10)).await.unwrap();
}
