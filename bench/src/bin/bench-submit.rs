//! Submission throughput: small inline embed jobs published by one `sluice
//! submit --each-line` process and by the library, pipelined (a window of
//! publish acks in flight) against one job at a time (`--window 1`, which is
//! how `submit` ran before), on fresh servers each, rounds interleaved.
//! `bench/submit` runs it. No consumer runs: this is the publisher alone, and
//! every run checks that the stream holds exactly the jobs it reported.
//!
//! With `--cluster` first, the library's two ways run on a fresh 3-node
//! loopback JetStream cluster (stream and status bucket with 3 replicas,
//! as `deploy/nats/sluice-production.toml` has them), each with the nodes
//! fsyncing every write before they ack it (`sync_interval: always`, as
//! `deploy/nats/cluster.conf` ships) and with the server's default (an
//! fsync every two minutes), interleaved: the cost of durability.
//!
//! Usage: bench-submit [--cluster] [JOBS] [ROUNDS] [ONE_AT_A_TIME_JOBS]
#![allow(clippy::unwrap_used, clippy::expect_used)] // a harness: a panic is its report

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use futures::StreamExt;
use sluice_producer::{DEFAULT_SUBMIT_WINDOW, Submission};
use sluice_schemas::Input;
use sluice_tests::deploy::Deployment;

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
enum Way {
    Cli {
        window: usize,
    },
    Library {
        window: usize,
    },
    /// The library on a 3-node cluster, its nodes fsyncing before each ack
    /// (`sync_always`) or on the default interval.
    Cluster {
        window: usize,
        sync_always: bool,
    },
}

impl Way {
    fn label(self) -> String {
        match self {
            Way::Cli { window } => format!("`sluice submit --each-line --window {window}`"),
            Way::Library { window: 1 } => "library, `Producer::submit` in a loop".into(),
            Way::Library { window } => format!("library, `submit_pipelined` window {window}"),
            Way::Cluster {
                window,
                sync_always,
            } => format!(
                "{}, 3 nodes, {}",
                Way::Library { window }.label(),
                if sync_always {
                    "`sync_interval: always`"
                } else {
                    "default sync (2 min)"
                }
            ),
        }
    }

