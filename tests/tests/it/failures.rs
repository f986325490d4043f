//! Failure paths: every bad input gets its own code, a result and a dead
//! letter; poison jobs end in the dead-letter stream and replay; exhausted
//! deliveries are caught by the advisory backstop; cancelled and late jobs are
//! not run. Nothing is lost: each test checks where every job ended up.

use std::collections::HashMap;
use std::time::Duration;

use async_nats::jetstream::{self, consumer::PullConsumer};
use aws_sdk_s3::presigning::PresigningConfig;
use futures::StreamExt;
use sluice_producer::dlq::Filter;
use sluice_producer::provision::Settings;
use sluice_schemas::{ErrorCode, Input, InputFormat, JobState, ObjectRef, Outcome};
use sluice_tests::deploy::Deployment;
use sluice_tests::free_port;

use sluice_tests::results::{next_error, wait_results};

async fn upload(d: &Deployment, key: &str, body: Vec<u8>) {
    d.servers
        .s3
        .client()
        .put_object()
        .bucket(&d.bucket)
        .key(key)
        .body(body.into())
        .send()
        .await
        .unwrap();
}

async fn presign(d: &Deployment, key: &str) -> String {
    d.servers
        .s3
        .client()
        .get_object()
        .bucket(&d.bucket)
        .key(key)
        .presigned(PresigningConfig::expires_in(Duration::from_secs(600)).unwrap())
        .await
        .unwrap()
        .uri()
        .to_string()
}

fn url_input(url: String) -> Input {
    Input::Url {
        url,
        format: InputFormat::Jsonl,
        object: None,
    }
}

fn by_job_id(
    results: Vec<sluice_schemas::JobResult>,
) -> HashMap<String, sluice_schemas::JobResult> {
    results
        .into_iter()
        .map(|r| (r.job_id.clone().unwrap_or_default(), r))
        .collect()
}

fn assert_ok(by_id: &HashMap<String, sluice_schemas::JobResult>, id: &str) {
    assert!(
        matches!(by_id[id].outcome, Outcome::Ok { .. }),
        "{id}: {:?}",
        by_id[id].outcome
    );
}

async fn dlq_codes(d: &Deployment) -> HashMap<String, ErrorCode> {
    d.producer
        .dead_letters(&Filter::default())
        .await
        .unwrap()
        .into_iter()
        .map(|(_, l)| (l.job_id.unwrap_or_else(|| "<no id>".into()), l.error.code))
        .collect()
}

