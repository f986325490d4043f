//! Start-up (load the model, size the budget, warm up, connect, bind) and the
//! admission loop: pull only as many jobs as the budget has room for.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use async_nats::jetstream::consumer::{FromConsumer, PullConsumer, pull};
use async_nats::jetstream::{self};
use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use sluice_schemas::Priority;
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::budget::{Budget, Reservation};
use crate::config::Config;
use crate::engine::startup::Started;
use crate::fetch::{FetchPolicy, Fetcher};
use crate::levels::LevelShares;
use crate::output::{DeadLetters, OutputStore, ResultPublisher};
use crate::shared::{Limits, Shared};
use crate::telemetry::otlp::OtlpMetrics;
use crate::telemetry::{Stats, Tracing};
use crate::tenants::{TenantQueues, TenantShares};
use crate::{engine, http, job};
use sluice_status::StatusStore;

/// A running consumer. Drop does not stop it: call [`Running::shutdown`].
pub struct Running {
    pub stats: Arc<Stats>,
    pub budget: Budget,
    /// What admission reserves for a job before its inputs are read.
    pub worst_job_bytes: u64,
    pub http_addr: std::net::SocketAddr,
    /// Reads the memory where the model runs.
    pub memory: crate::memory::MemoryProbe,
    /// When this process recycles itself (jitter applied).
    pub recycle: crate::recycle::Limits,
    stop: watch::Sender<Option<Duration>>,
    admission: tokio::task::JoinHandle<anyhow::Result<()>>,
    executor: std::thread::JoinHandle<()>,
    ready: Arc<AtomicBool>,
    tracing: Tracing,
    otlp_metrics: Option<OtlpMetrics>,
}

impl Running {
    /// Drains: stops pulling (and goes unready), Naks what the last pull still
    /// delivers, lets in-flight jobs finish for up to `drain`, then Naks the
    /// jobs still running so they are redelivered at once elsewhere.
    pub async fn shutdown(self, drain: Duration) -> anyhow::Result<()> {
        self.ready.store(false, Ordering::Release);
        let _ = self.stop.send(Some(drain));
        let result = self.admission.await.context("admission task panicked")?;
        // The batcher ends when the last job drops its sender; the executor
        // when the batcher ends (after the batch it is running, if any).
        let _ = tokio::task::spawn_blocking(move || self.executor.join()).await;
        // Export the spans still buffered (blocking HTTP: off the runtime).
        let tracing = self.tracing;
        let metrics = self.otlp_metrics;
        let _ = tokio::task::spawn_blocking(move || {
            tracing.shutdown();
            if let Some(m) = metrics {
                m.shutdown();
            }
        })
        .await;
        result
    }
}

