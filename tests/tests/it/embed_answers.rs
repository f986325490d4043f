//! An encoder answers what its reference answers, the same at every start
//! (issue #52): vectors normalized where the model's sentence-transformers
//! modules say so and only there (unless a job asks), and the same bytes
//! from two starts of one consumer, one of them beside a busy CPU.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use sluice_schemas::{Input, JobResult, Outcome, Output, ServedBy};
use sluice_tests::deploy::Deployment;
use sluice_tests::fixtures::encoder_family;
use sluice_tests::results::wait_results;

fn norm(v: &[f32]) -> f64 {
    v.iter()
        .map(|&x| f64::from(x) * f64::from(x))
        .sum::<f64>()
        .sqrt()
}

/// Each job's vectors (inline, or the `.npy` object in S3), by job id.
async fn vectors_by_id(
    d: &Deployment,
    results: Vec<JobResult>,
) -> HashMap<String, (Vec<Vec<f32>>, ServedBy)> {
    let mut by_id = HashMap::new();
    for r in results {
        let vectors = match r.outcome {
            Outcome::Ok {
                output: Output::Inline { embeddings, .. },
            } => embeddings,
            Outcome::Ok {
                output: Output::S3(o),
            } => {
                let bytes = d.read_object(&o.key).await.unwrap();
                let (_, dim, values) = sluice_schemas::npy::decode_f32(&bytes).unwrap();
                values.chunks(dim).map(<[f32]>::to_vec).collect()
            }
            other => panic!("{:?}: {other:?}", r.job_id),
        };
        let served_by = r.served_by.expect("served_by");
        by_id.insert(r.job_id.unwrap_or_default(), (vectors, served_by));
    }
    by_id
}

/// Submits one job of `texts` inline per (id, normalize) and returns
/// their vectors.
async fn embed(
    d: &Deployment,
    texts: &[String],
    jobs: &[(&str, Option<bool>)],
) -> HashMap<String, (Vec<Vec<f32>>, ServedBy)> {
    let mut results = d.producer.subscribe_results().await.unwrap();
    for (id, normalize) in jobs {
        let mut job = d.producer.embed_job(
            id,
            vec![Input::Inline {
                items: texts.iter().map(|t| t.clone().into()).collect(),
            }],
        );
        job.parameters.embed.normalize = *normalize;
        d.producer.submit(&job).await.unwrap();
    }
    let results = wait_results(&mut results, jobs.len(), Duration::from_secs(120)).await;
    vectors_by_id(d, results).await
}

/// A random-weight BERT saved by sentence-transformers without a
/// `Normalize` module answers its raw vectors, norms as
/// `SentenceTransformer.encode` gives them (within 1e-5 relative, on the
/// f32 layers: bf16's rounding moves a norm by ~1e-3); all-MiniLM-L6-v2,
/// whose modules end in `Normalize`, answers unit vectors. A job's
/// `normalize` decides over either.
#[tokio::test]
async fn vectors_are_normalized_where_the_models_modules_say_so() {
    let d = Deployment::start().await.unwrap();
    let (dir, reference) = encoder_family("bert-mean-f16-prompts").unwrap();
    let texts = &reference.texts;

    let raw_model = d
        .start_consumer_of(&dir, &["--embed-weights=f32"])
        .await
        .unwrap();
    let got = embed(
        &d,
        texts,
        &[("raw-default", None), ("raw-asked-unit", Some(true))],
    )
    .await;
    raw_model.shutdown(Duration::from_secs(10)).await.unwrap();
    let mut worst = 0f64;
    for (i, (v, e)) in got["raw-default"]
        .0
        .iter()
        .zip(&reference.vectors)
        .enumerate()
    {
        let (got, want) = (norm(v), norm(e));
        let relative = (got - want).abs() / want;
        worst = worst.max(relative);
        assert!(
            relative <= 1e-5,
            "text {i}: norm {got} against sentence-transformers' {want}"
        );
        assert!((want - 1.0).abs() > 1e-2, "the fixture's norms are not 1");
    }
    eprintln!(
        "no Normalize module: norms within {worst:e} (relative) of sentence-transformers' over {} texts",
        texts.len()
    );
    for v in &got["raw-asked-unit"].0 {
        assert!((norm(v) - 1.0).abs() < 1e-5, "asked for unit vectors");
    }

    let minilm = d.start_consumer(&[]).await.unwrap();
    let got = embed(
        &d,
        texts,
        &[("unit-default", None), ("unit-asked-raw", Some(false))],
    )
    .await;
    minilm.shutdown(Duration::from_secs(10)).await.unwrap();
    for v in &got["unit-default"].0 {
        assert!(
            (norm(v) - 1.0).abs() < 1e-5,
            "all-MiniLM-L6-v2's modules end in Normalize: {}",
            norm(v)
        );
    }
    assert!(
        got["unit-asked-raw"]
            .0
            .iter()
            .any(|v| (norm(v) - 1.0).abs() > 1e-3),
        "normalize: false gives the pooled vectors"
    );
}

/// Two starts of the same consumer process on the same texts, the second
/// beside a busy loop on every core, answer byte-identical vectors and the
/// same `served_by`: nothing about the forward is chosen by a timing.
#[tokio::test]
async fn two_starts_one_under_load_answer_the_same_bytes() {
    let d = Deployment::start().await.unwrap();
    let (_, reference) = encoder_family("bert-mean-f16-prompts").unwrap();
    let texts = &reference.texts;
    let mut runs = Vec::new();
    for loaded in [false, true] {
        let busy = Arc::new(AtomicBool::new(loaded));
        let spinners: Vec<_> = (0..std::thread::available_parallelism().map_or(2, |n| n.get()))
            .map(|_| {
                let busy = Arc::clone(&busy);
                std::thread::spawn(move || {
                    let mut x = 0u64;
                    while busy.load(Ordering::Relaxed) {
                        x = std::hint::black_box(
                            x.wrapping_mul(6364136223846793005).wrapping_add(1),
                        );
                    }
                })
            })
            .collect();
        let mut consumer = d.spawn_consumer(&[]).await.unwrap();
        let id = format!("start-{}", runs.len());
        let got = embed(&d, texts, &[(&id, None)]).await;
        busy.store(false, Ordering::Relaxed);
        for s in spinners {
            s.join().unwrap();
        }
        consumer.terminate(Duration::from_secs(10));
        runs.push(got[&id].clone());
    }
    let ((first, served_first), (second, served_second)) = (&runs[0], &runs[1]);
    assert_eq!(
        served_first, served_second,
        "served_by differs between starts"
    );
    let bits = |vs: &[Vec<f32>]| -> Vec<u32> { vs.iter().flatten().map(|x| x.to_bits()).collect() };
    assert!(
        bits(first) == bits(second),
        "the two starts answered different vectors"
    );
    eprintln!(
        "two starts (the second under load) answered the same {} vectors, served by {served_first:?}",
        first.len()
    );
}