#[tokio::test]
async fn each_bad_input_gets_its_code_a_result_and_a_dead_letter() {
    let d = Deployment::start().await.unwrap();
    let s3_host = format!("127.0.0.1:{}", d.servers.s3.port);
    let consumer = d
        .start_consumer(&[
            &format!("--input-allow-hosts={s3_host}"),
            "--max-input-bytes=4096",
            "--max-items-per-job=50",
        ])
        .await
        .unwrap();
    let mut results = d.producer.subscribe_results_and_defaults().await.unwrap();
    let p = &d.producer;

    upload(&d, "in/good.jsonl", b"\"hello\"\n".to_vec()).await;
    upload(
        &d,
        "in/big.jsonl",
        "\"word word word\"\n".repeat(400).into_bytes(),
    )
    .await;
    upload(&d, "in/latin1.jsonl", b"\"caf\xe9\"\n".to_vec()).await;
    upload(&d, "in/broken.jsonl", b"\"ok\"\n{not json\n".to_vec()).await;
    let good = presign(&d, "in/good.jsonl").await;
    let sig = good.find("X-Amz-Signature=").unwrap() + "X-Amz-Signature=".len();
    let mut tampered = good.clone().into_bytes();
    tampered[sig] = if tampered[sig] == b'0' { b'1' } else { b'0' };
    let tampered = String::from_utf8(tampered).unwrap();

    let mut expected: Vec<(String, ErrorCode)> = Vec::new();
    let mut submit = |id: &str, code: ErrorCode| expected.push((id.to_string(), code));
    let publish_raw = |subject: String, id: &str, body: Vec<u8>| {
        let js = p.js.clone();
        let id = id.to_string();
        async move {
            let mut h = async_nats::HeaderMap::new();
            h.insert("Nats-Msg-Id", id.as_str());
            js.publish_with_headers(subject, h, body.into())
                .await
                .unwrap()
                .await
                .unwrap();
        }
    };

    // Not JSON at all: answered under its Nats-Msg-Id (python_bad_messages
    // in publishers.rs covers the kinds and a message with no id at all).
    publish_raw(
        d.topology.job_subject("embed"),
        "raw-1",
        b"{not json".to_vec(),
    )
    .await;
    submit("raw-1", ErrorCode::MalformedMessage);
    // JSON with an id but no inputs.
    publish_raw(
        d.topology.job_subject("embed"),
        "schema-1",
        br#"{"version":1,"id":"schema-1","task":"embed","model":"all-minilm-l6-v2"}"#.to_vec(),
    )
    .await;
    submit("schema-1", ErrorCode::SchemaViolation);
    // The subject of a task nobody serves is not the stream's: the publish
    // itself is refused, so no job waits there unserved.
    let refused =
        p.js.publish(d.topology.job_subject("summarize"), "{}".into())
            .await
            .unwrap()
            .await;
    assert!(
        refused.is_err(),
        "a job on an unknown task's subject was stored"
    );
    publish_raw(
        d.topology.job_subject("embed"),
        "task-1",
        br#"{"version":1,"id":"task-1","task":"summarize","model":"x","inputs":[{"type":"inline","items":["a"]}]}"#.to_vec(),
    )
    .await;
    submit("task-1", ErrorCode::UnknownTask);
    // A generate job on the embed subject reaches the embed consumer, which
    // says where such jobs go.
    publish_raw(
        d.topology.job_subject("embed"),
        "task-2",
        br#"{"version":1,"id":"task-2","task":"generate","model":"x","inputs":[{"type":"inline","items":["a"]}]}"#.to_vec(),
    )
    .await;
    submit("task-2", ErrorCode::UnknownTask);

    let job = |id: &str, inputs: Vec<Input>| p.embed_job(id, inputs);
    let mut jobs = Vec::new();
    let mut m = job(
        "model-1",
        vec![Input::Inline {
            items: vec!["a".into()],
        }],
    );
    m.model = "gpt-9".into();
    jobs.push((m, ErrorCode::UnknownModel));
    jobs.push((
        job("forbidden-1", vec![url_input(tampered)]),
        ErrorCode::InputUnavailable,
    ));
    jobs.push((
        job(
            "missing-1",
            vec![url_input(presign(&d, "in/nope.jsonl").await)],
        ),
        ErrorCode::InputUnavailable,
    ));
    jobs.push((
        job(
            "host-1",
            vec![url_input(good.replace("127.0.0.1", "localhost"))],
        ),
        ErrorCode::InputNotAllowed,
    ));
    jobs.push((
        job(
            "linklocal-1",
            vec![url_input("http://169.254.169.254/latest/meta-data/".into())],
        ),
        ErrorCode::InputNotAllowed,
    ));
    jobs.push((
        job("big-1", vec![url_input(presign(&d, "in/big.jsonl").await)]),
        ErrorCode::InputTooLarge,
    ));
    jobs.push((
        job(
            "utf8-1",
            vec![url_input(presign(&d, "in/latin1.jsonl").await)],
        ),
        ErrorCode::InputInvalid,
    ));
    jobs.push((
        job(
            "jsonl-1",
            vec![url_input(presign(&d, "in/broken.jsonl").await)],
        ),
        ErrorCode::InputInvalid,
    ));
    let mut long = job(
        "long-1",
        vec![Input::Inline {
            items: vec!["word ".repeat(400).into()],
        }],
    );
    long.parameters.encoder.truncate = Some(false);
    jobs.push((long, ErrorCode::ItemTooLong));
    let many: Vec<serde_json::Value> = (0..60).map(|i| format!("item {i}").into()).collect();
    jobs.push((
        job("many-1", vec![Input::Inline { items: many }]),
        ErrorCode::TooManyItems,
    ));
    let mut late = job(
        "late-1",
        vec![Input::Inline {
            items: vec!["a".into()],
        }],
    );
    late.deadline = Some(time::OffsetDateTime::now_utc() - time::Duration::seconds(5));
    // The producer library refuses a job whose deadline has passed...
    let refused = format!("{:#}", p.submit(&late).await.unwrap_err());
    assert!(
        refused.contains("job late-1 was not published") && refused.contains("passed 5"),
        "{refused}"
    );
    for (j, code) in jobs {
        p.submit(&j).await.unwrap();
        submit(&j.id, code);
    }
    // ...but a publisher in another language may send one: the consumer
    // answers it `deadline_exceeded` without running it.
    let mut h = async_nats::HeaderMap::new();
    h.insert("Nats-Msg-Id", "late-1");
    p.js.publish_with_headers(d.topology.job_subject("embed"), h, late.to_bytes().into())
        .await
        .unwrap()
        .await
        .unwrap();
    submit("late-1", ErrorCode::DeadlineExceeded);
    // And a good job after all of them: the consumer is still healthy.
    p.submit(&p.embed_job("fine-1", vec![url_input(good)]))
        .await
        .unwrap();

    let got = wait_results(&mut results, expected.len() + 1, Duration::from_secs(120)).await;
    let by_id = by_job_id(got);
    assert_ok(&by_id, "fine-1");
    let dlq = dlq_codes(&d).await;
    for (id, code) in &expected {
        let r = by_id
            .get(id)
            .unwrap_or_else(|| panic!("no result for {id}"));
        let Outcome::Error { error } = &r.outcome else {
            panic!("{id}: expected {code}, got {:?}", r.outcome)
        };
        eprintln!("{id}: {} {}", error.code, error.message);
        assert_eq!(error.code, *code, "{id}: {}", error.message);
        if id == "linklocal-1" {
            assert!(error.message.contains("link-local"), "{}", error.message);
        }
        if id == "task-2" {
            let subject = d.topology.job_subject("generate");
            assert!(error.message.contains(&subject), "{}", error.message);
        }
        assert!(!error.retryable, "{id}");
        assert!(!error.message.is_empty());
        assert!(
            !error.message.contains("X-Amz-Signature"),
            "{id}: a message leaks the URL's signature"
        );
        assert_eq!(
            dlq.get(id),
            Some(code),
            "{id}: no dead letter with its code"
        );
        let status = p.status(id).await.unwrap().unwrap();
        // Pulled after its deadline: never run, so expired, not failed.
        let state = if *code == ErrorCode::DeadlineExceeded {
            JobState::Expired
        } else {
            JobState::Failed
        };
        assert_eq!(status.state, state, "{id}");
    }
    assert_eq!(
        dlq.len(),
        expected.len(),
        "one dead letter per bad job: {dlq:?}"
    );
    assert_eq!(d.jobs_in_stream_settled(0).await, 0, "nothing left behind");
    consumer.shutdown(Duration::from_secs(10)).await.unwrap();
}

