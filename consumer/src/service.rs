//! Start-up: load the model, size the budget, warm up, connect, bind, then
//! hand the pulling to [`crate::admission`]. Everything that can fail at
//! start-up fails here, with a message naming the knob to change.

use sluice_connect::lookup::{LookupError, look_up};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context;
use async_nats::jetstream::consumer::{FromConsumer, PullConsumer, pull};
use async_nats::jetstream::{self, stream::Stream};
use sluice_schemas::{Priority, Task, Topology};
use tokio::sync::watch;

use crate::admission::{Admission, InFlightCap, PullPlan, Queues, TenantQueues, TenantShares};
use crate::budget::Budget;
use crate::config::Config;
use crate::fetch::{FetchPolicy, Fetcher};
use crate::in_flight::InFlight;
use crate::output::{DeadLetters, OutputStore, ResultPublisher};
use crate::shared::{JobLimits, ModelRoute, Shared};
use crate::task::startup::{Pacing, Started};
use crate::telemetry::otlp::OtlpMetrics;
use crate::telemetry::{Stats, Tracing};
use crate::{http, job, task};
use sluice_status::StatusStore;

/// A running consumer. Drop does not stop it: call [`Consumer::shutdown`].
pub struct Consumer {
    pub stats: Arc<Stats>,
    pub budget: Budget,
    /// What admission reserves for a job before its inputs are read.
    pub worst_job_bytes: u64,
    pub http_addr: std::net::SocketAddr,
    /// Reads the memory where the model runs.
    pub memory: crate::memory::MemoryProbe,
    /// When this process recycles itself (jitter applied).
    pub recycle: crate::recycle::RecycleLimits,
    stop: watch::Sender<Option<Duration>>,
    admission: tokio::task::JoinHandle<anyhow::Result<()>>,
    /// Ends once this process's record is out of the consumers bucket.
    heartbeat: tokio::task::JoinHandle<()>,
    executor: std::thread::JoinHandle<()>,
    ready: Arc<AtomicBool>,
    tracing: Tracing,
    otlp_metrics: Option<OtlpMetrics>,
}

