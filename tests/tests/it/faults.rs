//! Faults: S3 down for a while, nats-server restarted, the consumer killed
//! with SIGKILL, and SIGTERM drains. Every job of each run completes, none
//! twice, none lost.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use futures::StreamExt;
use sha2::{Digest, Sha256};
use sluice_producer::provision::Settings;
use sluice_schemas::{Input, JobResult, JobState, Outcome};
use sluice_tests::deploy::Deployment;
use sluice_tests::read_until;

/// Publishes `n` one-text jobs `<prefix>-<i>`.
async fn publish(d: &Deployment, prefix: &str, n: usize) -> Vec<String> {
    let p = &d.producer;
    let ids: Vec<String> = (0..n).map(|i| format!("{prefix}-{i}")).collect();
    let acks = futures::stream::iter(ids.iter())
        .map(|id| async move {
            let job = p.embed_job(
                id,
                vec![Input::Inline {
                    items: vec![format!("{id} text").into()],
                }],
            );
            p.submit(&job).await
        })
        .buffer_unordered(128)
        .collect::<Vec<_>>()
        .await;
    for a in acks {
        a.unwrap();
    }
    ids
}

/// Deliveries `consumers` found already finished (acked, not run again).
fn already_final(consumers: &[&sluice_consumer::Consumer]) -> u64 {
    consumers
        .iter()
        .map(|c| {
            c.stats
                .jobs_already_final
                .load(std::sync::atomic::Ordering::Relaxed)
        })
        .sum()
}

/// Jobs `consumers` have finished between them.
fn jobs_ok(consumers: &[&sluice_consumer::Consumer]) -> u64 {
    consumers
        .iter()
        .map(|c| c.stats.jobs_ok.load(std::sync::atomic::Ordering::Relaxed))
        .sum()
}

/// Waits (up to 300 s) until `consumers` have finished `n` jobs between
/// them: the fault then strikes mid-run.
async fn wait_jobs_ok(consumers: &[&sluice_consumer::Consumer], n: u64) {
    let ok = read_until(
        Duration::from_secs(300),
        || async { jobs_ok(consumers) },
        |got| *got >= n,
    )
    .await;
    assert!(ok >= n, "only {ok} jobs done within 300 s");
}

/// Waits until the job stream is empty and nothing is unacked.
async fn wait_drained(d: &Deployment, timeout: Duration) {
    let until = Instant::now() + timeout;
    loop {
        let pending = async {
            let mut stream = d
                .producer
                .js
                .get_stream(&d.topology.job_stream)
                .await
                .ok()?;
            let messages = stream.info().await.ok()?.state.messages;
            let info = stream.consumer_info(&d.topology.consumer).await.ok()?;
            Some(messages + info.num_ack_pending as u64 + info.num_pending)
        }
        .await;
        if pending == Some(0) {
            return;
        }
        assert!(
            Instant::now() < until,
            "jobs still pending after {timeout:?}: {pending:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Every job is done; with S3 outputs, each object exists and matches its record.
async fn assert_all_done(d: &Deployment, ids: &[String], check_objects: bool) {
    let s3 = d.servers.s3.client();
    let statuses = futures::stream::iter(ids.iter())
        .map(|id| async move { (id, d.producer.status(id).await.unwrap()) })
        .buffer_unordered(64)
        .collect::<Vec<_>>()
        .await;
    for (id, status) in statuses {
        let status = status.unwrap_or_else(|| panic!("{id}: no status"));
        assert_eq!(status.state, JobState::Done, "{id}: {status:?}");
        if check_objects {
            let o = status
                .output
                .unwrap_or_else(|| panic!("{id}: no output location"));
            let body = s3
                .get_object()
                .bucket(&o.bucket)
                .key(&o.key)
                .send()
                .await
                .unwrap();
            let bytes = body.body.collect().await.unwrap().into_bytes();
            assert_eq!(
                hex::encode(Sha256::digest(&bytes)),
                o.sha256,
                "{id}: output differs"
            );
            let (rows, dim, _) = sluice_schemas::npy::decode_f32(&bytes).unwrap();
            assert_eq!((rows, dim), (1, 384), "{id}");
        }
    }
}

/// Collects results in the background until `stop` is sent; returns how many
/// each job got.
fn count_results(
    mut results: sluice_producer::Results,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<HashMap<String, usize>>,
) {
    let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        let mut counts = HashMap::new();
        loop {
            let r: JobResult = tokio::select! {
                r = results.next_result() => match r { Ok(r) => r, Err(_) => break },
                _ = &mut stopped => break,
            };
            assert!(
                matches!(r.outcome, Outcome::Ok { .. }),
                "{:?}: {:?}",
                r.job_id,
                r.outcome
            );
            if std::env::var_os("SLUICE_DEBUG_DUPES").is_some() {
                eprintln!(
                    "result {:?} attempt {} at {} total {:?}",
                    r.job_id, r.attempt, r.finished_at, r.timings_ms.total
                );
            }
            *counts.entry(r.job_id.unwrap_or_default()).or_insert(0) += 1;
        }
        counts
    });
    (stop, task)
}

/// Stops the counter a moment after the last job was acked (results are
/// published before the ack, but travel separately).
async fn final_counts(
    counter: (
        tokio::sync::oneshot::Sender<()>,
        tokio::task::JoinHandle<HashMap<String, usize>>,
    ),
) -> HashMap<String, usize> {
    tokio::time::sleep(Duration::from_secs(1)).await;
    let _ = counter.0.send(());
    counter.1.await.unwrap()
}

fn assert_none_twice(counts: &HashMap<String, usize>) {
    let twice: Vec<_> = counts.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "jobs answered twice: {twice:?}");
}