/// Closed by default: with no `--input-allow-hosts`, an input at another
/// loopback port (the NATS server's own), by address or by a name that
/// resolves to loopback, is refused with `input_not_allowed`, answered and
/// dead-lettered; inputs on the consumer's own S3 endpoint, loopback too,
/// are fetched.
#[tokio::test]
async fn internal_addresses_are_refused_by_default_but_the_s3_endpoint_is_not() {
    let d = Deployment::start().await.unwrap();
    let consumer = d.start_consumer(&[]).await.unwrap();
    let mut results = d.producer.subscribe_results_and_defaults().await.unwrap();
    let p = &d.producer;
    upload(&d, "in/good.jsonl", b"\"hello\"\n".to_vec()).await;
    let good = presign(&d, "in/good.jsonl").await;
    let nats = d.servers.nats.port;
    let refused = [
        ("nats-ip-1", format!("http://127.0.0.1:{nats}/varz")),
        ("nats-name-1", format!("http://localhost:{nats}/varz")),
        ("private-1", "http://10.255.0.1/in.jsonl".to_string()),
    ];
    p.submit(&p.embed_job("s3-1", vec![url_input(good)]))
        .await
        .unwrap();
    for (id, url) in &refused {
        p.submit(&p.embed_job(id, vec![url_input(url.clone())]))
            .await
            .unwrap();
    }
    let got = wait_results(&mut results, 1 + refused.len(), Duration::from_secs(60)).await;
    let by_id = by_job_id(got);
    assert_ok(&by_id, "s3-1");
    let dlq = dlq_codes(&d).await;
    for (id, _) in &refused {
        let Outcome::Error { error } = &by_id[*id].outcome else {
            panic!("{id}: fetched, expected input_not_allowed")
        };
        eprintln!("{id}: {} {}", error.code, error.message);
        assert_eq!(
            error.code,
            ErrorCode::InputNotAllowed,
            "{id}: {}",
            error.message
        );
        assert!(
            error.message.contains("input_allow_hosts"),
            "{}",
            error.message
        );
        assert_eq!(dlq.get(*id), Some(&ErrorCode::InputNotAllowed), "{id}");
        let status = p.status(id).await.unwrap().unwrap();
        assert_eq!(status.state, JobState::Failed, "{id}");
    }
    let Outcome::Error { error } = &by_id["nats-name-1"].outcome else {
        unreachable!()
    };
    assert!(
        error.message.contains("localhost resolves to") && error.message.contains("loopback"),
        "{}",
        error.message
    );
    assert_eq!(dlq.len(), refused.len(), "{dlq:?}");
    assert_eq!(d.jobs_in_stream_settled(0).await, 0, "nothing left behind");
    consumer.shutdown(Duration::from_secs(10)).await.unwrap();
}

