//! Floods and fleets: the budget holds under 20,000 queued jobs, and several
//! consumer processes share one durable consumer without doing a job twice.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use sluice_schemas::{Input, Outcome};
use sluice_tests::deploy::Deployment;

use sluice_tests::results::wait_results;

/// Publishes `n` one-text inline jobs with ids `<prefix>-<i>`, many at a time.
async fn publish_jobs(d: &Deployment, prefix: &str, n: usize) {
    let p = &d.producer;
    let submitted = futures::stream::iter(0..n)
        .map(|i| async move {
            // Short texts: this test is about memory and delivery, not model speed.
            let text = format!("flood {i}{}", " lorem".repeat(i % 3));
            let job = p.embed_job(
                &format!("{prefix}-{i}"),
                vec![Input::Inline {
                    items: vec![text.into()],
                }],
            );
            p.submit(&job).await.map(|ack| ack.duplicate)
        })
        .buffer_unordered(256)
        .collect::<Vec<_>>()
        .await;
    for s in submitted {
        assert!(!s.unwrap(), "no id is a duplicate");
    }
}

fn metric(text: &str, name: &str) -> u64 {
    sluice_tests::prometheus_value(text, name).map_or(0, |v| v as u64)
}

fn exactly_once(results: &[sluice_schemas::JobResult], prefix: &str, n: usize) {
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for r in results {
        assert!(
            matches!(r.outcome, Outcome::Ok { .. }),
            "{:?}: {:?}",
            r.job_id,
            r.outcome
        );
        *counts
            .entry(r.job_id.as_deref().unwrap_or_default())
            .or_default() += 1;
    }
    for i in 0..n {
        let id = format!("{prefix}-{i}");
        assert_eq!(
            counts.get(id.as_str()),
            Some(&1),
            "job {id} completed {:?} times",
            counts.get(id.as_str())
        );
    }
}

async fn assert_drained(d: &Deployment) {
    assert_eq!(
        d.jobs_in_stream_settled(0).await,
        0,
        "jobs left in the stream"
    );
    let stream = d
        .producer
        .js
        .get_stream(&d.topology.job_stream)
        .await
        .unwrap();
    let info = stream.consumer_info(&d.topology.consumer).await.unwrap();
    assert_eq!(info.num_ack_pending, 0, "unacked jobs left");
    assert_eq!(info.num_pending, 0, "undelivered jobs left");
}

#[tokio::test]
async fn flood_of_20000_jobs_stays_in_budget_and_completes_each_once() {
    // SLUICE_FLOOD_JOBS shrinks the flood for a quick local run.
    let n: usize = std::env::var("SLUICE_FLOOD_JOBS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000);
    const BUDGET: u64 = 600 << 20;
    let d = Deployment::start().await.unwrap();
    let t0 = Instant::now();
    publish_jobs(&d, "flood", n).await;
    eprintln!("published {n} jobs in {:.1} s", t0.elapsed().as_secs_f64());
    let mut results = d.producer.subscribe_results().await.unwrap();

    let mut consumer = d
        .spawn_consumer(&[
            &format!("--memory-budget={BUDGET}"),
            "--max-input-bytes=65536",
            "--max-items-per-job=64",
        ])
        .await
        .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = consumer.sample_memory(Arc::clone(&stop));
    let t1 = Instant::now();
    let got = wait_results(&mut results, n, Duration::from_secs(900)).await;
    let secs = t1.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let seen = sampler.await.unwrap();
    let (max_reserved, job_budget, max_rss, samples) =
        (seen.max_reserved, seen.budget, seen.max_rss, seen.samples);
    exactly_once(&got, "flood", n);
    assert_drained(&d).await;

    let model_bytes =
        std::fs::metadata(sluice_tests::models_dir().join("all-minilm-l6-v2/model.safetensors"))
            .unwrap()
            .len();
    const ALLOWANCE: u64 = 256 << 20;
    eprintln!(
        "flood: {n} jobs in {secs:.1} s ({:.0} jobs/s); {samples} samples; reserved peak {} MiB of {} MiB job budget; \
         RSS peak {} MiB (limit: budget {} + model {} + allowance {} MiB)",
        n as f64 / secs,
        max_reserved >> 20,
        job_budget >> 20,
        max_rss >> 20,
        BUDGET >> 20,
        model_bytes >> 20,
        ALLOWANCE >> 20
    );
    assert!(samples > 10, "too few memory samples");
    assert!(max_reserved > 0, "the budget was never used");
    assert!(
        max_rss <= BUDGET + model_bytes + ALLOWANCE,
        "RSS {} MiB exceeds budget + model + allowance",
        max_rss >> 20
    );
    let metrics = consumer.get("/metrics").await.unwrap();
    assert!(metric(&metrics, "sluice_budget_reserved_peak_bytes") <= job_budget);
    assert_eq!(metric(&metrics, "sluice_jobs_ok_total"), n as u64);
    eprintln!(
        "flood: {} batches, {} items, {} real / {} padded tokens",
        metric(&metrics, "sluice_batches_total"),
        metric(&metrics, "sluice_batch_items_total"),
        metric(&metrics, "sluice_batch_real_tokens_total"),
        metric(&metrics, "sluice_batch_padded_tokens_total")
    );
    let status = consumer.terminate(Duration::from_secs(30));
    assert!(
        status.is_some_and(|s| s.success()),
        "consumer did not exit cleanly: {status:?}\n{}",
        consumer.log_tail()
    );
}

#[tokio::test]
async fn three_consumer_processes_share_one_durable_consumer() {
    const N: usize = 1_000;
    let d = Deployment::start().await.unwrap();
    let mut results = d.producer.subscribe_results().await.unwrap();
    let args = ["--memory-budget=800000000", "--pull-max-messages=16"];
    let (a, b, c) = tokio::join!(
        d.spawn_consumer(&args),
        d.spawn_consumer(&args),
        d.spawn_consumer(&args)
    );
    let mut fleet = [a.unwrap(), b.unwrap(), c.unwrap()];
    publish_jobs(&d, "fleet", N).await;
    let got = wait_results(&mut results, N, Duration::from_secs(600)).await;
    exactly_once(&got, "fleet", N);
    assert_drained(&d).await;
    let mut done = Vec::new();
    for c in &fleet {
        done.push(metric(
            &c.get("/metrics").await.unwrap(),
            "sluice_jobs_ok_total",
        ));
    }
    eprintln!("fleet: jobs done per consumer {done:?}");
    assert_eq!(done.iter().sum::<u64>(), N as u64);
    assert!(
        done.iter().all(|&n| n > 0),
        "a consumer did none of the work: {done:?}"
    );
    for c in &mut fleet {
        let status = c.terminate(Duration::from_secs(30));
        assert!(
            status.is_some_and(|s| s.success()),
            "{status:?}\n{}",
            c.log_tail()
        );
    }
}