/// Starts the consumer: everything that can fail at start-up fails here, with
/// a message naming the knob to change.
pub async fn start(config: Config) -> anyhow::Result<Running> {
    config.validate()?;
    config.nats_auth.validate()?;
    crate::alloc::tune();
    let topology = config.topology();
    let task = config.task();
    let tracing = match config.otlp.endpoint.clone() {
        // The exporter's HTTP client is a blocking one: build it off the runtime.
        Some(endpoint) => {
            let protocol = config.otlp.protocol;
            tokio::task::spawn_blocking(move || Tracing::otlp(&endpoint, protocol))
                .await
                .context("tracing set-up panicked")??
        }
        None => Tracing::disabled(),
    };
    let stats = Arc::new(Stats::default());
    let Started {
        engine,
        model_thread: executor,
        cost,
        budget,
        device,
        memory,
    } = engine::start(&config, &stats, &tracing)?;
    memory.sample_in_background();

    let nats = sluice_connect::connect_nats(
        &config.nats_url,
        &config.nats_auth,
        "sluice-consumer",
        true,
        Duration::from_secs(30),
    )
    .await?;
    let js = jetstream::new(nats.clone());
    let stream = js.get_stream(&topology.job_stream).await.with_context(|| {
        format!(
            "job stream {} not found: run `sluice init` first",
            topology.job_stream
        )
    })?;
    let consumer_name = topology.consumer_for(task);
    let consumer: PullConsumer = stream.get_consumer(&consumer_name).await.map_err(|e| {
        anyhow::anyhow!(
            "durable consumer {consumer_name} on stream {} not found ({e}): run `sluice init` first",
            topology.job_stream
        )
    })?;
    // One durable consumer per priority level; a stream from before
    // priorities has only the normal one (`sluice init` adds the others).
    let mut levels = Vec::new();
    for priority in Priority::ALL {
        if priority == Priority::Normal {
            levels.push((priority, consumer.clone()));
            continue;
        }
        let name = topology.consumer_at(task, priority);
        match stream
            .get_consumer::<async_nats::jetstream::consumer::pull::Config>(&name)
            .await
        {
            Ok(c) => levels.push((priority, c)),
            Err(e) => {
                tracing::warn!(consumer = %name, error = %e, "no durable consumer for {priority} priority jobs: only normal ones are taken (run `sluice init` to add it)")
            }
        }
    }
    let max_deliver = stream
        .consumer_info(&consumer_name)
        .await
        .map(|i| i.config.max_deliver)
        .unwrap_or(-1);
    let max_deliver = if max_deliver <= 0 {
        i64::MAX
    } else {
        max_deliver
    };
    let status = js
        .get_key_value(&topology.status_bucket)
        .await
        .with_context(|| {
            format!(
                "status bucket {} not found: run `sluice init` first",
                topology.status_bucket
            )
        })?;

    let s3 = config.s3.client().await;
    s3.head_bucket()
        .bucket(&config.output_bucket)
        .send()
        .await
        .map_err(|e| {
            anyhow::anyhow!(
                "output bucket {} is not reachable: {} (check --output-bucket, --s3-endpoint and the AWS credentials)",
                config.output_bucket,
                aws_sdk_s3::error::DisplayErrorContext(e)
            )
        })?;

    let worst_job_bytes = cost.worst_bytes();
    let shared = Arc::new(Shared {
        topology,
        js: js.clone(),
        model_name: config.model.name(task),
        limits: Limits {
            max_input_bytes: config.max_input_bytes,
            max_items_per_job: config.max_items_per_job(),
        },
        cost,
        fetcher: Fetcher::new(FetchPolicy {
            allow_hosts: config.input_allow_hosts.clone(),
            trusted_hosts: s3_endpoint_host(&config),
            allow_link_local: config.input_allow_link_local,
            max_bytes: config.max_input_bytes,
            timeout: Duration::from_secs(config.fetch_timeout_secs),
        })
        .context("cannot build the HTTP client for inputs")?,
        engine,
        outputs: OutputStore {
            s3,
            bucket: config.output_bucket.clone(),
            prefix: config.output_prefix.clone(),
            inline_max_bytes: config.inline_output_max_bytes,
        },
        results: ResultPublisher { nats: nats.clone() },
        status: StatusStore::new(status),
        dead_letters: DeadLetters { js },
        stats: Arc::clone(&stats),
        max_deliver,
        progress_interval: Duration::from_secs(config.progress_interval_secs),
        retry_base: Duration::from_millis(config.retry_base_ms),
        retry_max: Duration::from_millis(config.retry_max_ms),
        tracing: tracing.clone(),
    });

    for (priority, _) in &levels {
        let name = shared.topology.consumer_at(task, *priority);
        let advisories = job::dead_letter::subscribe(&nats, &shared.topology.job_stream, &name)
            .await
            .context("cannot subscribe to the MAX_DELIVERIES advisories")?;
        tokio::spawn(job::dead_letter::run(
            Arc::downgrade(&shared),
            stream.clone(),
            advisories,
        ));
    }
    // The tenants' consumers copy the normal level's settings; `sluice
    // init` stores the tenant weights on it.
    let mut template = pull::Config::try_from_consumer_config(
        consumer.cached_info().config.clone(),
    )
    .map_err(|e| anyhow::anyhow!("durable consumer {consumer_name} is not a pull consumer: {e}"))?;
    template.metadata.retain(|k, _| !k.starts_with("_nats"));
    let weights = template
        .metadata
        .get(sluice_schemas::names::TENANT_WEIGHTS_KEY)
        .map(|w| crate::tenants::parse_weights(w))
        .unwrap_or_default();
    if !weights.is_empty() {
        tracing::info!(?weights, "tenant weights");
    }
    let on_new_tenant = {
        let job_stream = shared.topology.job_stream.clone();
        let (nats, shared, stream) = (nats.clone(), Arc::downgrade(&shared), stream.clone());
        Box::new(move |name: String| {
            let (nats, shared, stream, job_stream) = (
                nats.clone(),
                shared.clone(),
                stream.clone(),
                job_stream.clone(),
            );
            tokio::spawn(async move {
                match job::dead_letter::subscribe(&nats, &job_stream, &name).await {
                    Ok(advisories) => job::dead_letter::run(shared, stream, advisories).await,
                    Err(e) => {
                        tracing::warn!(consumer = %name, error = %e, "cannot subscribe to a tenant consumer's MAX_DELIVERIES advisories")
                    }
                }
            });
        }) as Box<dyn Fn(String) + Send + Sync>
    };
    let tenant_queues = TenantQueues::new(
        stream.clone(),
        shared.topology.clone(),
        task,
        template,
        Duration::from_millis(config.tenant_refresh_ms),
        on_new_tenant,
    );

    let ready = Arc::new(AtomicBool::new(true));
    let http_state = http::State {
        stats: Arc::clone(&stats),
        budget: budget.clone(),
        ready: Arc::clone(&ready),
        nats: nats.clone(),
        device,
        memory: memory.clone(),
    };
    let otlp_metrics = match config.otlp.endpoint.clone() {
        Some(endpoint) => {
            let (protocol, stats, state) =
                (config.otlp.protocol, Arc::clone(&stats), http_state.clone());
            let interval = config.otlp.metrics_interval();
            Some(
                tokio::task::spawn_blocking(move || {
                    OtlpMetrics::start(
                        &endpoint,
                        protocol,
                        interval,
                        stats,
                        Arc::new(move || state.readings()),
                    )
                })
                .await
                .context("metrics set-up panicked")??,
            )
        }
        None => None,
    };
    let http_addr = http::serve(config.http_addr, http_state)
        .await
        .with_context(|| format!("cannot listen on {} (--http-addr)", config.http_addr))?;

    let recycle = crate::recycle::Limits::new(&config, crate::recycle::process_seed());
    let (stop, stop_rx) = watch::channel(None);
    let admission = tokio::spawn(admit(
        shared,
        Queues {
            levels,
            tenants: tenant_queues,
            shares: TenantShares::new(weights),
        },
        budget.clone(),
        PullPlan {
            max_messages: config.pull_max_messages,
            expires: Duration::from_millis(config.pull_expires_ms),
            job_limit: recycle.after_jobs,
            max_tokens_in_flight: (task == sluice_schemas::Task::Embed).then(|| {
                let cap = match config.max_tokens_in_flight {
                    0 => 2 * config.model.max_batch_tokens,
                    n => n,
                };
                (cap as u64, config.model.max_tokens_per_item as u64)
            }),
            tenant_quantum: match task {
                sluice_schemas::Task::Embed => config.model.max_batch_tokens as u64,
                _ => config.generate.max_step_tokens as u64,
            },
            job_estimate: match task {
                sluice_schemas::Task::Embed => config.model.max_tokens_per_item as u64,
                _ => config.generate.max_new_tokens as u64,
            },
        },
        stop_rx,
    ));
    Ok(Running {
        stats,
        budget,
        worst_job_bytes,
        http_addr,
        memory,
        recycle,
        stop,
        admission,
        executor,
        ready,
        tracing,
        otlp_metrics,
    })
}