/// An HTTP proxy in the consumer's environment (`HTTP_PROXY`, as a shared
/// host or a container runtime sets it) must not carry an input past the
/// address guard: through a proxy the consumer resolves nothing, so
/// `http://localhost:...` would be fetched by the proxy on its behalf. The
/// fetcher ignores proxy variables: the job is refused with
/// `input_not_allowed` as without a proxy, and the proxy is never asked for
/// the input (the consumer's S3 client, which reaches the operator's own
/// endpoint, is exempted with `NO_PROXY`, as an operator would: it checks
/// at start-up that it may list its output prefix, which this proxy's
/// canned answer is not).
#[tokio::test]
async fn an_http_proxy_in_the_environment_does_not_carry_an_input_past_the_guard() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    // A proxy that answers every request with one JSONL line.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let proxy = format!("http://{}", listener.local_addr().unwrap());
    let asked = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&asked);
    let server = tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let mut head = [0u8; 4096];
            let n = conn.read(&mut head).await.unwrap_or(0);
            // The consumer's own S3 client may use the proxy (the operator's
            // endpoint); the input must not.
            if String::from_utf8_lossy(&head[..n]).contains("/in.jsonl") {
                counted.fetch_add(1, Ordering::SeqCst);
            }
            let body = "\"fetched through the proxy\"\n";
            let _ = conn
                .write_all(
                    format!(
                        "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    )
                    .as_bytes(),
                )
                .await;
        }
    });
    let d = Deployment::start().await.unwrap();
    let _consumer = d
        .spawn_consumer_with_env(
            &[],
            &[
                ("HTTP_PROXY", &proxy),
                ("http_proxy", &proxy),
                ("ALL_PROXY", &proxy),
                // The consumer's own S3 endpoint (127.0.0.1) is reached
                // directly, as an operator exempts it; the input names
                // `localhost`, which no exemption covers.
                ("NO_PROXY", "127.0.0.1"),
                ("no_proxy", "127.0.0.1"),
            ],
        )
        .await
        .unwrap();
    let mut results = d.producer.subscribe_results_and_defaults().await.unwrap();
    let p = &d.producer;
    let nats = d.servers.nats.port;
    let url = format!("http://localhost:{nats}/in.jsonl");
    p.submit(&p.embed_job("proxied-1", vec![url_input(url)]))
        .await
        .unwrap();
    let got = wait_results(&mut results, 1, Duration::from_secs(60)).await;
    let by_id = by_job_id(got);
    let Outcome::Error { error } = &by_id["proxied-1"].outcome else {
        panic!("the input was fetched through the proxy")
    };
    assert_eq!(error.code, ErrorCode::InputNotAllowed, "{}", error.message);
    assert!(
        error.message.contains("localhost resolves to") && error.message.contains("loopback"),
        "{}",
        error.message
    );
    assert_eq!(
        asked.load(Ordering::SeqCst),
        0,
        "the proxy was asked for the input"
    );
    server.abort();
}