    /// The way this one's ratio is taken against.
    fn baseline(self) -> Way {
        match self {
            Way::Cli { .. } => Way::Cli { window: 1 },
            Way::Library { .. } => Way::Library { window: 1 },
            Way::Cluster { window, .. } => Way::Cluster {
                window,
                sync_always: false,
            },
        }
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    let mut args: Vec<String> = std::env::args().collect();
    let cluster = args.get(1).is_some_and(|a| a == "--cluster");
    if cluster {
        args.remove(1);
    }
    let jobs: usize = args.get(1).map_or(Ok(20_000), |s| s.parse())?;
    let rounds: usize = args.get(2).map_or(Ok(2), |s| s.parse())?;
    let slow_jobs: usize = args.get(3).map_or(Ok(1_000), |s| s.parse())?;
    let cluster_ways = [(DEFAULT_SUBMIT_WINDOW, jobs), (1, slow_jobs)]
        .into_iter()
        .flat_map(|(window, n)| {
            [true, false].map(|sync_always| {
                (
                    Way::Cluster {
                        window,
                        sync_always,
                    },
                    n,
                )
            })
        })
        .collect::<Vec<_>>();
    let single_ways = vec![
        (
            Way::Cli {
                window: DEFAULT_SUBMIT_WINDOW,
            },
            jobs,
        ),
        (Way::Cli { window: 1 }, slow_jobs),
        (
            Way::Library {
                window: DEFAULT_SUBMIT_WINDOW,
            },
            jobs,
        ),
        (Way::Library { window: 1 }, slow_jobs),
    ];
    let ways = if cluster { cluster_ways } else { single_ways };
    let mut runs: HashMap<Way, Vec<f64>> = HashMap::new();
    for round in 1..=rounds {
        for &(way, n) in &ways {
            let secs = one_run(way, n).await?;
            eprintln!(
                "round {round}: {} {n} jobs in {secs:.2} s ({:.0} jobs/s)",
                way.label(),
                n as f64 / secs
            );
            runs.entry(way).or_default().push(secs);
        }
    }
    println!(
        "small inline embed jobs (one text each), no consumer; median of {rounds} interleaved round(s)"
    );
    let versus = if cluster {
        "vs default sync"
    } else {
        "vs one at a time"
    };
    println!("| publisher | jobs | seconds | jobs/s | {versus} |");
    println!("| --- | ---: | ---: | ---: | ---: |");
    let rate = |way: Way, n: usize| {
        let mut v = runs.get(&way).cloned().unwrap_or_default();
        v.sort_by(f64::total_cmp);
        let secs = v.get(v.len() / 2).copied().unwrap_or(f64::NAN);
        (secs, n as f64 / secs)
    };
    for &(way, n) in &ways {
        let (secs, r) = rate(way, n);
        let base_way = way.baseline();
        let base_n = ways
            .iter()
            .find(|(w, _)| *w == base_way)
            .map_or(n, |(_, n)| *n);
        let base = rate(base_way, base_n).1;
        println!(
            "| {} | {n} | {secs:.2} | {r:.0} | {:.2}x |",
            way.label(),
            r / base
        );
    }
    Ok(())
}

/// Fresh servers, then `n` jobs one way; timed from the first publish (or the
/// CLI's start) to the last ack.
async fn one_run(way: Way, n: usize) -> Result<f64> {
    let d = match way {
        Way::Cluster { sync_always, .. } => {
            let jetstream = if sync_always {
                "jetstream { sync_interval: always }"
            } else {
                ""
            };
            let nodes = sluice_tests::start_nats_cluster_with(3, jetstream, "").await?;
            for node in &nodes {
                ensure!(
                    node.syncs_always().await? == sync_always,
                    "sync_always not as asked"
                );
            }
            let settings = sluice_producer::provision::Settings {
                replicas: 3,
                ..Default::default()
            };
            Deployment::start_clustered(nodes, settings).await?
        }
        _ => Deployment::start().await?,
    };
    let texts: Vec<String> = (0..n)
        .map(|i| format!("job {i}: a short text to embed, submitted on its own"))
        .collect();
    let secs = match way {
        Way::Cli { window } => {
            let dir = tempfile::tempdir()?;
            let file = dir.path().join("jobs.jsonl");
            std::fs::write(&file, sluice_tests::fixtures::jsonl(&texts))?;
            let window = window.to_string();
            let start = Instant::now();
            let run = d
                .cli(
                    &[
                        "submit",
                        "--json",
                        "--each-line",
                        "--window",
                        &window,
                        file.to_str().context("path")?,
                    ],
                    None,
                    Duration::from_secs(1800),
                )
                .await;
            let secs = start.elapsed().as_secs_f64();
            ensure!(run.code == Some(0), "sluice submit failed: {}", run.stderr);
            let reported = run
                .json_lines()
                .iter()
                .filter(|l| l["event"] == "submitted")
                .count();
            ensure!(reported == n, "{reported} of {n} jobs reported submitted");
            secs
        }
        Way::Library { window } | Way::Cluster { window, .. } => {
            let jobs: Vec<_> = texts
                .iter()
                .enumerate()
                .map(|(i, t)| {
                    let job = d.producer.job(
                        sluice_schemas::Task::Embed,
                        &format!("lib-{i}"),
                        vec![Input::Inline {
                            items: vec![t.as_str().into()],
                        }],
                    );
                    Submission::new(&d.producer, job, None)
                })
                .collect();
            let start = Instant::now();
            if window == 1 {
                for s in &jobs {
                    d.producer
                        .submit_with(&s.job, &s.reply_to, s.traceparent.as_deref())
                        .await?;
                }
            } else {
                let mut acks = d.producer.submit_pipelined(jobs, window).await?;
                while let Some(s) = acks.next().await {
                    s.ack?;
                }
            }
            start.elapsed().as_secs_f64()
        }
    };
    let stored = d.jobs_in_stream().await;
    ensure!(
        stored == n as u64,
        "the stream holds {stored} jobs, {n} were submitted"
    );
    Ok(secs)
}
