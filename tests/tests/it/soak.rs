//! The fault soak (issue #39), in the style of Jepsen: a steady workload of
//! jobs with unique ids against a 3-node JetStream cluster that fsyncs
//! before it acknowledges (`sync_interval: always`, as
//! `deploy/nats/cluster.conf` ships), while a nemesis on a seeded random
//! schedule kills and pauses consumers, kills one, two and all three NATS
//! nodes, takes S3 down, kills the gateway mid-batch and slows, stalls and
//! cuts the links between consumers and NATS (a TCP proxy of ours in front
//! of each node: a partition the consumer sees and the servers do not).
//! Then everything heals, the queue drains, and the checker holds every
//! acknowledged job to exactly one terminal state that its status record,
//! its answer, its output object and the dead-letter stream all agree on.
//!
//! `SOAK_SECS` (default 150) sets how long faults are injected (each kind
//! once per round of ten, in a seeded order), `SOAK_SEED` (default 39) the
//! schedule. Everything runs on loopback,
//! every process is ours and killed by its PID, and the whole run stops by
//! itself: the heal and drain are bounded too.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use sluice_producer::Producer;
use sluice_producer::provision::Settings;
use sluice_schemas::{ErrorCode, Input, JobResult, JobState, Outcome, Output, StatusRecord, Task};
use sluice_tests::api::Api;
use sluice_tests::chaos::{ChaosProxy, Link};
use sluice_tests::deploy::{ConsumerProcess, Deployment, GatewayProcess};

const KEY: &str = "sk-soak-0123456789abcdef";
const KEYS: &str = "soak:sk-soak-0123456789abcdef";
const GENERATE_MODEL: &str = "smollm2-135m-instruct";
const DIM: usize = 384;

/// splitmix64: the schedule and the workload's choices repeat with the seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// A duration between `lo` and `hi` seconds.
    fn secs(&mut self, lo: f64, hi: f64) -> Duration {
        Duration::from_secs_f64(lo + (hi - lo) * (self.next() % 10_000) as f64 / 10_000.0)
    }
}

/// What a job is, and so which terminal states it may end in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Kind {
    /// Texts inline: done.
    Embed,
    /// Texts in a JSONL object in S3 behind a presigned URL: done.
    EmbedFromS3,
    /// A prompt: done.
    Generate,
    /// An embed job with a deadline a few seconds off: done or expired.
    Deadline,
    /// Cancelled right after its ack: cancelled, or done if it finished first.
    Cancelled,
    /// A text over the model's limit with `truncate: false`: failed
    /// (`item_too_long`) and dead-lettered.
    BadEmbed,
    /// An empty prompt: failed (`input_invalid`) and dead-lettered.
    BadGenerate,
}

impl Kind {
    fn task(self) -> Task {
        match self {
            Kind::Generate | Kind::BadGenerate => Task::Generate,
            _ => Task::Embed,
        }
    }
}

/// What the workload knows of one job it published.
struct Sent {
    kind: Kind,
    items: usize,
    /// The stream acknowledged a publish of it (one of up to five tries).
    acked: bool,
    sent_at: SystemTime,
    /// For [`Kind::Cancelled`]: what the cancel said (`None`: it failed).
    cancelled: Option<bool>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Fault {
    ConsumerKilled,
    ConsumerPaused,
    OneNatsNodeKilled,
    TwoNatsNodesKilled,
    AllNatsNodesKilled,
    S3Down,
    GatewayKilled,
    LinkSlow,
    LinkStalled,
    LinkCut,
}

const FAULTS: [Fault; 10] = [
    Fault::ConsumerKilled,
    Fault::ConsumerPaused,
    Fault::OneNatsNodeKilled,
    Fault::TwoNatsNodesKilled,
    Fault::AllNatsNodesKilled,
    Fault::S3Down,
    Fault::GatewayKilled,
    Fault::LinkSlow,
    Fault::LinkStalled,
    Fault::LinkCut,
];

struct Window {
    fault: Fault,
    from: SystemTime,
    to: SystemTime,
}

/// Everything the workload saw, for the checker.
#[derive(Default)]
struct Ledger {
    jobs: BTreeMap<String, Sent>,
    /// Every result message received, by job id.
    answers: HashMap<String, Vec<JobResult>>,
    /// Online requests through the gateway, by how they ended.
    online: BTreeMap<String, u64>,
    /// Batches created through the gateway, with their lines' count.
    batches: Vec<(String, usize)>,
    /// Batch creations the gateway refused or could not take (the client's
    /// to retry), by why.
    batches_refused: BTreeMap<String, u64>,
    windows: Vec<Window>,
}

type Shared = Arc<Mutex<Ledger>>;

fn lock(ledger: &Shared) -> std::sync::MutexGuard<'_, Ledger> {
    ledger.lock().unwrap_or_else(|e| e.into_inner())
}