#[tokio::test]
async fn poison_job_is_dead_lettered_after_max_deliver_and_replays_once_fixed() {
    let d = Deployment::start_with(Settings {
        max_deliver: 3,
        ..Settings::default()
    })
    .await
    .unwrap();
    // Loopback listed: the input below is at a loopback port.
    let consumer = d
        .start_consumer(&[
            "--retry-base-ms=100",
            "--retry-max-ms=300",
            "--input-allow-hosts=127.0.0.1",
        ])
        .await
        .unwrap();
    let mut results = d.producer.subscribe_results_and_defaults().await.unwrap();
    // The input's object exists, but the URL points at a port nobody listens on:
    // every attempt fails transiently.
    upload(&d, "in/poison.jsonl", b"\"recovered\"\n".to_vec()).await;
    let job = d.producer.embed_job(
        "poison-1",
        vec![Input::Url {
            url: format!("http://127.0.0.1:{}/nowhere.jsonl", free_port()),
            format: InputFormat::Jsonl,
            object: Some(ObjectRef {
                bucket: d.bucket.clone(),
                key: "in/poison.jsonl".into(),
            }),
        }],
    );
    d.producer.submit(&job).await.unwrap();
    let (r, error) = next_error(&mut results).await;
    assert_eq!(error.code, ErrorCode::InputFetchFailed);
    assert!(error.retryable);
    assert_eq!(
        r.attempt, 3,
        "dead-lettered on the last of max_deliver attempts"
    );
    let letters = d.producer.dead_letters(&Filter::default()).await.unwrap();
    assert_eq!(letters.len(), 1);
    let (seq, letter) = &letters[0];
    assert_eq!(letter.attempts, 3);
    assert_eq!(letter.original_subject, d.topology.job_subject("embed"));
    assert_eq!(
        d.producer.status("poison-1").await.unwrap().unwrap().state,
        JobState::Failed
    );

    // The cause is "fixed" by re-signing the URL from the object it names.
    let replayed = d.producer.replay(*seq, letter, true).await.unwrap();
    assert_eq!(replayed.refreshed_urls, 1);
    let r = wait_results(&mut results, 1, Duration::from_secs(60))
        .await
        .remove(0);
    assert!(matches!(r.outcome, Outcome::Ok { .. }), "{:?}", r.outcome);
    let status = d.producer.status("poison-1").await.unwrap().unwrap();
    assert_eq!(status.state, JobState::Done);
    assert_eq!(status.replays, 1);
    consumer.shutdown(Duration::from_secs(10)).await.unwrap();
}

/// A job between ~780 KB and 1 MB that fails for good could not be
/// dead-lettered (its base64 in the letter passed the server's max
/// payload): its status stayed `running` for ever and nobody was answered.
/// Now its payload is kept in S3 and the letter names it: the job is
/// answered, recorded `failed`, shown and replayed byte for byte.
#[tokio::test]
async fn a_job_too_large_to_carry_in_its_dead_letter_is_dead_lettered_by_reference() {
    let d = Deployment::start().await.unwrap();
    let consumer = d.start_consumer(&["--max-items-per-job=50"]).await.unwrap();
    let mut results = d.producer.subscribe_results_and_defaults().await.unwrap();
    // 60 items (more than the consumer takes: refused for good) of 15 KB.
    let items: Vec<serde_json::Value> = (0..60)
        .map(|i| format!("{i} {}", "word ".repeat(3_000)).into())
        .collect();
    let job = d.producer.embed_job("big-1", vec![Input::Inline { items }]);
    let bytes = job.to_bytes();
    let max_payload = d.producer.nats.server_info().max_payload;
    assert!(
        bytes.len() < max_payload && bytes.len() * 4 / 3 > max_payload,
        "the job ({} bytes) fits a message but not as base64 ({max_payload})",
        bytes.len()
    );
    d.producer.submit(&job).await.unwrap();

    let (r, error) = tokio::time::timeout(Duration::from_secs(60), next_error(&mut results))
        .await
        .expect("the job was never answered");
    assert_eq!(r.job_id.as_deref(), Some("big-1"));
    assert_eq!(error.code, ErrorCode::TooManyItems);
    assert_eq!(
        d.producer.status("big-1").await.unwrap().unwrap().state,
        JobState::Failed
    );
    let letters = d.producer.dead_letters(&Filter::default()).await.unwrap();
    assert_eq!(letters.len(), 1, "{letters:?}");
    let (seq, letter) = &letters[0];
    assert_eq!(letter.job_id.as_deref(), Some("big-1"));
    assert!(letter.payload_base64.is_empty());
    let object = letter.payload_object.as_ref().expect("no payload object");
    assert_eq!(object.bucket, d.bucket);
    assert_eq!(
        d.producer.dead_letter_payload(*seq, letter).await.unwrap(),
        bytes,
        "the kept payload is the job as published"
    );
    let shown = d
        .cli(
            &["dlq", "show", &seq.to_string()],
            None,
            Duration::from_secs(60),
        )
        .await;
    assert_eq!(shown.code, Some(0), "{shown:?}");
    assert!(shown.stdout.contains("\"payload_object\""), "{shown:?}");
    assert!(shown.stdout.contains("original payload:\n{"), "{shown:?}");

    // Replayed byte for byte: it fails again the same way, and is
    // dead-lettered again (a second letter), still answered.
    let replayed = d.producer.replay(*seq, letter, false).await.unwrap();
    let (_, again) = tokio::time::timeout(Duration::from_secs(60), next_error(&mut results))
        .await
        .expect("the replay was never answered");
    assert_eq!(again.code, ErrorCode::TooManyItems);
    let letters = d.producer.dead_letters(&Filter::default()).await.unwrap();
    assert_eq!(letters.len(), 2, "{letters:?}");
    let (seq2, letter2) = &letters[1];
    assert_eq!(letter2.stream_sequence, replayed.stream_sequence);
    assert_eq!(
        d.producer
            .dead_letter_payload(*seq2, letter2)
            .await
            .unwrap(),
        bytes
    );
    consumer.shutdown(Duration::from_secs(10)).await.unwrap();
}

