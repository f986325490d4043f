//! A job is answered at most once however many of its deliveries race.
//!
//! Two consumers, X and Y, reach NATS through chaos proxies. X's link holds
//! every chunk 800 ms each way (the fault soak's slowed links), and the
//! ack wait is 2 s: X is still reading the job's status when the ack wait
//! ends. Y's link is stalled until X holds the first delivery (so the
//! server cannot hand that one to Y), then healed, so Y takes the
//! redelivery at once: two deliveries of one message decide, each on its
//! own, whether to answer. The soak found a cancelled job answered by both
//! (issue #51): its record was final already, so no status transition
//! chose between them. Each kind of job whose record ends final (cancelled
//! before it ran, past its deadline, done) is raced here, and each must get
//! exactly one answer while the other delivery is seen and refused.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::Duration;

use sluice_producer::provision::Settings;
use sluice_schemas::names::headers;
use sluice_schemas::{ErrorCode, Input, JobResult, JobState, Outcome};
use sluice_tests::chaos::{ChaosProxy, Link};
use sluice_tests::deploy::Deployment;
use time::OffsetDateTime;

/// Each chunk's delay, each way: a status read takes 1.6-3.2 s, past the
/// 2 s ack wait.
const SLOW: Duration = Duration::from_millis(800);

#[derive(Clone, Copy, Debug)]
enum Kind {
    /// Cancelled while queued: every delivery finds the record final.
    Cancelled,
    /// Pulled after its deadline: each delivery gives up on it.
    Expired,
    /// Run: each delivery that starts it tries to finish it.
    Done,
}

/// Waits until the job's first delivery is held (unacked at the server):
/// only X could pull it.
async fn x_holds_the_job(d: &Deployment) {
    let js = async_nats::jetstream::new(d.servers.nats.connect().await.unwrap());
    let stream = js.get_stream(&d.topology.job_stream).await.unwrap();
    let consumer = d.topology.consumer.clone();
    let held = sluice_tests::read_until(
        Duration::from_secs(20),
        || {
            let stream = stream.clone();
            let consumer = consumer.clone();
            async move {
                stream
                    .consumer_info(&consumer)
                    .await
                    .map_or(0, |i| i.num_ack_pending)
            }
        },
        |&n| n >= 1,
    )
    .await;
    assert_eq!(held, 1, "X never took the job");
}

/// A deployment whose ack wait (2 s) a slowed or stalled consumer outlasts,
/// with the consumers' log lines shown when a test fails (or with
/// --no-capture): which delivery answered and which refused.
async fn race_deployment() -> Deployment {
    let _ = tracing_subscriber::fmt()
        .with_env_filter("sluice_consumer=info")
        .with_test_writer()
        .try_init();
    Deployment::start_with(Settings {
        ack_wait: Duration::from_secs(2),
        max_deliver: 10,
        ..Settings::default()
    })
    .await
    .unwrap()
}