fn soak_secs() -> u64 {
    std::env::var("SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(150)
}

fn soak_seed() -> u64 {
    std::env::var("SOAK_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(39)
}

/// One consumer process and the proxies between it and the three nodes;
/// the proxies outlive the processes they serve.
struct Slot {
    name: &'static str,
    proxies: Vec<ChaosProxy>,
    args: Vec<&'static str>,
    process: Option<ConsumerProcess>,
    /// Killed processes, kept for their logs.
    retired: Vec<ConsumerProcess>,
    /// Budget overruns seen in its /metrics.
    overruns: Vec<String>,
}

impl Slot {
    fn urls(&self) -> String {
        self.proxies
            .iter()
            .map(ChaosProxy::url)
            .collect::<Vec<_>>()
            .join(",")
    }

    async fn spawn(&mut self, d: &Deployment) {
        let mut last = None;
        for _ in 0..3 {
            match d.spawn_consumer_at(&self.urls(), &self.args, &[]).await {
                Ok(p) => {
                    self.process = Some(p);
                    return;
                }
                Err(e) => last = Some(e),
            }
        }
        panic!("the {} consumer did not come back: {last:?}", self.name);
    }

    /// Reads the budget's peak from its /metrics; an overrun is recorded.
    async fn check_budget(&mut self) {
        let Some(p) = &self.process else { return };
        let Ok(text) = p.get("/metrics").await else {
            return;
        };
        let budget = sluice_tests::prometheus_value(&text, "sluice_budget_bytes");
        let peak = sluice_tests::prometheus_value(&text, "sluice_budget_reserved_peak_bytes");
        if let (Some(budget), Some(peak)) = (budget, peak)
            && peak > budget
        {
            self.overruns
                .push(format!("{}: peak {peak} > budget {budget}", self.name));
        }
    }

    fn set_links(&self, link: Link) {
        for p in &self.proxies {
            p.set(link);
        }
    }
}

const CONSUMER_ARGS: [&str; 5] = [
    "--inline-output-max-bytes=0",
    "--retry-base-ms=200",
    "--retry-max-ms=2000",
    "--progress-interval-secs=2",
    "--max-batch-tokens=1024",
];

#[tokio::test]
async fn fault_soak_loses_nothing_and_answers_nothing_twice() {
    let secs = soak_secs();
    let seed = soak_seed();
    eprintln!("soak: {secs} s of faults, seed {seed} (SOAK_SECS, SOAK_SEED)");
    let nodes = sluice_tests::start_nats_cluster_with(
        3,
        "jetstream { sync_interval: always }",
        "no_advertise: true",
    )
    .await
    .unwrap();
    for n in &nodes {
        assert!(
            n.syncs_always().await.unwrap(),
            "the soak runs on nodes that fsync before they ack"
        );
    }
    let settings = Settings {
        replicas: 3,
        max_deliver: 100,
        ack_wait: Duration::from_secs(6),
        ..Settings::default()
    };
    let mut d = Deployment::start_clustered(nodes, settings).await.unwrap();

    // Three consumers, each behind its own three proxies.
    let mut slots = Vec::new();
    for (name, task_args) in [
        ("embed-a", vec![]),
        ("embed-b", vec![]),
        (
            "generate",
            vec![
                "--task=generate",
                "--max-new-tokens=16",
                "--max-items-per-job=8",
                "--max-prompt-tokens=128",
            ],
        ),
    ] {
        let mut proxies = Vec::new();
        for i in 0..3 {
            let upstream: SocketAddr = format!("127.0.0.1:{}", d.nats_node(i).port)
                .parse()
                .unwrap();
            proxies.push(ChaosProxy::start(upstream).await.unwrap());
        }
        let mut args: Vec<&'static str> = CONSUMER_ARGS.to_vec();
        args.extend(task_args);
        let mut slot = Slot {
            name,
            proxies,
            args,
            process: None,
            retired: Vec::new(),
            overruns: Vec::new(),
        };
        slot.spawn(&d).await;
        slots.push(slot);
    }
    let gateway_args = [
        "--chunk-lines=20",
        "--lease-secs=3",
        "--online-deadline-secs=20",
        "--online-grace-secs=10",
    ];
    let mut gateway: Option<GatewayProcess> =
        Some(d.spawn_gateway(KEYS, &gateway_args).await.unwrap());
    let gateway_addr = Arc::new(Mutex::new(gateway.as_ref().unwrap().addr));
    let mut gateways_retired: Vec<GatewayProcess> = Vec::new();

    // The workload: its own connections, as publishers have.
    let ledger: Shared = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let producer = Arc::new(Producer::connect(&d.producer.config).await.unwrap());
    let listener = tokio::spawn(listen(
        d.producer.subscribe_results().await.unwrap(),
        Arc::clone(&ledger),
    ));
    let workload = vec![
        tokio::spawn(publish_jobs(
            Arc::clone(&producer),
            Arc::clone(&ledger),
            Arc::clone(&stop),
            seed,
        )),
        tokio::spawn(online_requests(
            Arc::clone(&gateway_addr),
            Arc::clone(&ledger),
            Arc::clone(&stop),
        )),
        tokio::spawn(batches(
            Arc::clone(&gateway_addr),
            Arc::clone(&ledger),
            Arc::clone(&stop),
        )),
    ];

    // The nemesis: one fault at a time, held, healed, then a quiet spell.
    let mut rng = Rng(seed ^ 0x5EED);
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs(5)).await;
    // Every kind once per round of ten, in a seeded order: a run of 150 s
    // (about 15 faults) sees each kind.
    let mut deck: Vec<Fault> = Vec::new();
    while started.elapsed() < Duration::from_secs(secs) {
        if deck.is_empty() {
            deck = FAULTS.to_vec();
            for i in (1..deck.len()).rev() {
                deck.swap(i, rng.below(i + 1));
            }
        }
        let fault = deck.pop().unwrap();
        let from = SystemTime::now();
        let hold = rng.secs(2.0, 10.0);
        eprintln!(
            "[{:>4.0} s] {fault:?} for {:.1} s",
            started.elapsed().as_secs_f64(),
            hold.as_secs_f64()
        );
        match fault {
            Fault::ConsumerKilled => {
                let slot = &mut slots[rng.below(3)];
                slot.check_budget().await;
                if let Some(mut p) = slot.process.take() {
                    p.kill();
                    slot.retired.push(p);
                }
                tokio::time::sleep(hold).await;
                slot.spawn(&d).await;
            }
            Fault::ConsumerPaused => {
                let slot = &slots[rng.below(3)];
                let p = slot.process.as_ref().unwrap();
                p.pause();
                tokio::time::sleep(hold).await;
                p.resume();
            }
            Fault::OneNatsNodeKilled => {
                let i = rng.below(3);
                d.nats_node(i).kill();
                tokio::time::sleep(hold).await;
                d.nats_node(i).restart().await.unwrap();
            }
            Fault::TwoNatsNodesKilled => {
                let spared = rng.below(3);
                let killed: Vec<usize> = (0..3).filter(|&i| i != spared).collect();
                for &i in &killed {
                    d.nats_node(i).kill();
                }
                tokio::time::sleep(hold).await;
                for &i in &killed {
                    d.nats_node(i).restart().await.unwrap();
                }
            }
            Fault::AllNatsNodesKilled => {
                for i in 0..3 {
                    d.nats_node(i).kill();
                }
                tokio::time::sleep(hold.min(Duration::from_secs(4))).await;
                for i in 0..3 {
                    d.nats_node(i).restart().await.unwrap();
                }
            }
            Fault::S3Down => {
                d.servers.s3.stop();
                tokio::time::sleep(hold).await;
                d.servers.s3.restart().await.unwrap();
            }
            Fault::GatewayKilled => {
                if let Some(mut g) = gateway.take() {
                    g.kill();
                    gateways_retired.push(g);
                }
                tokio::time::sleep(hold.min(Duration::from_secs(3))).await;
                let g = d.spawn_gateway(KEYS, &gateway_args).await.unwrap();
                *gateway_addr.lock().unwrap() = g.addr;
                gateway = Some(g);
            }
            Fault::LinkSlow | Fault::LinkStalled | Fault::LinkCut => {
                let slot = &slots[rng.below(3)];
                slot.set_links(match fault {
                    Fault::LinkSlow => Link::Slow(rng.secs(0.05, 0.4)),
                    Fault::LinkStalled => Link::Stalled,
                    _ => Link::Down,
                });
                tokio::time::sleep(hold).await;
                slot.set_links(Link::Up);
            }
        }
        lock(&ledger).windows.push(Window {
            fault,
            from,
            to: SystemTime::now(),
        });
        tokio::time::sleep(rng.secs(2.0, 6.0)).await;
    }

    // Heal: the workload stops, everything is up (each fault healed itself),
    // and the queue drains.
    stop.store(true, Ordering::Relaxed);
    for task in workload {
        task.await.unwrap();
    }
    eprintln!(
        "[{:>4.0} s] faults over; draining",
        started.elapsed().as_secs_f64()
    );
    wait_drained(&d, Duration::from_secs(120), Duration::from_secs(1800)).await;
    let api = Api::new(gateway.as_ref().unwrap().addr);
    let batches = lock(&ledger).batches.clone();
    let batch_report = check_batches(&api, &batches).await;
    // Results are published before the ack; give the last ones a moment.
    tokio::time::sleep(Duration::from_secs(2)).await;
    listener.abort();
    for slot in &mut slots {
        slot.check_budget().await;
    }

    let ledger = std::mem::take(&mut *lock(&ledger));
    let report = check(&d, &ledger).await;
    print_report(&ledger, &report, &batch_report, secs, seed);
    let overruns: Vec<&String> = slots.iter().flat_map(|s| &s.overruns).collect();
    let problems: Vec<&String> = report
        .anomalies
        .iter()
        .map(|a| &a.what)
        .chain(&batch_report.problems)
        .chain(overruns.iter().copied())
        .collect();
    for p in problems.iter().take(40) {
        eprintln!("  {p}");
    }
    if !problems.is_empty() {
        // Every process's log, for the post-mortem.
        let dir = sluice_tests::repo_root().join(format!("target/soak-{seed}"));
        let _ = std::fs::create_dir_all(&dir);
        for slot in &slots {
            for (i, p) in slot.retired.iter().chain(&slot.process).enumerate() {
                let _ = std::fs::write(dir.join(format!("{}-{i}.log", slot.name)), p.log());
            }
        }
        for (i, g) in gateways_retired.iter().chain(&gateway).enumerate() {
            let _ = std::fs::write(dir.join(format!("gateway-{i}.log")), g.log());
        }
        eprintln!("logs in {}", dir.display());
    }
    assert!(
        problems.is_empty(),
        "{} anomalies (above; seed {seed})",
        problems.len()
    );
    let online_hung = ledger.online.get("no answer").copied().unwrap_or(0)
        + ledger.online.get("wrong answer").copied().unwrap_or(0);
    assert_eq!(online_hung, 0, "online requests: {:?}", ledger.online);
    assert!(
        report.by_state.get("Done").copied().unwrap_or(0) > 0,
        "the soak did no work: {:?}",
        report.by_state
    );
    for slot in &mut slots {
        if let Some(p) = slot.process.as_mut() {
            p.terminate(Duration::from_secs(10));
        }
    }
}

/// Records every result message (core NATS: one missed while the listener's
/// own connection is down is counted apart, and the status record still
/// holds the outcome).
async fn listen(mut results: sluice_producer::Results, ledger: Shared) {
    while let Ok(r) = results.next_result().await {
        let Some(id) = r.job_id.clone() else { continue };
        lock(&ledger).answers.entry(id).or_default().push(r);
    }
}

/// Publishes about 8 embed and one generate job a second, each kind in its
/// share, until `stop`. Each publish is tried up to five times, a second
/// apart, under the same id (a duplicate is dropped by the stream), as a
/// publisher should.
async fn publish_jobs(producer: Arc<Producer>, ledger: Shared, stop: Arc<AtomicBool>, seed: u64) {
    let mut rng = Rng(seed);
    let mut tasks = tokio::task::JoinSet::new();
    let mut n = 0u64;
    let mut tick = tokio::time::interval(Duration::from_millis(110));
    while !stop.load(Ordering::Relaxed) {
        tick.tick().await;
        n += 1;
        let kind = match rng.below(100) {
            0..=54 => Kind::Embed,
            55..=62 => Kind::EmbedFromS3,
            63..=74 => Kind::Generate,
            75..=82 => Kind::Deadline,
            83..=89 => Kind::Cancelled,
            90..=94 => Kind::BadEmbed,
            _ => Kind::BadGenerate,
        };
        let id = format!("soak-{n}");
        let items = 1 + rng.below(3);
        let delay = rng.secs(0.0, 0.3);
        let producer = Arc::clone(&producer);
        let ledger = Arc::clone(&ledger);
        tasks.spawn(async move {
            let Some(job) = make_job(&producer, &id, kind, items).await else {
                *lock(&ledger)
                    .online
                    .entry("job input not uploaded".into())
                    .or_default() += 1;
                return;
            };
            lock(&ledger).jobs.insert(
                id.clone(),
                Sent {
                    kind,
                    items,
                    acked: false,
                    sent_at: SystemTime::now(),
                    cancelled: None,
                },
            );
            let mut acked = false;
            for _ in 0..5 {
                match producer.submit(&job).await {
                    Ok(_) => {
                        acked = true;
                        break;
                    }
                    Err(_) => tokio::time::sleep(Duration::from_secs(1)).await,
                }
            }
            lock(&ledger).jobs.get_mut(&id).unwrap().acked = acked;
            if acked && kind == Kind::Cancelled {
                tokio::time::sleep(delay).await;
                let said = producer.cancel(&id).await.ok();
                lock(&ledger).jobs.get_mut(&id).unwrap().cancelled = said;
            }
        });
        while tasks.try_join_next().is_some() {}
    }
    while tasks.join_next().await.is_some() {}
}

async fn make_job(
    producer: &Producer,
    id: &str,
    kind: Kind,
    items: usize,
) -> Option<sluice_schemas::Job> {
    let texts: Vec<Value> = (0..items)
        .map(|i| json!(format!("{id} text {i}: the soak keeps the queue busy")))
        .collect();
    let mut job = match kind {
        Kind::EmbedFromS3 => {
            let body: Vec<u8> = texts
                .iter()
                .flat_map(|t| format!("{t}\n").into_bytes())
                .collect();
            let mut input = None;
            for _ in 0..5 {
                match producer
                    .upload_input(&format!("{id}.jsonl"), body.clone())
                    .await
                {
                    Ok(i) => {
                        input = Some(i);
                        break;
                    }
                    Err(_) => tokio::time::sleep(Duration::from_secs(1)).await,
                }
            }
            producer.job(Task::Embed, id, vec![input?])
        }
        Kind::Generate => {
            let prompts = (0..items)
                .map(|i| json!(format!("Count to five, attempt {i}:")))
                .collect();
            producer.job(Task::Generate, id, vec![Input::Inline { items: prompts }])
        }
        Kind::BadGenerate => producer.job(
            Task::Generate,
            id,
            vec![Input::Inline {
                items: vec![json!("")],
            }],
        ),
        Kind::BadEmbed => {
            let mut job = producer.job(
                Task::Embed,
                id,
                vec![Input::Inline {
                    items: vec![json!("word ".repeat(600))],
                }],
            );
            job.parameters.encoder.truncate = Some(false);
            job
        }
        Kind::Embed | Kind::Deadline | Kind::Cancelled => {
            producer.job(Task::Embed, id, vec![Input::Inline { items: texts }])
        }
    };
    if kind.task() == Task::Generate {
        job.model = GENERATE_MODEL.into();
        job.parameters.generate.max_new_tokens = Some(6);
    }
    if kind == Kind::Deadline {
        job.deadline = Some(time::OffsetDateTime::now_utc() + time::Duration::seconds(4));
    }
    Some(job)
}

/// Online embeddings through whichever gateway is up, two a second, each
/// answered or refused with a status; one that gets no answer at all is
/// a failure.
async fn online_requests(addr: Arc<Mutex<SocketAddr>>, ledger: Shared, stop: Arc<AtomicBool>) {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    let mut tasks = tokio::task::JoinSet::new();
    let mut n = 0;
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    while !stop.load(Ordering::Relaxed) {
        tick.tick().await;
        n += 1;
        let url = format!("http://{}/v1/embeddings", *addr.lock().unwrap());
        let req = http
            .post(url)
            .bearer_auth(KEY)
            .header("content-type", "application/json")
            .body(json!({"model": "all-minilm-l6-v2", "input": format!("online {n}")}).to_string());
        let ledger = Arc::clone(&ledger);
        tasks.spawn(async move {
            let how = match req.send().await {
                Ok(resp) => {
                    let status = resp.status().as_u16();
                    let body: Value = match resp.bytes().await {
                        Ok(b) => serde_json::from_slice(&b).unwrap_or(Value::Null),
                        Err(_) => Value::Null,
                    };
                    let dim = body["data"][0]["embedding"].as_array().map(Vec::len);
                    match status {
                        200 if dim == Some(DIM) => "ok".to_string(),
                        200 => "wrong answer".to_string(),
                        s if body["error"]["message"].is_string() => format!("http {s}"),
                        s => format!("http {s} without an error body"),
                    }
                }
                Err(e) if e.is_timeout() => "no answer".to_string(),
                Err(_) => "gateway unreachable".to_string(),
            };
            *lock(&ledger).online.entry(how).or_default() += 1;
        });
        while tasks.try_join_next().is_some() {}
    }
    while tasks.join_next().await.is_some() {}
}

/// A 100-line embeddings batch every 15 s, so a gateway killed mid-batch
/// has batches to leave behind.
async fn batches(addr: Arc<Mutex<SocketAddr>>, ledger: Shared, stop: Arc<AtomicBool>) {
    let mut n = 0;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        let lines: Vec<u8> = (0..100)
            .flat_map(|i| {
                let line = json!({"custom_id": format!("b{n}-{i}"), "method": "POST", "url": "/v1/embeddings",
                    "body": {"model": "all-minilm-l6-v2", "input": format!("batch {n} line {i}")}});
                format!("{line}\n").into_bytes()
            })
            .collect();
        let api = Api::new(*addr.lock().unwrap());
        let created = async {
            let (status, file) = api.try_upload(KEY, &lines).await.map_err(|e| format!("upload: {e}"))?;
            if status != 200 {
                return Err(format!("upload: http {status}"));
            }
            let (status, batch) = api
                .try_post("/batches", KEY, json!({"input_file_id": file["id"], "endpoint": "/v1/embeddings", "completion_window": "24h"}))
                .await
                .map_err(|e| format!("create: {e}"))?;
            if status != 200 {
                return Err(format!("create: http {status}"));
            }
            Ok(batch["id"].as_str().unwrap_or_default().to_string())
        }
        .await;
        match created {
            Ok(id) => lock(&ledger).batches.push((id, 100)),
            Err(why) => *lock(&ledger).batches_refused.entry(why).or_default() += 1,
        }
        for _ in 0..30 {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

#[derive(Default)]
struct BatchReport {
    completed: usize,
    lines: usize,
    problems: Vec<String>,
}

/// Every batch completed with each line answered once, a vector of the
/// model's size each.
async fn check_batches(api: &Api, batches: &[(String, usize)]) -> BatchReport {
    let mut report = BatchReport::default();
    for (id, lines) in batches {
        let b = match api.wait_for(KEY, id, Duration::from_secs(240)).await {
            Ok(b) => b,
            Err(b) => {
                report.problems.push(format!("batch {id} not final: {b}"));
                continue;
            }
        };
        if b["status"] != "completed"
            || b["request_counts"] != json!({"total": lines, "completed": lines, "failed": 0})
        {
            report.problems.push(format!(
                "batch {id} ended {}: {}",
                b["status"], b["request_counts"]
            ));
            continue;
        }
        let output = api.content(KEY, &b["output_file_id"]).await;
        let mut seen = HashSet::new();
        for l in &output {
            let custom = l["custom_id"].as_str().unwrap_or_default().to_string();
            let dim = l["response"]["body"]["data"][0]["embedding"]
                .as_array()
                .map(Vec::len);
            if !seen.insert(custom.clone()) {
                report
                    .problems
                    .push(format!("batch {id}: {custom} answered twice"));
            }
            if l["response"]["status_code"] != 200 || dim != Some(DIM) {
                report
                    .problems
                    .push(format!("batch {id}: {custom} answered {l}"));
            }
        }
        if seen.len() != *lines {
            report.problems.push(format!(
                "batch {id}: {} of {lines} lines answered",
                seen.len()
            ));
        }
        report.completed += 1;
        report.lines += seen.len();
    }
    report
}

/// Waits until the job stream is empty (a work queue, it holds a job until
/// the job is acked), for as long as it keeps shrinking: it gives up when
/// it has not for `stall`, or after `cap`. A long run under load ends with
/// a backlog the consumers work off at their pace (a 30-minute run at seed
/// 778 on two loaded cores left 258 generate jobs queued when a fixed
/// 300 s drain ended, still being taken); a backlog that drains is not a
/// lost job, one that stops draining is.
async fn wait_drained(d: &Deployment, stall: Duration, cap: Duration) {
    let started = Instant::now();
    let mut left = d.try_jobs_in_stream().await;
    let (first, mut fewest, mut shrank_at) = (left, left, Instant::now());
    while started.elapsed() < cap && shrank_at.elapsed() < stall {
        if left == Some(0) {
            eprintln!(
                "drained {} job(s) in {:.0} s",
                first.unwrap_or(0),
                started.elapsed().as_secs_f64()
            );
            return;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        left = d.try_jobs_in_stream().await;
        if left.is_some() && (fewest.is_none() || left < fewest) {
            (fewest, shrank_at) = (left, Instant::now());
        }
    }
    eprintln!(
        "the queue did not drain: {left:?} left of {first:?} after {:.0} s, none taken in the last {:.0} s",
        started.elapsed().as_secs_f64(),
        shrank_at.elapsed().as_secs_f64()
    );
    if let Ok(mut stream) = d.producer.js.get_stream(&d.topology.job_stream).await
        && let Ok(info) = stream.info().await
    {
        let state = info.state.clone();
        let mut ids = Vec::new();
        for seq in state.first_sequence..=state.last_sequence.min(state.first_sequence + 200) {
            if let Ok(m) = stream.get_raw_message(seq).await {
                ids.push(format!(
                    "{seq}:{}:{}",
                    m.subject,
                    String::from_utf8_lossy(&m.payload)
                        .chars()
                        .take(60)
                        .collect::<String>()
                ));
            }
        }
        eprintln!("left in the stream: {ids:#?}");
        let mut consumers = stream.consumers();
        use futures::StreamExt;
        while let Some(Ok(c)) = consumers.next().await {
            eprintln!(
                "durable {}: pending {}, ack pending {}, redelivered {}, waiting {}",
                c.name, c.num_pending, c.num_ack_pending, c.num_redelivered, c.num_waiting
            );
        }
    }
}

#[derive(Debug)]
struct Anomaly {
    /// lost, duplicated or inconsistent.
    class: &'static str,
    job_id: String,
    what: String,
}

#[derive(Default)]
struct Report {
    by_state: BTreeMap<String, u64>,
    by_kind: BTreeMap<Kind, u64>,
    unacked: u64,
    /// Done jobs whose result message the listener did not see (core NATS
    /// while its connection was down): their outcome is in the status
    /// record and the output object.
    answers_missed: u64,
    anomalies: Vec<Anomaly>,
    /// When each anomalous job was in flight (for the table by fault).
    spans: HashMap<String, (SystemTime, SystemTime)>,
}

async fn check(d: &Deployment, ledger: &Ledger) -> Report {
    let mut report = Report::default();
    let letters = d
        .producer
        .dead_letters(&sluice_producer::dlq::Filter::default())
        .await
        .unwrap();
    let mut dead: HashMap<String, Vec<ErrorCode>> = HashMap::new();
    for (_, letter) in letters {
        if let Some(id) = letter.job_id {
            dead.entry(id).or_default().push(letter.error.code);
        }
    }
    let now = SystemTime::now();
    for (id, sent) in &ledger.jobs {
        let answers = ledger.answers.get(id).map(Vec::as_slice).unwrap_or(&[]);
        let letters = dead.get(id).map(Vec::as_slice).unwrap_or(&[]);
        if !sent.acked {
            report.unacked += 1;
            // Stored or not, it must not be answered twice.
            if answers.len() > 1 || letters.len() > 1 {
                let what = format!(
                    "unacked job answered {} times, dead-lettered {} times",
                    answers.len(),
                    letters.len()
                );
                anomaly(&mut report, "duplicated", id, sent, now, what);
            }
            continue;
        }
        *report.by_kind.entry(sent.kind).or_default() += 1;
        let Some(status) = read_status(d, id).await else {
            let what = format!(
                "acked job has no status record ({} answers, dead letters {letters:?})",
                answers.len()
            );
            anomaly(&mut report, "lost", id, sent, now, what);
            continue;
        };
        *report
            .by_state
            .entry(format!("{:?}", status.state))
            .or_default() += 1;
        let output = match (&status.state, &status.output) {
            (JobState::Done, Some(out)) => Some(read_output(d, out).await),
            _ => None,
        };
        let verdict = judge(sent, &status, answers, letters, output);
        report.answers_missed += u64::from(verdict.answer_missed);
        for (class, what) in verdict.anomalies {
            anomaly(&mut report, class, id, sent, status.updated_at.into(), what);
        }
    }
    report
}

/// The bytes of a done job's output, or why they cannot be read.
async fn read_output(d: &Deployment, out: &sluice_schemas::S3Output) -> Result<Vec<u8>, String> {
    let object = d
        .servers
        .s3
        .client()
        .get_object()
        .bucket(&out.bucket)
        .key(&out.key)
        .send()
        .await
        .map_err(|e| format!("output {} unreadable: {e}", out.key))?;
    Ok(object
        .body
        .collect()
        .await
        .map_err(|e| format!("output {} unreadable: {e}", out.key))?
        .into_bytes()
        .to_vec())
}

#[derive(Default)]
struct Verdict {
    anomalies: Vec<(&'static str, String)>,
    /// Done, and its result message never reached the listener.
    answer_missed: bool,
}

/// One acked job against the rules: one terminal state its kind allows, at
/// most one answer and one dead letter, and the status record, the answer,
/// the output object and the dead letters agreeing. Pure: the caller read
/// everything.
fn judge(
    sent: &Sent,
    status: &StatusRecord,
    answers: &[JobResult],
    letters: &[ErrorCode],
    output: Option<Result<Vec<u8>, String>>,
) -> Verdict {
    let mut v = Verdict::default();
    let mut fail = |class, what: String| v.anomalies.push((class, what));
    if answers.len() > 1 {
        let outcomes: Vec<&Outcome> = answers.iter().map(|a| &a.outcome).collect();
        fail(
            "duplicated",
            format!("answered {} times: {outcomes:?}", answers.len()),
        );
    }
    if letters.len() > 1 {
        fail(
            "duplicated",
            format!("dead-lettered {} times: {letters:?}", letters.len()),
        );
    }
    if !status.state.is_final() {
        fail("lost", format!("still {:?} after the heal", status.state));
        return v;
    }
    let allowed: &[JobState] = match (sent.kind, sent.cancelled) {
        (Kind::Embed | Kind::EmbedFromS3 | Kind::Generate, _) => &[JobState::Done],
        (Kind::Deadline, _) => &[JobState::Done, JobState::Expired],
        (Kind::Cancelled, Some(true)) => &[JobState::Cancelled],
        (Kind::Cancelled, Some(false)) => &[JobState::Done],
        (Kind::Cancelled, None) => &[JobState::Cancelled, JobState::Done],
        (Kind::BadEmbed | Kind::BadGenerate, _) => &[JobState::Failed],
    };
    if !allowed.contains(&status.state) {
        fail(
            "inconsistent",
            format!(
                "ended {:?} (cancel said {:?}): {:?}",
                status.state, sent.cancelled, status.error
            ),
        );
        return v;
    }
    let answer = answers.first().map(|a| &a.outcome);
    match status.state {
        JobState::Done => {
            if !letters.is_empty() {
                fail(
                    "inconsistent",
                    format!("done but dead-lettered: {letters:?}"),
                );
            }
            let Some(out) = &status.output else {
                fail("inconsistent", "done without an output location".into());
                return v;
            };
            match answer {
                Some(Outcome::Ok {
                    output: Output::S3(o),
                }) if o == out => {}
                Some(other) => fail(
                    "inconsistent",
                    format!("status says {out:?}, the answer {other:?}"),
                ),
                None => v.answer_missed = true,
            }
            let bytes = match output {
                Some(Ok(bytes)) => bytes,
                Some(Err(e)) => {
                    v.anomalies.push(("lost", e));
                    return v;
                }
                None => unreachable!("the caller reads a done job's output"),
            };
            let mut fail = |class, what: String| v.anomalies.push((class, what));
            if hex::encode(Sha256::digest(&bytes)) != out.sha256 {
                fail(
                    "inconsistent",
                    format!(
                        "output {} differs from its record (written twice?)",
                        out.key
                    ),
                );
            } else if sent.kind.task() == Task::Embed {
                match sluice_schemas::npy::decode_f32(&bytes) {
                    Ok((rows, dim, _)) if (rows, dim) == (sent.items, DIM) => {}
                    other => fail(
                        "inconsistent",
                        format!(
                            "output shape {:?} for {} items",
                            other.map(|(r, d, _)| (r, d)),
                            sent.items
                        ),
                    ),
                }
            } else {
                let lines = bytes
                    .split(|&b| b == b'\n')
                    .filter(|l| !l.is_empty())
                    .count();
                if lines != sent.items {
                    fail(
                        "inconsistent",
                        format!("{lines} generations for {} prompts", sent.items),
                    );
                }
            }
        }
        JobState::Failed => {
            let code = status.error.as_ref().map(|e| e.code);
            let expected = if sent.kind == Kind::BadEmbed {
                ErrorCode::ItemTooLong
            } else {
                ErrorCode::InputInvalid
            };
            if code != Some(expected) {
                fail(
                    "inconsistent",
                    format!("failed with {code:?}, not {expected:?}"),
                );
            }
            if letters.is_empty() {
                fail("lost", "failed without a dead letter".into());
            } else if letters[0] != expected {
                fail("inconsistent", format!("failed; dead letters {letters:?}"));
            }
            if let Some(a) = answer
                && !matches!(a, Outcome::Error { error } if Some(error.code) == code)
            {
                fail(
                    "inconsistent",
                    format!("status failed with {code:?}, the answer {a:?}"),
                );
            }
        }
        JobState::Expired => {
            if letters.iter().any(|c| *c != ErrorCode::DeadlineExceeded) {
                fail("inconsistent", format!("expired; dead letters {letters:?}"));
            }
            if matches!(answer, Some(Outcome::Ok { .. })) {
                fail("inconsistent", "expired but answered with an output".into());
            }
        }
        JobState::Cancelled => {
            if !letters.is_empty() {
                fail(
                    "inconsistent",
                    format!("cancelled but dead-lettered: {letters:?}"),
                );
            }
            if matches!(answer, Some(Outcome::Ok { .. })) {
                fail(
                    "inconsistent",
                    "cancelled but answered with an output".into(),
                );
            }
        }
        JobState::Queued | JobState::Running => unreachable!("checked above"),
    }
    v
}

/// The job's status, read again while the cluster settles.
async fn read_status(d: &Deployment, id: &str) -> Option<StatusRecord> {
    for _ in 0..20 {
        if let Ok(s) = d.producer.status(id).await {
            return s;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    panic!("cannot read the status of {id}");
}

fn anomaly(
    report: &mut Report,
    class: &'static str,
    id: &str,
    sent: &Sent,
    end: SystemTime,
    what: String,
) {
    report.spans.insert(id.to_string(), (sent.sent_at, end));
    report.anomalies.push(Anomaly {
        class,
        job_id: id.to_string(),
        what: format!("{class}: {id} ({:?}): {what}", sent.kind),
    });
}

fn print_report(ledger: &Ledger, report: &Report, batches: &BatchReport, secs: u64, seed: u64) {
    eprintln!("\nsoak: {secs} s of faults, seed {seed}");
    eprintln!(
        "jobs acked: {} ({:?}); unacked after 5 tries (the publisher's to retry): {}",
        report.by_kind.values().sum::<u64>(),
        report.by_kind,
        report.unacked
    );
    eprintln!("final states: {:?}", report.by_state);
    eprintln!(
        "results not seen by the listener (outcome in the status record): {}",
        report.answers_missed
    );
    eprintln!("online requests: {:?}", ledger.online);
    eprintln!(
        "batches: {} completed, {} lines; creations refused: {:?}",
        batches.completed, batches.lines, ledger.batches_refused
    );
    eprintln!(
        "\n| fault | injected | jobs in flight | lost | duplicated | inconsistent |\n|---|---:|---:|---:|---:|---:|"
    );
    let mut rows: BTreeMap<String, [u64; 5]> = BTreeMap::new();
    for w in &ledger.windows {
        rows.entry(format!("{:?}", w.fault)).or_default()[0] += 1;
    }
    for (fault, row) in rows.iter_mut() {
        let windows: Vec<&Window> = ledger
            .windows
            .iter()
            .filter(|w| format!("{:?}", w.fault) == *fault)
            .collect();
        row[1] = ledger
            .jobs
            .values()
            .filter(|s| {
                s.acked
                    && windows
                        .iter()
                        .any(|w| s.sent_at <= w.to && s.sent_at + Duration::from_secs(30) >= w.from)
            })
            .count() as u64;
        for a in &report.anomalies {
            let (from, to) = report.spans[&a.job_id];
            if windows.iter().any(|w| from <= w.to && to >= w.from) {
                let col = match a.class {
                    "lost" => 2,
                    "duplicated" => 3,
                    _ => 4,
                };
                row[col] += 1;
            }
        }
    }
    for (fault, r) in &rows {
        eprintln!(
            "| {fault} | {} | {} | {} | {} | {} |",
            r[0], r[1], r[2], r[3], r[4]
        );
    }
    let count = |class| report.anomalies.iter().filter(|a| a.class == class).count();
    eprintln!(
        "| all | {} | {} | {} | {} | {} |",
        ledger.windows.len(),
        report.by_kind.values().sum::<u64>(),
        count("lost"),
        count("duplicated"),
        count("inconsistent")
    );
}