struct PullPlan {
    max_messages: usize,
    expires: Duration,
    /// Jobs this process takes in all before it recycles (`recycle.rs`).
    job_limit: Option<u64>,
    /// Embed: take no more jobs while those taken hold this many tokens
    /// (the cap, and the tokens assumed of a job not tokenized yet before
    /// any job has finished).
    max_tokens_in_flight: Option<(u64, u64)>,
    /// While several tenants have jobs at a level, one pull asks a tenant
    /// for about this many tokens' worth of jobs.
    tenant_quantum: u64,
    /// The tokens assumed of a tenant's job before any of its jobs finished.
    job_estimate: u64,
}

/// Where admission pulls from: each level's durable consumer (the default
/// tenant's), each tenant's, and the tenants' shares.
struct Queues {
    levels: Vec<(Priority, PullConsumer)>,
    tenants: TenantQueues,
    shares: TenantShares,
}

/// A queue admission pulls from: a level, and a tenant at it (the level's
/// own durable consumer for the default tenant).
type QueueKey = (Priority, String);

/// One queue's idle long-poll: the queue, what it delivered (at most one
/// job), and the reservation it was made under.
type IdlePoll = BoxFuture<'static, (QueueKey, Option<jetstream::Message>, Reservation)>;

/// Admission: reserve a job's worst case for each message before asking for
/// it, pull at most that many, hand each to its own task, and release what
/// the pull did not fill.
///
/// Each round asks the levels in [`LevelShares::order`] and, within a
/// level, its tenants with jobs waiting in [`TenantShares::order`], with a
/// pull that returns at once (`fetch`), stopping at the first that has
/// jobs. While a level has several tenants a pull asks for about one
/// quantum of tokens, so the shares stay even. When nothing has jobs, each
/// queue gets one long-poll of its own under one reservation, so a job
/// anywhere is taken as soon as it is published (a tenant seen for the
/// first time: within `--tenant-refresh-ms`). On stop: drain (see
/// [`Running::shutdown`]).
async fn admit(
    shared: Arc<Shared>,
    queues: Queues,
    budget: Budget,
    plan: PullPlan,
    mut stop: watch::Receiver<Option<Duration>>,
) -> anyhow::Result<()> {
    let Queues {
        levels,
        tenants: mut tenant_queues,
        shares: tenant_shares,
    } = queues;
    let worst = shared.cost.worst_bytes();
    let shares = Arc::new(LevelShares::default());
    let tenant_shares = Arc::new(tenant_shares);
    let present: Vec<Priority> = levels.iter().map(|(p, _)| *p).collect();
    let level_consumer = |p: Priority| levels.iter().find(|(l, _)| *l == p).map(|(_, c)| c.clone());
    let mut jobs = JoinSet::new();
    let (abort_tx, abort) = watch::channel(false);
    let mut idle: FuturesUnordered<IdlePoll> = FuturesUnordered::new();
    let mut idle_queues: Vec<QueueKey> = Vec::new();
    // While idle: tenant jobs as they are published (see below).
    let mut arrivals: Option<async_nats::Subscriber> = None;
    let mut backoff = Duration::from_millis(100);
    let taken = std::sync::atomic::AtomicU64::new(0);
    let mut asked_at = Instant::now();
    // Hands one delivered job to its own task; its tokens are charged to its
    // level and tenant when it ends (the tenant's estimate at once).
    let take = |msg: jetstream::Message,
                (priority, tenant): QueueKey,
                reservation: Reservation,
                asked_at: Instant,
                jobs: &mut JoinSet<()>| {
        shared.stats.jobs_in_flight.fetch_add(1, Ordering::Relaxed);
        taken.fetch_add(1, Ordering::Relaxed);
        let estimate = tenant_shares.estimate(&tenant, plan.job_estimate);
        tenant_shares.taken(&tenant, estimate);
        let shared = Arc::clone(&shared);
        let shares = Arc::clone(&shares);
        let tenant_shares = Arc::clone(&tenant_shares);
        let abort = abort.clone();
        jobs.spawn(async move {
            let stats = Arc::clone(&shared.stats);
            let tokens = job::handle(shared, msg, reservation, asked_at, abort).await;
            shares.charge(priority, tokens);
            tenant_shares.finished(&tenant, estimate, tokens);
            stats.jobs_in_flight.fetch_sub(1, Ordering::Relaxed);
            stats.jobs_finished.fetch_add(1, Ordering::Relaxed);
        });
    };
    // What an idle long-poll delivered.
    let idle_done =
        |(queue, msg, reservation): (QueueKey, Option<jetstream::Message>, Reservation),
         idle_queues: &mut Vec<QueueKey>,
         asked_at: Instant,
         jobs: &mut JoinSet<()>| {
            idle_queues.retain(|q| *q != queue);
            if let Some(msg) = msg {
                take(msg, queue, reservation, asked_at, jobs);
            }
        };
    'pulling: while stop.borrow().is_none() {
        // Reap finished job tasks, and take what idle long-polls delivered.
        while jobs.try_join_next().is_some() {}
        while let Some(Some(done)) = idle.next().now_or_never() {
            idle_done(done, &mut idle_queues, asked_at, &mut jobs);
        }
        let left = plan
            .job_limit
            .map(|limit| limit.saturating_sub(taken.load(Ordering::Relaxed)));
        if left == Some(0) {
            // Recycling: take nothing more; `run` stops us once the jobs
            // taken have finished.
            let _ = stop.changed().await;
            break 'pulling;
        }
        let most = left.map_or(plan.max_messages, |l| {
            plan.max_messages
                .min(usize::try_from(l).unwrap_or(usize::MAX))
        });
        // Enough work taken: the rest waits in the stream, where a higher
        // level (or another consumer) can still take it first.
        if let Some((cap, per_job)) = plan.max_tokens_in_flight
            && shared.stats.tokens_admitted(per_job) >= cap
        {
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(2)) => {},
                _ = stop.changed() => break 'pulling,
            }
            continue 'pulling;
        }
        tenant_queues.refresh_if_due().await;
        asked_at = Instant::now();
        let first = tokio::select! {
            r = budget.reserve(worst) => r,
            Some(done) = idle.next(), if !idle.is_empty() => {
                idle_done(done, &mut idle_queues, asked_at, &mut jobs);
                continue 'pulling;
            }
            _ = stop.changed() => break 'pulling,
        };
        let mut reservations = vec![first];
        while reservations.len() < most {
            match budget.try_reserve(worst) {
                Some(r) => reservations.push(r),
                None => break,
            }
        }
        // Busy: ask the levels in share order, and their tenants in share
        // order, at once, until one has jobs.
        let mut got = 0;
        let mut failed = None;
        'levels: for level in shares.order(&present) {
            let Some(plain) = level_consumer(level) else {
                continue;
            };
            let tenants = tenant_queues.backlogged(level);
            let several = tenants.len() > 1;
            for tenant in tenant_shares.order(level.index(), &tenants) {
                let consumer = if tenant == sluice_schemas::DEFAULT_TENANT {
                    plain.clone()
                } else if let Some(c) = tenant_queues.consumer(level, tenant) {
                    c
                } else {
                    continue;
                };
                // Several tenants: about a quantum's worth of this one's
                // jobs. Embed: no more than the in-flight cap has room for
                // (at least one), so one pull cannot take a tenant far past it.
                let mut want = reservations.len();
                if several {
                    want = want.min(tenant_shares.jobs_per_quantum(
                        tenant,
                        plan.tenant_quantum,
                        plan.job_estimate,
                    ));
                }
                if let Some((cap, per_job)) = plan.max_tokens_in_flight {
                    let room = cap.saturating_sub(shared.stats.tokens_admitted(per_job));
                    want =
                        want.min(tenant_shares.jobs_per_quantum(tenant, room, plan.job_estimate));
                }
                let mut messages = match consumer.fetch().max_messages(want).messages().await {
                    Ok(m) => m,
                    Err(e) if tenant != sluice_schemas::DEFAULT_TENANT => {
                        tracing::debug!(error = %e, %tenant, %level, "pull from a tenant's consumer failed; looking it up again");
                        tenant_queues.forget(level, tenant);
                        continue;
                    }
                    Err(e) => {
                        failed = Some(e);
                        break 'levels;
                    }
                };
                // A fetch answers at once; a reply lost with its server (a
                // killed stream leader) must not leave admission waiting
                // forever, so the wait is bounded.
                let give_up = tokio::time::Instant::now() + plan.expires + Duration::from_secs(5);
                while let Ok(Some(next)) = tokio::time::timeout_at(give_up, messages.next()).await {
                    match next {
                        Ok(msg) => {
                            let Some(reservation) = reservations.pop() else {
                                tracing::error!(
                                    "bug: a pull delivered more messages than it asked for; Nak'ing it"
                                );
                                job::nak_now(&msg).await;
                                continue;
                            };
                            got += 1;
                            take(
                                msg,
                                (level, tenant.clone()),
                                reservation,
                                asked_at,
                                &mut jobs,
                            );
                        }
                        Err(e) => {
                            tracing::debug!(error = %e, "pull ended with an error");
                            break;
                        }
                    }
                }
                if got > 0 {
                    break 'levels;
                }
                if several {
                    tenant_shares.found_empty(tenant, &tenants);
                }
            }
            shares.found_empty(level, &present);
        }
        if let Some(e) = failed {
            tracing::warn!(error = %e, retry_in_ms = backoff.as_millis() as u64, "pull failed");
            drop(reservations);
            tokio::select! {
                _ = tokio::time::sleep(backoff) => {},
                _ = stop.changed() => break 'pulling,
            }
            backoff = (backoff * 2).min(Duration::from_secs(5));
            continue;
        }
        backoff = Duration::from_millis(100);
        if got > 0 {
            arrivals = None;
            continue;
        }
        // Idle: a long-poll per queue that has none yet, highest level
        // first, each under one of the reservations (queues left without
        // one are asked again next round).
        let waiting = Priority::ALL
            .into_iter()
            .filter(|l| present.contains(l))
            .flat_map(|l| {
                let mut tenants = tenant_queues.backlogged(l);
                if !tenants.iter().any(|t| t == sluice_schemas::DEFAULT_TENANT) {
                    tenants.insert(0, sluice_schemas::DEFAULT_TENANT.to_string());
                }
                tenants.into_iter().map(move |t| (l, t))
            })
            .collect::<Vec<QueueKey>>();
        for queue in waiting {
            if idle_queues.contains(&queue) {
                continue;
            }
            let consumer = if queue.1 == sluice_schemas::DEFAULT_TENANT {
                level_consumer(queue.0)
            } else {
                tenant_queues.consumer(queue.0, &queue.1)
            };
            let (Some(reservation), Some(consumer)) = (reservations.pop(), consumer) else {
                break;
            };
            idle_queues.push(queue.clone());
            idle.push(long_poll(consumer, queue, reservation, plan.expires));
        }
        drop(reservations);
        // Idle long-polls wait on the tenants that had jobs at the last look
        // only; a job of another tenant (an API key's online request after a
        // quiet spell) would wait for the next look. So while idle, listen
        // to the tenant subjects: such a job makes its tenant's queue ready
        // at once (the listening ends when admission takes jobs again).
        if arrivals.is_none() {
            arrivals = shared
                .js
                .client()
                .subscribe(tenant_queues.arrivals())
                .await
                .map_err(|e| tracing::debug!(error = %e, "cannot listen for tenant jobs; new tenants are found at the next look"))
                .ok();
        }
        let arrival = async {
            match arrivals.as_mut() {
                Some(sub) => sub.next().await,
                None => std::future::pending().await,
            }
        };
        // Wait for one to deliver (or all to expire), for a tenant's job,
        // for the next look at the tenants, or for stop.
        tokio::select! {
            Some(done) = idle.next(), if !idle.is_empty() => {
                idle_done(done, &mut idle_queues, asked_at, &mut jobs);
            }
            Some(msg) = arrival => {
                let subject = msg.subject.to_string();
                if let Some(queue) = tenant_queues.arrived(&subject).await
                    && !idle_queues.contains(&queue)
                {
                    tracing::debug!(tenant = %queue.1, level = %queue.0, "a tenant's job arrived while idle");
                }
            }
            _ = tokio::time::sleep_until(tenant_queues.next_at()) => {}
            _ = stop.changed() => break 'pulling,
        }
    }
    // What the idle long-polls still deliver goes back at once.
    while let Some((_, msg, _)) = idle.next().await {
        if let Some(msg) = msg {
            job::nak_now(&msg).await;
        }
    }
    let drain = stop.borrow().unwrap_or_default();
    let in_flight = jobs.len();
    tracing::info!(in_flight, drain_secs = drain.as_secs_f64(), "draining");
    let finished =
        tokio::time::timeout(drain, async { while jobs.join_next().await.is_some() {} }).await;
    if finished.is_err() {
        tracing::warn!(
            still_running = jobs.len(),
            "drain deadline passed: Nak'ing the jobs still running for redelivery elsewhere"
        );
        let _ = abort_tx.send(true);
        while jobs.join_next().await.is_some() {}
    }
    Ok(())
}

