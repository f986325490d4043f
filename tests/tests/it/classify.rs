//! The classify task end to end: a consumer started with `--task classify`
//! on a random-weight sequence classifier (`tests/fixtures/classifiers/`),
//! real nats-server and SeaweedFS, jobs of texts answered with the labels
//! transformers' `text-classification` pipeline gives, and every bad job
//! answered with its error and dead-lettered, none lost.

use std::collections::HashMap;
use std::time::Duration;

use serde_json::{Value, json};
use sluice_schemas::{
    ErrorCode, Input, Job, LabelScore, Outcome, Output, OutputOptions, Parameters, VERSION,
};
use sluice_tests::deploy::Deployment;
use sluice_tests::fixtures::{ClassifierFamily, classifier_family};
use sluice_tests::results::wait_results;

/// How far a score may be from the pipeline's (the bound).
const SCORE_BOUND: f32 = 1e-4;

fn classify_job(id: &str, items: Vec<Value>) -> Job {
    Job {
        version: VERSION,
        id: id.into(),
        task: "classify".into(),
        model: "classifier".into(),
        inputs: vec![Input::Inline { items }],
        parameters: Parameters::default(),
        token_estimate: None,
        deadline: None,
        submitted_at: None,
        output: OutputOptions::default(),
    }
}

/// Each text's labels against the pipeline's: the same labels in the same
/// order (the first `top_k` of them), scores within the bound; the ids name
/// the labels. Returns the largest difference.
fn held_to_pipeline(got: &[Vec<LabelScore>], reference: &ClassifierFamily, top_k: usize) -> f32 {
    assert_eq!(got.len(), reference.answers.len());
    let mut worst = 0f32;
    for (i, (labels, want)) in got.iter().zip(&reference.answers).enumerate() {
        assert_eq!(labels.len(), top_k.min(want.len()), "text {i}: {labels:?}");
        for (rank, (l, w)) in labels.iter().zip(want).enumerate() {
            assert_eq!(l.label, w.label, "text {i}, rank {rank}: {labels:?}");
            assert_eq!(
                reference.labels[l.id as usize], l.label,
                "text {i}: the id names the label"
            );
            worst = worst.max((l.score - w.score).abs());
        }
    }
    assert!(worst <= SCORE_BOUND, "{worst}");
    worst
}

fn inline_labels(outcome: &Outcome, id: &str) -> Vec<Vec<LabelScore>> {
    match outcome {
        Outcome::Ok {
            output: Output::Inline {
                classifications, ..
            },
        } => classifications.clone(),
        other => panic!("{id}: {other:?}"),
    }
}

