//! End-to-end throughput through NATS + S3 against the model alone, on the
//! same texts, interleaved: `bench/e2e` runs it. Prints a table.
//!
//! Usage: bench-e2e CORPUS.jsonl [JOBS] [TEXTS_PER_JOB] [ROUNDS]
#![allow(clippy::unwrap_used, clippy::expect_used)] // a harness: a panic is its report

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use sluice_consumer::offline::{EmbedArgs, embed_file};
use sluice_schemas::Outcome;
use sluice_tests::deploy::Deployment;
use sluice_tests::models_dir;

#[tokio::main]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let corpus = args
        .get(1)
        .context("usage: bench-e2e CORPUS.jsonl [JOBS] [TEXTS_PER_JOB] [ROUNDS]")?;
    let jobs: usize = args.get(2).map_or(Ok(10), |s| s.parse())?;
    let per_job: usize = args.get(3).map_or(Ok(64), |s| s.parse())?;
    let rounds: usize = args.get(4).map_or(Ok(2), |s| s.parse())?;
    let max_batch_tokens = 8192;

    let lines = sluice_tests::corpus_lines(corpus, jobs * per_job)?;
    let subset = std::env::temp_dir().join(format!("sluice-e2e-{}.jsonl", std::process::id()));
    std::fs::write(&subset, lines.join("\n") + "\n")?;
    let model_args = EmbedArgs {
        input: subset.clone(),
        output: std::env::temp_dir().join(format!("sluice-e2e-{}.npy", std::process::id())),
        prompt_name: None,
        model: sluice_consumer::ModelConfig {
            model_dir: Some(models_dir().join("all-minilm-l6-v2")),
            model_name: Some("all-minilm-l6-v2".into()),
            device: sluice_consumer::config::DeviceKind::Cpu,
            cuda_ordinal: 0,
            max_tokens_per_item: None,
            max_batch_tokens,
            embed_weights: Default::default(),
            normalize: sluice_consumer::config::NormalizeRule::Always,
        },
    };

    let mut e2e = Vec::new();
    let mut alone = Vec::new();
    let mut tokens = 0;
    for round in 1..=rounds {
        // End to end: servers up, consumer warm, then all jobs at once.
        let d = Deployment::start().await?;
        let consumer = d
            .start_consumer(&[
                &format!("--max-batch-tokens={max_batch_tokens}"),
                "--memory-budget=4000000000",
            ])
            .await?;
        let mut inputs = Vec::new();
        for j in 0..jobs {
            let body = lines[j * per_job..(j + 1) * per_job].join("\n") + "\n";
            inputs.push(
                d.producer
                    .upload_input(&format!("e2e-{j}.jsonl"), body.into_bytes())
                    .await?,
            );
        }
        let mut results = d.producer.subscribe_results().await?;
        let start = Instant::now();
        for (j, input) in inputs.into_iter().enumerate() {
            d.producer
                .submit(&d.producer.embed_job(&format!("e2e-{j}"), vec![input]))
                .await?;
        }
        let mut got_tokens = 0;
        for _ in 0..jobs {
            let r =
                tokio::time::timeout(Duration::from_secs(1800), results.next_result()).await??;
            anyhow::ensure!(
                matches!(r.outcome, Outcome::Ok { .. }),
                "{:?} failed: {:?}",
                r.job_id,
                r.outcome
            );
            got_tokens += r.usage.tokens;
        }
        let secs = start.elapsed().as_secs_f64();
        consumer.shutdown(Duration::from_secs(10)).await?;
        drop(d);
        tokens = got_tokens;
        e2e.push(secs);
        eprintln!("round {round}: end to end {secs:.2} s");

        // The model alone on the same texts (tokenize + batches, as the service does).
        let args = model_args.clone();
        let report = tokio::task::spawn_blocking(move || embed_file(&args)).await??;
        let secs = report.tokenize_secs + report.model_secs;
        alone.push(secs);
        eprintln!("round {round}: model alone {secs:.2} s");
    }
    let _ = std::fs::remove_file(&subset);
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (e, a) = (median(&mut e2e), median(&mut alone));
    println!(
        "{jobs} jobs x {per_job} texts, {tokens} real tokens, batches <= {max_batch_tokens} padded tokens, median of {rounds} interleaved rounds"
    );
    println!("| path | seconds | jobs/s | real tokens/s | vs model alone |");
    println!("| --- | ---: | ---: | ---: | ---: |");
    println!(
        "| model alone (sluice-consumer embed) | {a:.2} | - | {:.0} | 1.00x |",
        tokens as f64 / a
    );
    println!(
        "| end to end (NATS + presigned S3 inputs + S3 outputs) | {e:.2} | {:.2} | {:.0} | {:.2}x |",
        jobs as f64 / e,
        tokens as f64 / e,
        a / e
    );
    Ok(())
}