/// Races two deliveries of one job of `kind`; returns every result published
/// for it and how many deliveries the consumers refused to answer.
async fn race(kind: Kind, id: &str) -> (Vec<JobResult>, u64, Option<JobState>) {
    let d = race_deployment().await;
    let upstream: SocketAddr = format!("127.0.0.1:{}", d.servers.nats.port)
        .parse()
        .unwrap();
    let (x_link, y_link) = (
        ChaosProxy::start(upstream).await.unwrap(),
        ChaosProxy::start(upstream).await.unwrap(),
    );
    let mut consumers = Vec::new();
    for proxy in [&x_link, &y_link] {
        consumers.push(
            d.start_consumer_via(&proxy.url(), &["--progress-interval-secs=1"])
                .await
                .unwrap(),
        );
    }
    let mut results = d.producer.subscribe_results().await.unwrap();
    // Y's pulls stop reaching the server; those it has there expire
    // (--pull-expires-ms, 2 s), so the first delivery can only go to X.
    y_link.set(Link::Stalled);
    tokio::time::sleep(Duration::from_secs(3)).await;
    x_link.set(Link::Slow(SLOW));
    let mut job = d.producer.embed_job(
        id,
        vec![Input::Inline {
            items: vec!["the same job, twice at once".into()],
        }],
    );
    match kind {
        Kind::Cancelled => {
            d.producer.submit(&job).await.unwrap();
            assert!(d.producer.cancel(id).await.unwrap());
        }
        Kind::Done => {
            d.producer.submit(&job).await.unwrap();
        }
        Kind::Expired => {
            // Its deadline passed already, and it is published with no
            // Nats-TTL (as a client that sets none would), so the stream
            // keeps delivering it and every delivery refuses it as late.
            job.deadline = Some(OffsetDateTime::now_utc() - time::Duration::seconds(30));
            let js = async_nats::jetstream::new(d.servers.nats.connect().await.unwrap());
            let mut h = async_nats::HeaderMap::new();
            h.insert(headers::MSG_ID, id);
            h.insert(headers::REPLY_TO, d.producer.result_subject(id).as_str());
            js.publish_with_headers(
                d.topology.job_subject("embed"),
                h,
                serde_json::to_vec(&job).unwrap().into(),
            )
            .await
            .unwrap()
            .await
            .unwrap();
        }
    }
    // X holds the first delivery (unacked at the server): Y may pull now.
    x_holds_the_job(&d).await;
    y_link.set(Link::Up);
    // Each status read or write is a round trip of 1.6-3.2 s here, and a
    // delivery makes up to five.
    let left =
        sluice_tests::read_until(Duration::from_secs(60), || d.jobs_in_stream(), |&n| n == 0).await;
    assert_eq!(left, 0, "the job left the stream");
    // The message is gone once one delivery settled it; the other's answer,
    // if it sent one, is at most a few slow hops behind.
    let mut got = Vec::new();
    let until = tokio::time::Instant::now() + Duration::from_secs(15);
    while let Ok(result) = tokio::time::timeout_at(until, results.next_result()).await {
        got.push(result.unwrap());
    }
    // Deliveries after the first that a consumer took up: a race ran.
    let redelivered: u64 = consumers
        .iter()
        .map(|c| c.stats.redeliveries.load(Ordering::Relaxed))
        .sum();
    let refused: u64 = consumers
        .iter()
        .map(|c| c.stats.jobs_already_final.load(Ordering::Relaxed))
        .sum();
    eprintln!(
        "{kind:?}: {} answer(s), {redelivered} redelivery(ies) taken up, {refused} refused",
        got.len()
    );
    assert!(
        redelivered >= 1,
        "the job was not delivered again while its first delivery answered: no race ran"
    );
    let state = d.producer.status(id).await.unwrap().map(|r| r.state);
    x_link.set(Link::Up);
    for consumer in consumers {
        consumer.shutdown(Duration::from_secs(10)).await.unwrap();
    }
    (got, refused, state)
}

/// Races two deliveries of a job of `kind`, then holds it to one answer
/// (an error of `code`, or an output where `None`), the other delivery
/// refused, and its record ended `state`.
async fn answered_once(kind: Kind, code: Option<ErrorCode>, state: JobState) {
    let id = format!("race-{kind:?}").to_lowercase();
    let (answers, refused, ended) = race(kind, &id).await;
    assert_eq!(
        answers.len(),
        1,
        "answered {} times: {answers:?}",
        answers.len()
    );
    let got = match &answers[0].outcome {
        Outcome::Error { error } => Some(error.code),
        Outcome::Ok { .. } => None,
    };
    assert_eq!(got, code, "{:?}", answers[0].outcome);
    assert!(refused >= 1, "the other delivery was not refused");
    assert_eq!(ended, Some(state));
}

#[tokio::test]
async fn a_cancelled_job_delivered_twice_at_once_is_answered_once() {
    answered_once(
        Kind::Cancelled,
        Some(ErrorCode::Cancelled),
        JobState::Cancelled,
    )
    .await;
}

#[tokio::test]
async fn an_expired_job_delivered_twice_at_once_is_answered_once() {
    answered_once(
        Kind::Expired,
        Some(ErrorCode::DeadlineExceeded),
        JobState::Expired,
    )
    .await;
}

#[tokio::test]
async fn a_done_job_delivered_twice_at_once_is_answered_once() {
    answered_once(Kind::Done, None, JobState::Done).await;
}

