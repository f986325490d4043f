//! Worker recycling: a consumer that reaches a recycle limit drains and exits
//! 0, and a supervisor (here, the test's loop; Kubernetes or compose in
//! production) starts a fresh one. Nothing is lost or answered twice.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use sluice_producer::dlq::Filter;
use sluice_schemas::{Input, Outcome};
use sluice_tests::deploy::{ConsumerProcess, Deployment};

/// Submits `n` one-text jobs named `{prefix}-{i}`.
async fn submit(d: &Deployment, prefix: &str, n: usize) {
    for i in 0..n {
        let job = d.producer.embed_job(
            &format!("{prefix}-{i}"),
            vec![Input::Inline {
                items: vec![format!("recycled text number {i}").into()],
            }],
        );
        d.producer.submit(&job).await.unwrap();
    }
}

/// Runs consumers with `args` one after another, restarting each that exits
/// (as a supervisor does), until `n` results came; returns how many times
/// each job was answered and each life's log.
async fn supervise(
    d: &Deployment,
    args: &[&str],
    n: usize,
) -> (HashMap<String, usize>, Vec<String>) {
    let mut results = d.producer.subscribe_results().await.unwrap();
    let mut answered: HashMap<String, usize> = HashMap::new();
    let mut logs = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(300);
    let mut consumer: ConsumerProcess = d.spawn_consumer(args).await.unwrap();
    while answered.values().sum::<usize>() < n {
        assert!(
            Instant::now() < deadline,
            "{} of {n} results after 300 s",
            answered.len()
        );
        if let Ok(r) = tokio::time::timeout(Duration::from_millis(100), results.next_result()).await
        {
            let r = r.unwrap();
            assert!(matches!(r.outcome, Outcome::Ok { .. }), "{:?}", r.outcome);
            *answered.entry(r.job_id.unwrap_or_default()).or_default() += 1;
        }
        if let Some(status) = consumer.exited() {
            let log = consumer.log();
            assert!(status.success(), "a recycle exits 0, not {status}:\n{log}");
            logs.push(log);
            consumer = d.spawn_consumer(args).await.unwrap();
        }
    }
    // Anything answered twice would arrive by now.
    while let Ok(r) = tokio::time::timeout(Duration::from_secs(2), results.next_result()).await {
        *answered
            .entry(r.unwrap().job_id.unwrap_or_default())
            .or_default() += 1;
    }
    consumer.terminate(Duration::from_secs(10));
    logs.push(consumer.log());
    (answered, logs)
}

fn assert_each_answered_once(answered: &HashMap<String, usize>, n: usize) {
    assert_eq!(answered.len(), n);
    let twice: Vec<_> = answered.iter().filter(|(_, k)| **k != 1).collect();
    assert!(twice.is_empty(), "answered more than once: {twice:?}");
}

#[tokio::test]
async fn a_consumer_recycling_every_40_jobs_answers_400_jobs_exactly_once() {
    let d = Deployment::start().await.unwrap();
    submit(&d, "r", 400).await;
    let (answered, logs) = supervise(&d, &["--recycle-after-jobs=40"], 400).await;
    assert_each_answered_once(&answered, 400);
    let recycled = logs
        .iter()
        .filter(|l| l.contains("recycling") && l.contains("jobs"))
        .count();
    eprintln!(
        "400 jobs over {} processes, {recycled} recycled",
        logs.len()
    );
    // Each life takes 36 to 44 jobs (and finishes those it holds when the
    // limit is reached), so 400 jobs need several lives.
    assert!(
        recycled >= 4,
        "only {recycled} recycles:\n{}",
        logs.join("\n---\n")
    );
    let letters = d.producer.dead_letters(&Filter::default()).await.unwrap();
    assert!(letters.is_empty(), "{letters:?}");
    assert_eq!(d.jobs_in_stream_settled(0).await, 0, "nothing left behind");
}

#[tokio::test]
async fn a_consumer_recycles_when_its_memory_grows_past_the_limit() {
    let d = Deployment::start().await.unwrap();
    submit(&d, "m", 60).await;
    // 1 MiB over the level after warm-up: the first jobs' buffers pass it.
    let (answered, logs) = supervise(&d, &["--recycle-rss-growth-mib=1"], 60).await;
    assert_each_answered_once(&answered, 60);
    let first = &logs[0];
    assert!(
        first.contains("recycling") && first.contains("memory"),
        "the first process did not recycle for memory:\n{first}"
    );
    assert_eq!(d.jobs_in_stream_settled(0).await, 0);
}