impl Consumer {
    /// Drains: stops pulling (and goes unready), Naks what the last pull still
    /// delivers, lets in-flight jobs finish for up to `drain`, then Naks the
    /// jobs still running so they are redelivered at once elsewhere.
    pub async fn shutdown(self, drain: Duration) -> anyhow::Result<()> {
        self.ready.store(false, Ordering::Release);
        let _ = self.stop.send(Some(drain));
        let _ = self.heartbeat.await;
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
pub async fn start(config: Config) -> anyhow::Result<Consumer> {
    config.validate()?;
    crate::alloc::tune();
    let task = config.task();
    let tracing = tracing_exporter(&config).await?;
    let stats = Arc::new(Stats::default());
    let Started {
        engine,
        model_thread: executor,
        cost,
        pacing,
        budget,
        device,
        memory,
    } = task::start(&config, &stats, &tracing)?;
    memory.sample_in_background();

    let nats = sluice_connect::connect_nats(
        &config.deployment.nats_url,
        &config.deployment.nats_auth,
        "sluice-consumer",
        true,
        Duration::from_secs(30),
    )
    .await?;
    let js = jetstream::new(nats.clone());
    let model_name = config.model.name(task);
    if config.model.model_name.is_none() {
        tracing::info!(model = %model_name, dir = %config.model.dir(task).display(), "no --model-name: answering to the model's own name");
    }
    let model_route = model_route(&js, &config.topology(), task, &model_name).await?;
    let stream_binding = bind_stream(&js, &config.topology(), task, &model_route).await?;
    let s3 = config.deployment.s3.client().await;
    // Listing one key under the output prefix: what a consumer's own
    // identity may do (it need not see the rest of the bucket), and a
    // missing bucket answers NoSuchBucket where a HEAD could not say.
    s3.list_objects_v2()
        .bucket(&config.output_bucket)
        .prefix(&config.output_prefix)
        .max_keys(1)
        .send()
        .await
        .map_err(|e| {
            anyhow::anyhow!(
                "output bucket {} is not reachable under {}: {} (check --output-bucket, --output-prefix, --s3-endpoint and the AWS credentials: they must read, write and list there)",
                config.output_bucket,
                config.output_prefix,
                aws_sdk_s3::error::DisplayErrorContext(e)
            )
        })?;

    let worst_job_bytes = cost.worst_bytes();
    let in_flight = Arc::new(InFlight::default());
    let shared = Arc::new(Shared {
        topology: config.topology(),
        js: js.clone(),
        model_name,
        model_route,
        limits: JobLimits {
            max_input_bytes: config.max_input_bytes(),
            max_items_per_job: config.max_items_per_job(),
        },
        cost,
        fetcher: Fetcher::new(FetchPolicy {
            allow_hosts: config.input_allow_hosts.clone(),
            trusted_hosts: s3_endpoint_host(&config),
            allow_link_local: config.input_allow_link_local,
            max_bytes: config.max_input_bytes(),
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
        status: StatusStore::new(stream_binding.status.clone()),
        dead_letters: DeadLetters {
            js,
            max_payload: nats.server_info().max_payload,
        },
        stats: Arc::clone(&stats),
        in_flight: Arc::clone(&in_flight),
        max_deliver: stream_binding.max_deliver,
        progress_interval: Duration::from_secs(config.progress_interval_secs),
        retry_base: Duration::from_millis(config.retry_base_ms),
        retry_max: Duration::from_millis(config.retry_max_ms),
        tracing: tracing.clone(),
    });
    let queues = queues(&config, &nats, &shared, stream_binding).await?;

    let heartbeat = crate::heartbeat::Heartbeat {
        js: shared.js.clone(),
        topology: shared.topology.clone(),
        record: crate::heartbeat::Heartbeat::record(
            task.as_str(),
            &shared.model_name,
            shared.engine.forward(),
            &device,
        ),
        budget: budget.clone(),
    };
    let recycle = crate::recycle::RecycleLimits::new(&config, crate::recycle::process_seed());
    let (stop, stop_rx) = watch::channel(None);
    let heartbeat = heartbeat.start(stop_rx.clone()).await;
    let ready = Arc::new(AtomicBool::new(true));
    let http_state = http::State {
        stats: Arc::clone(&stats),
        in_flight,
        budget: budget.clone(),
        ready: Arc::clone(&ready),
        nats: nats.clone(),
        device,
        memory: memory.clone(),
    };
    let otlp_metrics = otlp_metrics(&config, &stats, &http_state).await?;
    let http_addr = http::serve(config.http_addr, http_state)
        .await
        .with_context(|| format!("cannot listen on {} (--http-addr)", config.http_addr))?;

    let plan = pull_plan(&config, &recycle, pacing);
    let admission = tokio::spawn(Admission::new(shared, queues, budget.clone(), plan).run(stop_rx));
    Ok(Consumer {
        stats,
        budget,
        worst_job_bytes,
        http_addr,
        memory,
        recycle,
        stop,
        admission,
        heartbeat,
        executor,
        ready,
        tracing,
        otlp_metrics,
    })
}

/// The span exporter (`--otlp-endpoint`), or none.
async fn tracing_exporter(config: &Config) -> anyhow::Result<Tracing> {
    match config.otlp.endpoint.clone() {
        // The exporter's HTTP client is a blocking one: build it off the runtime.
        Some(endpoint) => {
            let protocol = config.otlp.protocol;
            tokio::task::spawn_blocking(move || Tracing::otlp(&endpoint, protocol))
                .await
                .context("tracing set-up panicked")?
        }
        None => Ok(Tracing::disabled()),
    }
}

/// The metrics push (`--otlp-endpoint`), or none.
async fn otlp_metrics(
    config: &Config,
    stats: &Arc<Stats>,
    state: &http::State,
) -> anyhow::Result<Option<OtlpMetrics>> {
    let Some(endpoint) = config.otlp.endpoint.clone() else {
        return Ok(None);
    };
    let (protocol, stats, state) = (config.otlp.protocol, Arc::clone(stats), state.clone());
    let interval = config.otlp.metrics_interval();
    let metrics = tokio::task::spawn_blocking(move || {
        OtlpMetrics::start(
            &endpoint,
            protocol,
            interval,
            stats,
            Arc::new(move || state.readings()),
        )
    })
    .await
    .context("metrics set-up panicked")??;
    Ok(Some(metrics))
}

/// What `sluice init` made that this task's consumer binds to.
struct StreamBinding {
    stream: Stream,
    /// The normal level's durable consumer (the tenants' template).
    consumer: PullConsumer,
    /// Each level's durable consumer that exists.
    levels: Vec<(Priority, PullConsumer)>,
    max_deliver: i64,
    status: async_nats::jetstream::kv::Store,
}

/// Which subjects this process pulls: its model's own, or its task's plain
/// ones (the default model's, or any model's on a task `sluice init` routes
/// no model of); a model its task does not deploy is refused.
async fn model_route(
    js: &jetstream::Context,
    topology: &Topology,
    task: Task,
    model: &str,
) -> anyhow::Result<ModelRoute> {
    let Some(models) = sluice_connect::models::deployed_models(js, topology).await? else {
        return Ok(ModelRoute::Unrouted);
    };
    let ours = models.of_task(task.as_str()).any(|m| m.model == model);
    if let Some(other) = models.all().iter().find(|m| m.model == model)
        && !ours
    {
        anyhow::bail!(
            "--model-name: model {model:?} is deployed for the {} task, not {task} (the `[[models]]` settings): start this consumer with --task {}, or give it another --model-name",
            other.task,
            other.task
        );
    }
    if models.of_task(task.as_str()).next().is_none() {
        return Ok(ModelRoute::Unrouted);
    }
    let route = models
        .route(task.as_str(), model)
        .map_err(|e| anyhow::anyhow!("--model-name: {e}"))?;
    let route = match route {
        Some(own) => ModelRoute::Own(own),
        None => ModelRoute::Default,
    };
    tracing::info!(model, ?route, "pulling the jobs of this model only");
    Ok(route)
}

/// Binds the job stream, the durable consumer at each level of the task
/// and model and the status bucket; a missing one names `sluice init`.
/// What makes the streams, consumers and buckets a consumer binds to.
const INIT: &str = "run `sluice init` first";

async fn bind_stream(
    js: &jetstream::Context,
    topology: &Topology,
    task: Task,
    model: &ModelRoute,
) -> anyhow::Result<StreamBinding> {
    // Each lookup waits out a cluster electing its leaders and fails at
    // once on what `sluice init` has not made (`sluice_connect::lookup`).
    let job_stream = &topology.job_stream;
    let stream = look_up(&format!("job stream {job_stream}"), || {
        js.get_stream(job_stream)
    })
    .await
    .map_err(|e| match e {
        LookupError::Missing(e) => {
            anyhow::anyhow!("job stream {job_stream} not found: run `sluice init` first ({e})")
        }
        e => anyhow::anyhow!("cannot look up the job stream {job_stream}: {e}"),
    })?;
    let consumer_name = topology.model_consumer(task, model.route(), Priority::Normal, None);
    let consumer: PullConsumer = look_up(&format!("durable consumer {consumer_name}"), || {
        let found = stream.get_consumer(&consumer_name);
        async { found.await.map_err(anyhow::Error::from_boxed) }
    })
    .await
    .map_err(|e| {
        e.for_start_up(
            &format!("durable consumer {consumer_name} on stream {job_stream}"),
            INIT,
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
        let name = topology.model_consumer(task, model.route(), priority, None);
        match look_up(&format!("durable consumer {name}"), || {
            let found = stream.get_consumer::<pull::Config>(&name);
            async { found.await.map_err(anyhow::Error::from_boxed) }
        })
        .await
        {
            Ok(c) => levels.push((priority, c)),
            Err(LookupError::Missing(e)) => {
                tracing::warn!(consumer = %name, error = %e, "no durable consumer for {priority} priority jobs: only normal ones are taken (run `sluice init` to add it)")
            }
            Err(e) => anyhow::bail!("cannot look up the durable consumer {name}: {e}"),
        }
    }
    // The consumer's settings as the lookup read them.
    let max_deliver = match consumer.cached_info().config.max_deliver {
        n if n > 0 => n,
        _ => i64::MAX,
    };
    let bucket = &topology.status_bucket;
    let status = look_up(&format!("status bucket {bucket}"), || {
        js.get_key_value(bucket)
    })
    .await
    .map_err(|e| match e {
        LookupError::Missing(e) => {
            anyhow::anyhow!("status bucket {bucket} not found: run `sluice init` first ({e})")
        }
        e => anyhow::anyhow!("cannot open the status bucket {bucket}: {e}"),
    })?;
    Ok(StreamBinding {
        stream,
        consumer,
        levels,
        max_deliver,
        status,
    })
}

/// Admission's queues: the levels' consumers, with their MAX_DELIVERIES
/// advisories followed, and the tenants' (made on first sight, from the
/// normal level's settings and the tenant weights `sluice init` stored on
/// it).
async fn queues(
    config: &Config,
    nats: &async_nats::Client,
    shared: &Arc<Shared>,
    binding: StreamBinding,
) -> anyhow::Result<Queues> {
    let StreamBinding {
        stream,
        consumer,
        levels,
        ..
    } = binding;
    let topology = &shared.topology;
    let model = shared.model_route.route();
    for (priority, _) in &levels {
        let name = topology.model_consumer(config.task(), model, *priority, None);
        let advisories = job::dead_letter::subscribe(nats, &topology.job_stream, &name)
            .await
            .context("cannot subscribe to the MAX_DELIVERIES advisories")?;
        tokio::spawn(job::dead_letter::run(
            Arc::downgrade(shared),
            stream.clone(),
            advisories,
        ));
    }
    let consumer_name = topology.model_consumer(config.task(), model, Priority::Normal, None);
    let mut template = pull::Config::try_from_consumer_config(
        consumer.cached_info().config.clone(),
    )
    .map_err(|e| anyhow::anyhow!("durable consumer {consumer_name} is not a pull consumer: {e}"))?;
    template.metadata.retain(|k, _| !k.starts_with("_nats"));
    let weights = template
        .metadata
        .get(sluice_schemas::names::TENANT_WEIGHTS_KEY)
        .map(|w| crate::admission::parse_weights(w))
        .unwrap_or_default();
    if !weights.is_empty() {
        tracing::info!(?weights, "tenant weights");
    }
    let on_new_tenant = {
        let job_stream = topology.job_stream.clone();
        let (nats, shared, stream) = (nats.clone(), Arc::downgrade(shared), stream.clone());
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
    let tenants = TenantQueues::new(
        stream,
        topology.clone(),
        config.task(),
        model.map(str::to_string),
        template,
        Duration::from_millis(config.tenant_refresh_ms),
        on_new_tenant,
    );
    Ok(Queues {
        levels,
        tenants,
        shares: TenantShares::new(weights),
    })
}

/// Admission's knobs from the config and the task's pacing.
fn pull_plan(config: &Config, recycle: &crate::recycle::RecycleLimits, pacing: Pacing) -> PullPlan {
    PullPlan {
        max_messages: config.pull_max_messages,
        expires: Duration::from_millis(config.pull_expires_ms),
        job_limit: recycle.after_jobs,
        in_flight_cap: pacing.in_flight.map(|units| InFlightCap {
            tokens: units.cap,
            per_job: units.per_job,
        }),
        tenant_quantum: pacing.tenant_quantum,
        job_estimate: pacing.job_estimate,
    }
}

/// The S3 endpoint's `host:port` (inputs there are allowed whatever its
/// address); none for AWS's default endpoint, which is public.
fn s3_endpoint_host(config: &Config) -> Vec<String> {
    config
        .deployment
        .s3
        .s3_endpoint
        .as_deref()
        .and_then(|e| url::Url::parse(e).ok())
        .and_then(|u| crate::fetch::host_and_port(&u))
        .map(|(host, port)| format!("{host}:{port}"))
        .into_iter()
        .collect()
}