/// A delivery that lost the race must not touch the answered output. X
/// takes the job and stalls writing its output (its S3 link holds every
/// byte) while its NATS link stalls too, so the ack wait passes; Y runs the
/// redelivery, writes, finishes and answers. Then X's links heal: its write
/// lands and its finish is refused. X serves vectors unnormalized and Y
/// normalized, so the two outputs differ in bytes, as the fault soak's did
/// (there, batches of different composition): the object the answer and
/// the record name must still hold the bytes whose SHA-256 they carry, and
/// the loser's object must not be left behind.
#[tokio::test]
async fn a_stale_delivery_leaves_the_answered_output_alone() {
    let d = race_deployment().await;
    let nats: SocketAddr = format!("127.0.0.1:{}", d.servers.nats.port)
        .parse()
        .unwrap();
    let s3: SocketAddr = format!("127.0.0.1:{}", d.servers.s3.port).parse().unwrap();
    let (x_nats, x_s3, y_nats) = (
        ChaosProxy::start(nats).await.unwrap(),
        ChaosProxy::start(s3).await.unwrap(),
        ChaosProxy::start(nats).await.unwrap(),
    );
    // X: its NATS and its S3 behind proxies, vectors unnormalized.
    let mut x_config = d.consumer_config_via(
        &x_nats.url(),
        &["--progress-interval-secs=1", "--normalize=never"],
    );
    x_config.deployment.s3.s3_endpoint = Some(format!("http://{}", x_s3.addr));
    let x = sluice_consumer::start(x_config).await.unwrap();
    let y = d
        .start_consumer_via(&y_nats.url(), &["--progress-interval-secs=1"])
        .await
        .unwrap();
    let mut results = d.producer.subscribe_results().await.unwrap();
    // Y cannot pull (its pending pulls expire), X cannot write.
    y_nats.set(Link::Stalled);
    x_s3.set(Link::Stalled);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let id = "race-stale-output";
    let mut job = d.producer.embed_job(
        id,
        vec![Input::Inline {
            items: vec!["one job, two outputs".into()],
        }],
    );
    job.output.always_s3 = Some(true);
    d.producer.submit(&job).await.unwrap();
    x_holds_the_job(&d).await;
    // X runs the model (one short text) and reaches its write.
    tokio::time::sleep(Duration::from_secs(2)).await;
    x_nats.set(Link::Stalled);
    y_nats.set(Link::Up);
    let answer = tokio::time::timeout(Duration::from_secs(30), results.next_result())
        .await
        .expect("Y never answered the redelivery")
        .unwrap();
    let left =
        sluice_tests::read_until(Duration::from_secs(20), || d.jobs_in_stream(), |&n| n == 0).await;
    assert_eq!(left, 0, "Y's delivery settled the job");
    // X's write lands now, then its finish is refused.
    x_s3.set(Link::Up);
    x_nats.set(Link::Up);
    let refused = sluice_tests::read_until(
        Duration::from_secs(30),
        || async { x.stats.jobs_already_final.load(Ordering::Relaxed) },
        |&n| n >= 1,
    )
    .await;
    assert_eq!(refused, 1, "X's delivery was not refused");
    let Outcome::Ok {
        output: sluice_schemas::Output::S3(answered),
    } = &answer.outcome
    else {
        panic!("not an S3 output: {:?}", answer.outcome);
    };
    let record = d.producer.status(id).await.unwrap().unwrap();
    assert_eq!(record.state, JobState::Done);
    let recorded = record.output.expect("a done record names its output");
    assert_eq!(recorded.key, answered.key);
    assert_eq!(recorded.sha256, answered.sha256);
    let bytes = d.read_object(&answered.key).await.unwrap();
    assert_eq!(
        hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&bytes)),
        answered.sha256,
        "the object at {} is not the one answered: a stale delivery overwrote it",
        answered.key
    );
    // No more results: X did not answer.
    let extra = tokio::time::timeout(Duration::from_secs(3), results.next_result()).await;
    assert!(extra.is_err(), "answered twice: {extra:?}");
    let keys = d.keys_under(&format!("outputs/{id}")).await.unwrap();
    assert_eq!(
        keys,
        vec![answered.key.clone()],
        "the losing delivery's object is left behind"
    );
    for consumer in [x, y] {
        consumer.shutdown(Duration::from_secs(10)).await.unwrap();
    }
}
