//! Scale-out: 1, 2 and 3 `sluice-consumer` processes on one durable consumer,
//! the same jobs each time, rounds interleaved. `bench/scaleout` runs it.
//! Prints throughput per consumer count, how the jobs were shared (from each
//! consumer's `/metrics`) and how many results came back twice (none may).
//!
//! Usage: bench-scaleout CORPUS.jsonl [JOBS] [TEXTS_PER_JOB] [ROUNDS]
//! Threads per consumer come from `RAYON_NUM_THREADS` (inherited).
#![allow(clippy::unwrap_used, clippy::expect_used)] // a harness: a panic is its report

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use sluice_schemas::Outcome;
use sluice_tests::deploy::Deployment;
use sluice_tests::prometheus_value;

const CONSUMERS: [usize; 3] = [1, 2, 3];

struct Run {
    secs: f64,
    tokens: u64,
    /// Jobs each consumer answered ok.
    shares: Vec<u64>,
    /// Results beyond one per job.
    duplicates: usize,
}

#[tokio::main]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let corpus = args
        .get(1)
        .context("usage: bench-scaleout CORPUS.jsonl [JOBS] [TEXTS_PER_JOB] [ROUNDS]")?;
    let jobs: usize = args.get(2).map_or(Ok(48), |s| s.parse())?;
    let per_job: usize = args.get(3).map_or(Ok(8), |s| s.parse())?;
    let rounds: usize = args.get(4).map_or(Ok(1), |s| s.parse())?;
    let lines = sluice_tests::corpus_lines(corpus, jobs * per_job)?;
    let bodies: Vec<String> = lines
        .chunks(per_job)
        .map(|chunk| chunk.join("\n") + "\n")
        .collect();

    let mut runs: HashMap<usize, Vec<Run>> = HashMap::new();
    for round in 1..=rounds {
        for n in CONSUMERS {
            let run = one_run(n, &bodies).await?;
            eprintln!(
                "round {round}: {n} consumer(s) {:.2} s, shares {:?}, duplicates {}",
                run.secs, run.shares, run.duplicates
            );
            runs.entry(n).or_default().push(run);
        }
    }

    let threads = std::env::var("RAYON_NUM_THREADS").unwrap_or_else(|_| "all".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!(
        "{jobs} jobs x {per_job} texts, {threads} thread(s) per consumer, {cores} cores, median of {rounds} interleaved round(s)"
    );
    println!(
        "| consumers | seconds | jobs/s | real tokens/s | vs 1 consumer | jobs per consumer | answered twice |"
    );
    println!("| ---: | ---: | ---: | ---: | ---: | --- | ---: |");
    let mut base = None;
    for n in CONSUMERS {
        let mut v = runs.remove(&n).unwrap_or_default();
        v.sort_by(|a, b| a.secs.total_cmp(&b.secs));
        let Some(run) = v.get(v.len() / 2) else {
            continue;
        };
        let rate = run.tokens as f64 / run.secs;
        let base = *base.get_or_insert(rate);
        let shares: Vec<String> = run.shares.iter().map(u64::to_string).collect();
        println!(
            "| {n} | {:.2} | {:.2} | {rate:.0} | {:.2}x | {} | {} |",
            run.secs,
            jobs as f64 / run.secs,
            rate / base,
            shares.join(" / "),
            run.duplicates
        );
    }
    Ok(())
}

/// Fresh servers, `n` warm consumer processes, then every job at once; timed
/// from the first publish to the last result.
async fn one_run(n: usize, bodies: &[String]) -> Result<Run> {
    let d = Deployment::start().await?;
    let mut consumers = Vec::new();
    for _ in 0..n {
        consumers.push(
            d.spawn_consumer(&["--max-batch-tokens=4096", "--memory-budget=2000000000"])
                .await?,
        );
    }
    let mut inputs = Vec::new();
    for (j, body) in bodies.iter().enumerate() {
        inputs.push(
            d.producer
                .upload_input(&format!("scale-{j}.jsonl"), body.clone().into_bytes())
                .await?,
        );
    }
    let mut results = d.producer.subscribe_results().await?;
    let start = Instant::now();
    let mut ids = Vec::new();
    for (j, input) in inputs.into_iter().enumerate() {
        let job = d.producer.embed_job(&format!("scale-{j}"), vec![input]);
        ids.push(job.id.clone());
        d.producer.submit(&job).await?;
    }
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut tokens = 0;
    while seen.len() < ids.len() {
        let r = tokio::time::timeout(Duration::from_secs(1800), results.next_result())
            .await
            .context("no result within 30 min")??;
        anyhow::ensure!(
            matches!(r.outcome, Outcome::Ok { .. }),
            "{:?} failed: {:?}",
            r.job_id,
            r.outcome
        );
        let count = seen
            .entry(r.job_id.clone().unwrap_or_default())
            .or_default();
        if *count == 0 {
            tokens += r.usage.tokens;
        }
        *count += 1;
    }
    let secs = start.elapsed().as_secs_f64();
    // Late duplicates would arrive within a moment of the last result.
    while let Ok(Ok(r)) =
        tokio::time::timeout(Duration::from_millis(500), results.next_result()).await
    {
        *seen
            .entry(r.job_id.clone().unwrap_or_default())
            .or_default() += 1;
    }
    let mut shares = Vec::new();
    for c in &consumers {
        let text = c.get("/metrics").await?;
        shares.push(prometheus_value(&text, "sluice_jobs_ok_total").unwrap_or(0.0) as u64);
    }
    for c in &mut consumers {
        c.terminate(Duration::from_secs(10));
    }
    let duplicates = seen.values().map(|c| c - 1).sum();
    Ok(Run {
        secs,
        tokens,
        shares,
        duplicates,
    })
}
