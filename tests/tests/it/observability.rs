//! What operators see: one trace from publisher to result over a real OTLP
//! receiver, Prometheus metrics that match what happened, and readiness.

use std::collections::HashMap;
use std::time::Duration;

use sluice_schemas::{Input, Outcome};
use sluice_tests::deploy::Deployment;
use sluice_tests::fixtures::jsonl;
use sluice_tests::otlp::OtlpReceiver;
use sluice_tests::read_until;

use sluice_tests::results::wait_results;

const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PUBLISHER_SPAN: &str = "00f067aa0ba902b7";

fn texts(n: usize, what: &str) -> Vec<String> {
    (0..n)
        .map(|i| format!("{what} text {i} for the metrics"))
        .collect()
}

async fn get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    let r = reqwest::get(format!("http://{addr}{path}")).await.unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

/// The value of one series in Prometheus text (`name` with its labels).
fn metric(text: &str, series: &str) -> f64 {
    sluice_tests::prometheus_value(text, series)
        .unwrap_or_else(|| panic!("no series {series} in:\n{text}"))
}

#[tokio::test]
async fn the_consumer_continues_the_publishers_trace_over_otlp() {
    let receiver = OtlpReceiver::start().await.unwrap();
    let d = Deployment::start().await.unwrap();
    let endpoint = format!("--otlp-endpoint={}", receiver.endpoint);
    let consumer = d
        .start_consumer(&[&endpoint, "--otlp-protocol=http/json"])
        .await
        .unwrap();
    let mut results = d.producer.subscribe_results().await.unwrap();
    let job = d
        .producer
        .embed_job_from_jsonl("traced-1", jsonl(&texts(5, "traced")))
        .await
        .unwrap();
    let traceparent = format!("00-{TRACE_ID}-{PUBLISHER_SPAN}-01");
    d.producer
        .submit_with(
            &job,
            &d.producer.result_subject("traced-1"),
            Some(&traceparent),
        )
        .await
        .unwrap();
    let got = wait_results(&mut results, 1, Duration::from_secs(120)).await;
    assert!(matches!(got[0].outcome, Outcome::Ok { .. }), "{got:?}");
    // Shutting down flushes what the batch exporter still holds.
    consumer.shutdown(Duration::from_secs(10)).await.unwrap();

    let spans = receiver.spans();
    let in_trace: Vec<_> = spans.iter().filter(|s| s.trace_id == TRACE_ID).collect();
    let job_span = in_trace
        .iter()
        .find(|s| s.name == "sluice.job")
        .unwrap_or_else(|| panic!("no job span in the publisher's trace: {spans:#?}"));
    assert_eq!(
        job_span.parent_span_id, PUBLISHER_SPAN,
        "the job span's parent is the publisher's span"
    );
    assert_eq!(job_span.service_name, "sluice-consumer");
    let attributes = job_span.attributes.to_string();
    assert!(attributes.contains("traced-1"), "{attributes}");
    assert!(attributes.contains("sluice.outcome"), "{attributes}");
    let children: HashMap<&str, _> = in_trace
        .iter()
        .filter(|s| s.parent_span_id == job_span.span_id)
        .map(|s| (s.name.as_str(), s))
        .collect();
    for stage in [
        "admission",
        "fetch",
        "tokenize",
        "batch_wait",
        "inference",
        "write",
        "publish",
    ] {
        assert!(
            children.contains_key(stage),
            "no {stage} span under the job span; children: {:?}",
            children.keys()
        );
    }
    // The metrics went out over OTLP too (pushed once more on shutdown).
    let ok = receiver
        .metric("sluice_jobs_ok")
        .unwrap_or_else(|| panic!("no sluice_jobs_ok metric exported"));
    assert_eq!(ok.value(None), Some(1.0), "{ok:?}");
    let tokens = receiver.metric("sluice_tokens").unwrap();
    assert_eq!(
        tokens.value(None),
        Some(got[0].usage.tokens as f64),
        "{tokens:?}"
    );
    let failed = receiver.metric("sluice_jobs_failed").unwrap();
    assert_eq!(failed.value(Some(("code", "input_invalid"))), Some(0.0));
    let stages = receiver.metric("sluice_stage_seconds").unwrap();
    assert_eq!(
        stages.value(Some(("stage", "inference"))),
        Some(1.0),
        "{stages:?}"
    );
    assert!(
        receiver
            .metric("sluice_budget_bytes")
            .unwrap()
            .value(None)
            .unwrap()
            > 0.0
    );

    // The batch span links to the job it served.
    let linked = spans.iter().any(|s| {
        s.name == "sluice.batch"
            && s.links
                .iter()
                .any(|(t, sp)| t == TRACE_ID && *sp == job_span.span_id)
    });
    assert!(linked, "no batch span links to the job: {spans:#?}");
}