/// BERT's classifier (three labels, softmax): a job's texts get the
/// pipeline's labels, best first, within 1e-4, inline or as JSONL in S3,
/// with their tokens counted; `top_k` keeps the best, `raw_scores` gives
/// the logits; a job that refuses truncation, a job of pairs and a job
/// with an embed parameter each fail alone with their code,
/// dead-lettered; `sluice submit --task classify --top-k 1 --wait` prints
/// each text's best label.
#[tokio::test]
async fn classify_jobs_label_texts_as_the_transformers_pipeline_and_bad_ones_fail_alone() {
    let d = Deployment::start().await.unwrap();
    let (dir, reference) = classifier_family("bert-classifier").unwrap();
    let consumer = d
        .start_consumer_of(&dir, &["--task=classify"])
        .await
        .unwrap();
    let mut results = d.producer.subscribe_results().await.unwrap();
    let items: Vec<Value> = reference.texts.iter().map(|t| json!(t)).collect();

    let mut to_s3 = classify_job("labels-s3", items.clone());
    to_s3.output.always_s3 = Some(true);
    let mut best = classify_job("best", items.clone());
    best.parameters.classify.top_k = Some(1);
    let mut raw = classify_job("raw", items.clone());
    raw.parameters.classify.raw_scores = Some(true);
    let mut uncut = classify_job("uncut", items.clone());
    uncut.parameters.encoder.truncate = Some(false);
    let mut prompted = classify_job("prompted", items.clone());
    prompted.parameters.embed.prompt_name = Some("query".into());
    let jobs = [
        classify_job("labels", items.clone()),
        to_s3,
        best,
        raw,
        uncut,
        classify_job("pairs", vec![json!({"query": "q", "document": "d"})]),
        prompted,
    ];
    for job in &jobs {
        d.producer.submit(job).await.unwrap();
    }
    let got = wait_results(&mut results, jobs.len(), Duration::from_secs(60)).await;
    let by_id: HashMap<_, _> = got
        .into_iter()
        .map(|r| (r.job_id.clone().unwrap_or_default(), r))
        .collect();

    let r = &by_id["labels"];
    let labels = inline_labels(&r.outcome, "labels");
    let worst = held_to_pipeline(&labels, &reference, usize::MAX);
    eprintln!(
        "bert-classifier through the queue ({}): largest difference {worst:.2e} to the pipeline over {} texts",
        r.served_by.as_ref().map_or("?", |s| s.forward.as_str()),
        labels.len()
    );
    let tokens: usize = reference.ids.iter().map(Vec::len).sum();
    assert_eq!(r.usage.items, reference.texts.len() as u64);
    assert_eq!(r.usage.tokens, tokens as u64);
    assert!(
        r.usage.truncated_items >= 1,
        "the texts exercise truncation: {:?}",
        r.usage
    );

    let Outcome::Ok {
        output: Output::S3(o),
    } = &by_id["labels-s3"].outcome
    else {
        panic!("labels-s3: {:?}", by_id["labels-s3"].outcome);
    };
    assert_eq!(o.format, "jsonl");
    let bytes = d.read_object(&o.key).await.unwrap();
    let from_s3: Vec<Vec<LabelScore>> = bytes
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_slice(l).unwrap())
        .collect();
    assert_eq!(from_s3, labels, "the S3 labels are the inline ones");

    held_to_pipeline(
        &inline_labels(&by_id["best"].outcome, "best"),
        &reference,
        1,
    );

    let raw = inline_labels(&by_id["raw"].outcome, "raw");
    for (i, labels) in raw.iter().enumerate() {
        for l in labels {
            let want = reference.logits[i][l.id as usize];
            assert!(
                (l.score - want).abs() <= SCORE_BOUND,
                "text {i}: {l:?} vs logit {want}"
            );
        }
    }

    for (id, code, words) in [
        (
            "uncut",
            ErrorCode::ItemTooLong,
            "more than 128 tokens and the job set truncate=false",
        ),
        (
            "pairs",
            ErrorCode::InputInvalid,
            "a classify item must be a JSON string or {\"text\": \"...\"}",
        ),
        (
            "prompted",
            ErrorCode::InvalidParameters,
            "parameter `prompt_name` applies to the embed task only, not to classify",
        ),
    ] {
        d.assert_failed(id, &by_id[id], code, words).await;
    }
    assert_eq!(d.dead_letters().await, 3, "each bad job is dead-lettered");
    assert_eq!(d.jobs_in_stream_settled(0).await, 0);

    // The CLI: one job of texts from a JSONL file, waited for.
    let file = tempfile::NamedTempFile::new().unwrap();
    let jsonl: String = items.iter().map(|i| format!("{i}\n")).collect();
    std::fs::write(file.path(), jsonl).unwrap();
    let path = file.path().to_str().unwrap();
    let run = d
        .cli(
            &[
                "submit", "--task", "classify", "--top-k", "1", "--wait", path,
            ],
            None,
            Duration::from_secs(60),
        )
        .await;
    eprintln!("{}", run.stdout);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(
        run.stdout
            .contains(&format!("ok, {} texts, {tokens} tokens", items.len())),
        "{}",
        run.stdout
    );
    let printed: Vec<&str> = run
        .stdout
        .lines()
        .filter_map(|l| l.trim().strip_prefix('['))
        .filter_map(|l| l.split_once("] "))
        .filter_map(|(_, labels)| labels.split_once(' ').map(|(label, _)| label))
        .collect();
    let best: Vec<&str> = reference
        .answers
        .iter()
        .map(|a| a[0].label.as_str())
        .collect();
    assert_eq!(printed, best, "the CLI prints each text's best label");
    // --top-k is classify's alone.
    let run = d
        .cli(
            &["submit", "--top-k", "1", path],
            None,
            Duration::from_secs(60),
        )
        .await;
    assert_ne!(run.code, Some(0));
    assert!(
        run.stderr.contains("--top-k applies to --task classify"),
        "{}",
        run.stderr
    );
    consumer.shutdown(Duration::from_secs(10)).await.unwrap();
}

/// An embedding model's directory is refused by `--task classify` at
/// start-up, naming the file, the field and what a classifier needs; the
/// classify task with no `--model-dir` names the flag.
#[tokio::test]
async fn the_classify_task_refuses_what_is_not_a_sequence_classifier() {
    let d = Deployment::start().await.unwrap();
    let err = match d
        .start_consumer_of(
            &sluice_tests::repo_root().join("weights/all-minilm-l6-v2"),
            &["--task=classify"],
        )
        .await
    {
        Err(e) => format!("{e:#}"),
        Ok(_) => panic!("a consumer classified with an embedding model"),
    };
    eprintln!("start-up refused: {err}");
    for words in [
        "config.json",
        "architectures",
        "a sequence classifier's head",
    ] {
        assert!(err.contains(words), "{err:?} lacks {words:?}");
    }
    let mut config = d.consumer_config(&["--task=classify"]);
    config.model.model_dir = None;
    let err = match sluice_consumer::start(config).await {
        Err(e) => format!("{e:#}"),
        Ok(_) => panic!("a classify consumer started with no model"),
    };
    eprintln!("start-up refused: {err}");
    assert!(
        err.contains("the classify task needs --model-dir, a sequence classifier's directory"),
        "{err}"
    );
}