#[tokio::test]
async fn cancelled_jobs_are_not_run() {
    let d = Deployment::start().await.unwrap();
    let mut results = d.producer.subscribe_results_and_defaults().await.unwrap();
    let job = d.producer.embed_job(
        "cancel-1",
        vec![Input::Inline {
            items: vec!["x".into()],
        }],
    );
    d.producer.submit(&job).await.unwrap();
    assert!(d.producer.cancel("cancel-1").await.unwrap());
    let consumer = d.start_consumer(&[]).await.unwrap();
    let (_, error) = next_error(&mut results).await;
    assert_eq!(error.code, ErrorCode::Cancelled);
    assert_eq!(
        d.producer.status("cancel-1").await.unwrap().unwrap().state,
        JobState::Cancelled
    );
    assert!(
        !d.producer.cancel("cancel-1").await.unwrap(),
        "a finished job cannot be cancelled"
    );
    assert_eq!(
        d.jobs_in_stream_settled(0).await,
        0,
        "jobs left in the stream"
    );
    consumer.shutdown(Duration::from_secs(10)).await.unwrap();
}

#[tokio::test]
async fn exhausted_deliveries_are_dead_lettered_by_the_advisory_backstop() {
    let d = Deployment::start_with(Settings {
        max_deliver: 2,
        ack_wait: Duration::from_secs(4),
        ..Settings::default()
    })
    .await
    .unwrap();
    let job = d.producer.embed_job(
        "lost-1",
        vec![Input::Inline {
            items: vec!["x".into()],
        }],
    );
    d.producer.submit(&job).await.unwrap();
    // A "consumer" that takes the job and dies each time: two deliveries, no ack.
    let js = jetstream::new(d.servers.nats.connect().await.unwrap());
    let stream = js.get_stream(&d.topology.job_stream).await.unwrap();
    let puller: PullConsumer = stream.get_consumer(&d.topology.consumer).await.unwrap();
    for attempt in 1..=2 {
        let mut batch = puller
            .fetch()
            .max_messages(1)
            .expires(Duration::from_secs(10))
            .messages()
            .await
            .unwrap();
        let msg = tokio::time::timeout(Duration::from_secs(10), batch.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(msg.info().unwrap().delivered, attempt);
        drop(batch);
    }
    // Our consumer starts listening before the second delivery's ack wait ends.
    let consumer = d.start_consumer(&[]).await.unwrap();
    let mut found = None;
    for _ in 0..100 {
        let letters = d.producer.dead_letters(&Filter::default()).await.unwrap();
        if let Some((_, l)) = letters.into_iter().next() {
            found = Some(l);
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let letter = found.expect("the exhausted job was not dead-lettered");
    assert_eq!(letter.error.code, ErrorCode::MaxDeliveriesExceeded);
    assert_eq!(letter.job_id.as_deref(), Some("lost-1"));
    assert_eq!(letter.attempts, 2);
    assert_eq!(
        d.producer.status("lost-1").await.unwrap().unwrap().state,
        JobState::Failed
    );
    assert_eq!(
        d.jobs_in_stream_settled(0).await,
        0,
        "deleted from the work queue"
    );
    consumer.shutdown(Duration::from_secs(10)).await.unwrap();
}