fn fault_settings() -> Settings {
    Settings {
        max_deliver: 100,
        ack_wait: Duration::from_secs(10),
        ..Settings::default()
    }
}

const FAULT_ARGS: [&str; 4] = [
    "--inline-output-max-bytes=0",
    "--retry-base-ms=200",
    "--retry-max-ms=2000",
    "--progress-interval-secs=3",
];

#[tokio::test]
async fn s3_down_for_10s_mid_run_loses_nothing() {
    let mut d = Deployment::start_with(fault_settings()).await.unwrap();
    let counter = count_results(d.producer.subscribe_results().await.unwrap());
    let ids = publish(&d, "s3o", 2000).await;
    let consumer = d.start_consumer(&FAULT_ARGS).await.unwrap();
    wait_jobs_ok(&[&consumer], 200).await;
    d.servers.s3.stop();
    tokio::time::sleep(Duration::from_secs(10)).await;
    d.servers.s3.restart().await.unwrap();
    wait_drained(&d, Duration::from_secs(600)).await;
    let counts = final_counts(counter).await;
    assert_none_twice(&counts);
    assert_eq!(counts.len(), ids.len(), "every job answered once");
    assert!(
        consumer
            .stats
            .jobs_retried()
            .iter()
            .map(|(_, n)| n)
            .sum::<u64>()
            > 0,
        "the outage caused no retry: it did not happen mid-run"
    );
    assert_all_done(&d, &ids, true).await;
    consumer.shutdown(Duration::from_secs(10)).await.unwrap();
}

#[tokio::test]
async fn nats_restart_mid_run_loses_nothing() {
    let mut d = Deployment::start_with(fault_settings()).await.unwrap();
    let counter = count_results(d.producer.subscribe_results().await.unwrap());
    let ids = publish(&d, "natsr", 2000).await;
    let consumer = d.start_consumer(&FAULT_ARGS).await.unwrap();
    wait_jobs_ok(&[&consumer], 300).await;
    d.servers.nats.restart().await.unwrap();
    wait_drained(&d, Duration::from_secs(600)).await;
    // Results published while the subscriber reconnected are gone (core
    // NATS); the status records are the durable answer.
    assert_all_done(&d, &ids, true).await;
    let counts = final_counts(counter).await;
    assert_none_twice(&counts);
    consumer.shutdown(Duration::from_secs(10)).await.unwrap();
}