/// Waits up to `expires` for one job from `queue`.
fn long_poll(
    consumer: PullConsumer,
    queue: QueueKey,
    reservation: Reservation,
    expires: Duration,
) -> IdlePoll {
    Box::pin(async move {
        let (level, tenant) = (queue.0, queue.1.as_str());
        let msg = match consumer
            .batch()
            .max_messages(1)
            .expires(expires)
            .messages()
            .await
        {
            Ok(mut messages) => match messages.next().await {
                Some(Ok(msg)) => Some(msg),
                Some(Err(e)) => {
                    tracing::debug!(error = %e, %level, %tenant, "idle pull ended with an error");
                    None
                }
                None => None,
            },
            Err(e) => {
                tracing::debug!(error = %e, %level, %tenant, "idle pull failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                None
            }
        };
        (queue, msg, reservation)
    })
}

/// The S3 endpoint's `host:port` (inputs there are allowed whatever its
/// address); none for AWS's default endpoint, which is public.
fn s3_endpoint_host(config: &Config) -> Vec<String> {
    config
        .s3
        .s3_endpoint
        .as_deref()
        .and_then(|e| url::Url::parse(e).ok())
        .and_then(|u| crate::fetch::host_and_port(&u))
        .map(|(host, port)| format!("{host}:{port}"))
        .into_iter()
        .collect()
}
