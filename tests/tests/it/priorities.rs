//! Priorities: a consumer takes higher levels first without starving lower
//! ones. Issue #19's check: 5,000 low jobs wait before the consumer starts,
//! then 20 high jobs arrive; each high job is pulled within two batch times
//! of its publish, and low jobs keep completing meanwhile.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use futures::StreamExt;
use sluice_producer::Submission;
use sluice_schemas::{Input, Outcome, Priority, Task};
use sluice_tests::deploy::Deployment;
use sluice_tests::fixtures::jsonl;

const T: Duration = Duration::from_secs(180);

#[tokio::test]
async fn high_jobs_overtake_a_low_backlog_which_keeps_completing() {
    let d = Deployment::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let lows = dir.path().join("low.jsonl");
    let texts: Vec<String> = (0..5000)
        .map(|i| format!("low priority text number {i}, one of a large backlog"))
        .collect();
    std::fs::write(&lows, jsonl(&texts)).unwrap();
    let run = d
        .cli(
            &[
                "submit",
                "--json",
                "--each-line",
                "--priority",
                "low",
                lows.to_str().unwrap(),
            ],
            None,
            T,
        )
        .await;
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert_eq!(run.json_lines().len(), 5000);
    let watch = d.cli(&["watch", "--once", "--json"], None, T).await;
    let pending = &watch.json_lines()[0]["stream"]["pending_by_priority"];
    assert_eq!(pending["low"], 5000, "{watch:?}");
    assert_eq!(pending["high"], 0, "{watch:?}");
    let bad = d
        .cli(
            &["submit", "--priority", "urgent", lows.to_str().unwrap()],
            None,
            T,
        )
        .await;
    assert_eq!(bad.code, Some(2), "{bad:?}");
    assert!(bad.stderr.contains("use high, normal or low"), "{bad:?}");

    // The backlog came from `sluice submit` without --wait: answered on the
    // default subjects.
    let mut results = d.producer.subscribe_results_and_defaults().await.unwrap();
    let consumer = d.start_consumer(&[]).await.unwrap();
    // Let the consumer get well into the backlog.
    let mut low_done = 0;
    while low_done < 300 {
        let r = tokio::time::timeout(T, results.next_result())
            .await
            .unwrap()
            .unwrap();
        assert!(matches!(r.outcome, Outcome::Ok { .. }), "{r:?}");
        low_done += 1;
    }
    let (batches_before, model_us_before) = (
        consumer.stats.batches.load(Ordering::Relaxed),
        consumer.stats.model_micros.load(Ordering::Relaxed),
    );

    // 20 high jobs, each published and acked; the instant of each ack kept.
    let highs: Vec<Submission> = (0..20)
        .map(|i| {
            let job = d.producer.job(
                Task::Embed,
                &format!("high-{i}"),
                vec![Input::Inline {
                    items: vec![format!("an urgent text, number {i}").into()],
                }],
            );
            let mut s = Submission::new(&d.producer, job, None);
            s.priority = Priority::High;
            s
        })
        .collect();
    let burst = Instant::now();
    let mut acks = d.producer.submit_pipelined(highs, 1).await.unwrap();
    while let Some(s) = acks.next().await {
        s.ack.unwrap();
    }
    drop(acks);
    let mut high_waits: HashMap<String, f64> = HashMap::new();
    let mut low_during_burst = 0;
    while high_waits.len() < 20 {
        let r = tokio::time::timeout(T, results.next_result())
            .await
            .unwrap()
            .unwrap();
        assert!(matches!(r.outcome, Outcome::Ok { .. }), "{r:?}");
        let id = r.job_id.clone().unwrap();
        if id.starts_with("high-") {
            high_waits.insert(id, r.timings_ms.queue.unwrap());
        } else {
            low_during_burst += 1;
        }
    }
    let burst_secs = burst.elapsed().as_secs_f64();
    let batches = consumer.stats.batches.load(Ordering::Relaxed) - batches_before;
    let model_ms =
        (consumer.stats.model_micros.load(Ordering::Relaxed) - model_us_before) as f64 / 1e3;
    let batch_ms = model_ms / batches.max(1) as f64;
    let worst_wait = high_waits.values().cloned().fold(0.0, f64::max);
    let mean_wait = high_waits.values().sum::<f64>() / 20.0;
    eprintln!(
        "20 high jobs behind {} low: queue wait mean {mean_wait:.1} ms, worst {worst_wait:.1} ms; \
         a batch took {batch_ms:.1} ms on average ({batches} batches); {low_during_burst} low jobs \
         completed in the {burst_secs:.2} s until the last high answer",
        5000 - low_done
    );
    assert!(
        worst_wait <= 2.0 * batch_ms,
        "a high job waited {worst_wait:.1} ms in the stream, over two batch times ({batch_ms:.1} ms each)"
    );
    assert!(
        low_during_burst > 0,
        "low jobs kept completing during the burst"
    );

    // The queue wait is in the metrics by level, and every low job is answered.
    let metrics = sluice_tests::get_text(&format!("http://{}/metrics", consumer.http_addr)).await;
    assert_eq!(
        sluice_tests::prometheus_value(
            &metrics,
            "sluice_queue_wait_seconds_count{priority=\"high\"}"
        ),
        Some(20.0),
        "{metrics}"
    );
    let mut low_left = 5000 - low_done - low_during_burst;
    while low_left > 0 {
        let r = tokio::time::timeout(T, results.next_result())
            .await
            .unwrap()
            .unwrap();
        assert!(matches!(r.outcome, Outcome::Ok { .. }), "{r:?}");
        low_left -= 1;
    }
    assert_eq!(d.jobs_in_stream_settled(0).await, 0);
    consumer.shutdown(Duration::from_secs(10)).await.unwrap();
}