#[tokio::test]
async fn sigkill_at_random_moments_loses_nothing() {
    let d = Deployment::start_with(fault_settings()).await.unwrap();
    let ids = publish(&d, "crash", 2000).await;
    let mut consumer = d.spawn_consumer(&FAULT_ARGS).await.unwrap();
    // Pseudo-random but repeatable kill times.
    for (round, wait_ms) in [1700u64, 3100, 2300].into_iter().enumerate() {
        tokio::time::sleep(Duration::from_millis(wait_ms)).await;
        let pid = consumer.pid().unwrap();
        std::process::Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status()
            .unwrap();
        eprintln!("crash round {round}: killed consumer {pid}");
        drop(consumer);
        consumer = d.spawn_consumer(&FAULT_ARGS).await.unwrap();
    }
    wait_drained(&d, Duration::from_secs(600)).await;
    assert_all_done(&d, &ids, true).await;
    let status = consumer.terminate(Duration::from_secs(30));
    assert!(status.is_some_and(|s| s.success()), "{status:?}");
}

#[tokio::test]
async fn sigterm_drains_and_a_second_consumer_finishes_the_rest() {
    let d = Deployment::start_with(fault_settings()).await.unwrap();
    let counter = count_results(d.producer.subscribe_results().await.unwrap());
    let ids = publish(&d, "drain", 600).await;
    let mut first = d
        .spawn_consumer(&["--drain-timeout-secs=3", "--progress-interval-secs=3"])
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let ready = first.get("/readyz").await.unwrap();
    assert_eq!(ready.trim(), "ready");
    let t = Instant::now();
    let status = first.terminate(Duration::from_secs(20));
    let took = t.elapsed();
    assert!(
        status.is_some_and(|s| s.success()),
        "SIGTERM did not exit 0: {status:?}\n{}",
        first.log_tail()
    );
    assert!(
        took < Duration::from_secs(10),
        "drain took {took:?} with a 3 s deadline"
    );
    assert!(first.log().contains("draining"), "{}", first.log_tail());
    let second = d
        .spawn_consumer(&["--progress-interval-secs=3"])
        .await
        .unwrap();
    wait_drained(&d, Duration::from_secs(600)).await;
    assert_all_done(&d, &ids, false).await;
    let counts = final_counts(counter).await;
    assert_none_twice(&counts);
    assert_eq!(counts.len(), ids.len());
    drop(second);
}

#[tokio::test]
async fn stream_leader_killed_mid_run_on_a_three_node_cluster_loses_nothing() {
    let nodes = sluice_tests::start_nats_cluster(3).await.unwrap();
    let settings = Settings {
        replicas: 3,
        ..fault_settings()
    };
    let mut d = Deployment::start_clustered(nodes, settings).await.unwrap();
    let mut stream = d
        .producer
        .js
        .get_stream(&d.topology.job_stream)
        .await
        .unwrap();
    assert_eq!(stream.info().await.unwrap().config.num_replicas, 3);
    let counter = count_results(d.producer.subscribe_results().await.unwrap());
    let ids = publish(&d, "cluster", 2000).await;
    let a = d.start_consumer(&FAULT_ARGS).await.unwrap();
    let b = d.start_consumer(&FAULT_ARGS).await.unwrap();
    let done = || jobs_ok(&[&a, &b]);
    wait_jobs_ok(&[&a, &b], 300).await;
    // Kill the job stream's leader mid-run, then bring it back.
    let info = stream.info().await.unwrap().clone();
    let leader = info
        .cluster
        .and_then(|c| c.leader)
        .expect("an R3 stream has a leader");
    let index: usize = leader.trim_start_matches('n').parse().unwrap();
    eprintln!("killing the stream leader {leader} after {} jobs", done());
    d.nats_node(index).kill();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let during = done();
    d.nats_node(index).restart().await.unwrap();
    eprintln!("restarted {leader}; {during} jobs done by then");
    wait_drained(&d, Duration::from_secs(600)).await;
    assert_all_done(&d, &ids, true).await;
    let counts = final_counts(counter).await;
    assert_none_twice(&counts);
    let dead = d
        .producer
        .dead_letters(&sluice_producer::dlq::Filter::default())
        .await
        .unwrap();
    assert!(dead.is_empty(), "dead letters: {dead:?}");
    // Every job was finished by a consumer: counted when its status write
    // was acknowledged, or, when the leader died between storing that write
    // and acknowledging it, found finished by its redelivery (status first:
    // it is then acked without running or answering twice).
    let settled = done() + already_final(&[&a, &b]);
    assert!(
        settled >= ids.len() as u64,
        "the consumers finished {settled} of {} jobs ({} counted ok)",
        ids.len(),
        done()
    );
    a.shutdown(Duration::from_secs(10)).await.unwrap();
    b.shutdown(Duration::from_secs(10)).await.unwrap();
}