#[tokio::test]
async fn metrics_match_what_happened_and_readyz_goes_unready_while_draining() {
    let d = Deployment::start().await.unwrap();
    let consumer = d.start_consumer(&[]).await.unwrap();
    let addr = consumer.http_addr;
    assert_eq!(get(addr, "/readyz").await, (200, "ready\n".into()));
    let mut results = d.producer.subscribe_results().await.unwrap();

    // Three jobs ok, one with a broken input, one for a model nobody serves.
    for (i, n) in [3, 7, 12].into_iter().enumerate() {
        let job = d
            .producer
            .embed_job_from_jsonl(&format!("ok-{i}"), jsonl(&texts(n, "ok")))
            .await
            .unwrap();
        d.producer.submit(&job).await.unwrap();
    }
    let broken = d
        .producer
        .embed_job_from_jsonl("broken", b"\"fine\"\n[1, 2]\n".to_vec())
        .await
        .unwrap();
    d.producer.submit(&broken).await.unwrap();
    let mut other_model = d.producer.embed_job(
        "other-model",
        vec![Input::Inline {
            items: vec!["x".into()],
        }],
    );
    other_model.model = "bge-large".into();
    d.producer.submit(&other_model).await.unwrap();

    let got = wait_results(&mut results, 5, Duration::from_secs(120)).await;
    let ok: Vec<_> = got
        .iter()
        .filter(|r| matches!(r.outcome, Outcome::Ok { .. }))
        .collect();
    assert_eq!(ok.len(), 3, "{got:?}");
    let tokens: u64 = ok.iter().map(|r| r.usage.tokens).sum();
    let items: u64 = ok.iter().map(|r| r.usage.items).sum();
    assert_eq!(items, 22);

    // Counters are final before a result goes out; a job leaves the in-flight
    // gauge only after its ack, just after the result. Wait for that.
    let (status, text) = read_until(
        Duration::from_secs(10),
        || get(addr, "/metrics"),
        |(_, text)| metric(text, "sluice_jobs_in_flight") == 0.0,
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(metric(&text, "sluice_jobs_ok_total"), 3.0);
    assert_eq!(
        metric(&text, "sluice_jobs_failed_total{code=\"input_invalid\"}"),
        1.0
    );
    assert_eq!(
        metric(&text, "sluice_jobs_failed_total{code=\"unknown_model\"}"),
        1.0
    );
    assert_eq!(
        metric(&text, "sluice_jobs_failed_total{code=\"internal\"}"),
        0.0
    );
    assert_eq!(metric(&text, "sluice_dead_lettered_total"), 2.0);
    assert_eq!(metric(&text, "sluice_items_total"), items as f64);
    assert_eq!(metric(&text, "sluice_tokens_total"), tokens as f64);
    assert_eq!(
        metric(&text, "sluice_batch_real_tokens_total"),
        tokens as f64
    );
    assert_eq!(
        metric(&text, "sluice_stage_seconds_count{stage=\"total\"}"),
        5.0
    );
    assert_eq!(
        metric(&text, "sluice_stage_seconds_count{stage=\"inference\"}"),
        3.0,
        "only jobs that ran have an inference time"
    );
    let batches = metric(&text, "sluice_batches_total");
    assert!(batches >= 1.0);
    assert_eq!(metric(&text, "sluice_batch_items_count"), batches);
    assert_eq!(metric(&text, "sluice_batch_items_sum"), items as f64);
    assert_eq!(metric(&text, "sluice_jobs_in_flight"), 0.0);
    assert_eq!(metric(&text, "sluice_tokens_in_flight"), 0.0);
    // An idle consumer still holds the reservations of its waiting pull.
    let budget = metric(&text, "sluice_budget_bytes");
    assert!(budget > 0.0);
    assert!(metric(&text, "sluice_budget_reserved_bytes") <= budget);
    assert!(metric(&text, "sluice_budget_reserved_peak_bytes") <= budget);
    assert!(metric(&text, "sluice_host_resident_peak_bytes") > 0.0);
    // On the CPU there is no device memory to report, and none is made up.
    assert!(!text.contains("sluice_device_memory"), "{text}");
    assert_eq!(metric(&text, "sluice_ready"), 1.0);

    let (status, memory) = get(addr, "/debug/memory").await;
    assert_eq!(status, 200);
    let memory: serde_json::Value = serde_json::from_str(&memory).unwrap();
    assert_eq!(memory["device"], "cpu");
    let resident = memory["host_resident_bytes"].as_u64().unwrap();
    assert!(resident > 0);
    assert!(memory["host_peak_resident_bytes"].as_u64().unwrap() >= resident);
    assert!(memory["device_memory"].is_null(), "{memory}");

    // A large job in flight keeps the drain going while /readyz is polled.
    let big = d
        .producer
        .embed_job_from_jsonl("big", jsonl(&texts(400, "drain")))
        .await
        .unwrap();
    d.producer.submit(&big).await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while metric(&get(addr, "/metrics").await.1, "sluice_jobs_in_flight") < 1.0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the big job was never pulled"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let drain = tokio::spawn(consumer.shutdown(Duration::from_secs(60)));
    let mut unready = None;
    for _ in 0..200 {
        let (status, body) = get(addr, "/readyz").await;
        if status == 503 {
            unready = Some(body);
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(unready.as_deref(), Some("not ready: draining\n"));
    assert_eq!(get(addr, "/healthz").await.0, 200, "alive while draining");
    drain.await.unwrap().unwrap();
    let r = wait_results(&mut results, 1, Duration::from_secs(60)).await;
    assert_eq!(
        r[0].job_id.as_deref(),
        Some("big"),
        "the in-flight job finished during the drain"
    );
}