/// A gateway and a consumer started while a three-node cluster elects its
/// leaders (every node killed at once, then restarted: Kubernetes bringing
/// a whole StatefulSet back) come up and serve. Their start-up lookups of
/// the streams and buckets meet a JetStream that has no meta leader yet;
/// before, the gateway exited at once with "not created yet? run `sluice
/// init`" (the fault soak's seed 13), though nothing was missing. Lookups
/// now wait out an election, within a bound, and still fail at once on what
/// is really missing (the next test).
#[tokio::test]
async fn a_gateway_and_a_consumer_started_during_a_cluster_election_come_up_and_serve() {
    let nodes = sluice_tests::start_nats_cluster(3).await.unwrap();
    let settings = Settings {
        replicas: 3,
        ..fault_settings()
    };
    let mut d = Deployment::start_clustered(nodes, settings).await.unwrap();
    for index in 0..3 {
        d.nats_node(index).kill();
    }
    for index in 0..3 {
        d.nats_node(index).restart().await.unwrap();
    }
    let (gateway, consumer) = tokio::join!(
        d.start_gateway("t:sk-t-0123456789", &[]),
        d.start_consumer(&FAULT_ARGS)
    );
    let gateway = gateway.expect("the gateway waits out the election");
    let consumer = consumer.expect("the consumer waits out the election");
    let mut results = d.producer.subscribe_results().await.unwrap();
    let job = d.producer.embed_job(
        "after-election",
        vec![Input::Inline {
            items: vec!["served once the leaders are back".into()],
        }],
    );
    let submitted = read_until(
        Duration::from_secs(60),
        || async { d.producer.submit(&job).await.is_ok() },
        |&ok| ok,
    )
    .await;
    assert!(submitted, "the cluster took no job after its election");
    let result = tokio::time::timeout(Duration::from_secs(60), results.next_result())
        .await
        .expect("no answer after the election")
        .unwrap();
    assert!(
        matches!(result.outcome, Outcome::Ok { .. }),
        "{:?}",
        result.outcome
    );
    gateway.shutdown().await;
    consumer.shutdown(Duration::from_secs(10)).await.unwrap();
}

/// What is really missing is still refused at once, naming the fix: a
/// consumer and a gateway of a namespace nobody ran `sluice init` for.
#[tokio::test]
async fn a_consumer_and_a_gateway_of_a_namespace_never_initialised_fail_at_once_naming_sluice_init()
{
    let d = Deployment::start().await.unwrap();
    let mut config = d.consumer_config(&[]);
    config.deployment.namespace = "never-initialised".into();
    let started = Instant::now();
    let error = match sluice_consumer::start(config).await {
        Ok(_) => panic!("a consumer started on a namespace with no stream"),
        Err(e) => format!("{e:#}"),
    };
    assert!(error.contains("sluice init"), "{error}");
    let mut args = vec!["sluice-gateway".to_string()];
    args.extend(
        d.gateway_args("t:sk-t-0123456789", &[])
            .into_iter()
            .map(|a| {
                if a.starts_with("--namespace=") {
                    "--namespace=never-initialised".into()
                } else {
                    a
                }
            }),
    );
    let error =
        match sluice_gateway::start(<sluice_gateway::Config as clap::Parser>::parse_from(args))
            .await
        {
            Ok(_) => panic!("a gateway started on a namespace with no buckets"),
            Err(e) => format!("{e:#}"),
        };
    assert!(error.contains("sluice init"), "{error}");
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "a missing stream or bucket is not waited for: {:?}",
        started.elapsed()
    );
}
