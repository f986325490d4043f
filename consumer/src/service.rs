//! Start-up (load the model, size the budget, warm up, connect, bind) and the
//! admission loop: pull only as many jobs as the budget has room for.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use async_nats::jetstream::{self, consumer::PullConsumer};
use futures::StreamExt;
use sluice_schemas::{Task, Topology};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinSet;

use crate::batcher::{self, BatchItem};
use crate::budget::{Budget, device_headroom_bytes};
use crate::config::Config;
use crate::fetch::{FetchPolicy, Fetcher};
use crate::model::{self, EmbeddingModel, MiniLm, TextTokenizer};
use crate::sink::Sink;
use crate::telemetry::Stats;
use crate::{executor, http, job};

/// Per-job limits from the config.
pub struct Limits {
    pub max_input_bytes: u64,
    pub max_items_per_job: u64,
}

/// What one job can cost in memory, for admission. See `budget.md`.
#[derive(Debug, Clone)]
pub struct JobCost {
    pub max_input_bytes: u64,
    pub max_items: u64,
    pub per_item: ItemCost,
}

/// What an item costs, by task.
#[derive(Debug, Clone)]
pub enum ItemCost {
    /// A text: its ids while it waits, its vector (and the `.npy` copy).
    Embed { dim: u64, max_tokens_per_item: u64 },
    /// A prompt: the KV cache of its whole sequence, its ids and its text.
    Generate {
        kv_bytes_per_token: u64,
        max_prompt_tokens: u64,
        max_new_tokens: u64,
    },
}

impl JobCost {
    /// Bytes per token held while a job waits: its id, and the batch
    /// copy of it.
    const PER_TOKEN: u64 = 8;
    /// Bytes per item beyond its vector: bookkeeping and channel messages.
    const PER_ITEM: u64 = 256;
    /// generate: bytes per sequence token beyond its KV cache: the id, the
    /// text it decodes to (a token is rarely over 16 bytes) and the output's
    /// JSON copy of that text.
    const PER_GENERATED_TOKEN: u64 = 8 + 2 * 16;

    /// The most a job can hold before its inputs are read: the raw input and
    /// its parsed copy, and every item at the longest the input allows.
    pub fn worst_bytes(&self) -> u64 {
        // A JSONL item takes at least 3 bytes ("" and a newline).
        let items = self.max_items.min(self.max_input_bytes / 3 + 1);
        let tokens = match self.per_item {
            // Every embed item carries two special tokens.
            ItemCost::Embed {
                max_tokens_per_item,
                ..
            } => (items * max_tokens_per_item).min(self.max_input_bytes + 2 * items),
            // A prompt may grow by its chat template, and then generates.
            ItemCost::Generate {
                max_prompt_tokens,
                max_new_tokens,
                ..
            } => items * (max_prompt_tokens + max_new_tokens),
        };
        3 * self.max_input_bytes + self.actual_bytes(items, tokens)
    }

    /// What a job holds once tokenized. embed: `tokens` are the items' ids,
    /// plus vectors; generate: `tokens` are the sequences' whole lengths
    /// (`prompt + max_new_tokens` each), each with its KV cache.
    pub fn actual_bytes(&self, items: u64, tokens: u64) -> u64 {
        match self.per_item {
            ItemCost::Embed { dim, .. } => {
                tokens * Self::PER_TOKEN + items * (2 * 4 * dim + Self::PER_ITEM)
            }
            ItemCost::Generate {
                kv_bytes_per_token, ..
            } => tokens * (kv_bytes_per_token + Self::PER_GENERATED_TOKEN) + items * Self::PER_ITEM,
        }
    }
}

/// The task-specific end of the data path.
pub enum Engine {
    Embed(EmbedEngine),
    Generate(crate::generate::GenerateEngine),
}

impl Engine {
    /// The task this process serves.
    pub fn task(&self) -> Task {
        match self {
            Engine::Embed(_) => Task::Embed,
            Engine::Generate(_) => Task::Generate,
        }
    }
}

/// embed: tokenizer, and the batcher that feeds the executor.
pub struct EmbedEngine {
    pub dim: usize,
    pub tokenizer: Arc<TextTokenizer>,
    pub batcher: mpsc::Sender<BatchItem>,
}

/// What every job task shares.
pub struct Shared {
    pub topology: Topology,
    pub js: jetstream::Context,
    pub model_name: String,
    pub limits: Limits,
    pub cost: JobCost,
    pub fetcher: Fetcher,
    pub engine: Engine,
    pub sink: Sink,
    pub stats: Arc<Stats>,
    pub max_deliver: i64,
    pub progress_interval: Duration,
    pub retry_base: Duration,
    pub retry_max: Duration,
    pub tracing: crate::trace::Tracing,
}

/// The model side of start-up, also used by the offline `embed` command.
pub struct LoadedModel {
    pub model: Box<dyn EmbeddingModel>,
    pub tokenizer: Arc<TextTokenizer>,
    pub device: candle_core::Device,
}

pub fn load_embedding_model(config: &crate::config::ModelConfig) -> anyhow::Result<LoadedModel> {
    let device = model::open_device(config).context("cannot open the device")?;
    let dir = &config.dir(Task::Embed);
    if !dir.join("model.safetensors").is_file() {
        bail!(
            "no model at {}: run ./scripts/setup (it unpacks all-MiniLM-L6-v2 into models/), or set --model-dir",
            dir.display()
        );
    }
    let tokenizer = TextTokenizer::load(&dir.join("tokenizer.json"), config.max_tokens_per_item)
        .map_err(anyhow::Error::msg)?;
    let model = MiniLm::load(dir, device.clone(), config.max_tokens_per_item)
        .map_err(anyhow::Error::msg)?;
    Ok(LoadedModel {
        model: Box::new(model),
        tokenizer: Arc::new(tokenizer),
        device,
    })
}

/// A running consumer. Drop does not stop it: call [`Running::shutdown`].
pub struct Running {
    pub stats: Arc<Stats>,
    pub budget: Budget,
    pub http_addr: std::net::SocketAddr,
    stop: watch::Sender<Option<Duration>>,
    admission: tokio::task::JoinHandle<anyhow::Result<()>>,
    executor: std::thread::JoinHandle<()>,
    ready: Arc<AtomicBool>,
    tracing: crate::trace::Tracing,
    otlp_metrics: Option<crate::otlp_metrics::OtlpMetrics>,
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

    /// True when the admission loop has ended by itself (a bug).
    pub fn is_finished(&self) -> bool {
        self.admission.is_finished()
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
    let tracing = match config.otlp_endpoint.clone() {
        // The exporter's HTTP client is a blocking one: build it off the runtime.
        Some(endpoint) => {
            let protocol = config.otlp_protocol;
            tokio::task::spawn_blocking(move || crate::trace::Tracing::otlp(&endpoint, protocol))
                .await
                .context("tracing set-up panicked")??
        }
        None => crate::trace::Tracing::disabled(),
    };
    let stats = Arc::new(Stats::default());
    let Started {
        engine,
        model_thread: executor,
        cost,
        budget,
        device,
    } = match task {
        Task::Embed => start_embed(&config, &stats, &tracing)?,
        Task::Generate => start_generate(&config, &stats)?,
    };

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

    let credentials = config
        .s3_access_key_id
        .as_deref()
        .zip(config.s3_secret_access_key.as_ref());
    let s3 = sluice_connect::s3_client(
        config.s3_endpoint.as_deref(),
        &config.s3_region,
        credentials,
    )
    .await;
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
            allow_link_local: config.input_allow_link_local,
            max_bytes: config.max_input_bytes,
            timeout: Duration::from_secs(config.fetch_timeout_secs),
        })
        .map_err(anyhow::Error::msg)?,
        engine,
        sink: Sink {
            s3,
            bucket: config.output_bucket.clone(),
            prefix: config.output_prefix.clone(),
            inline_max_bytes: config.inline_output_max_bytes,
            nats: nats.clone(),
            js,
            status,
        },
        stats: Arc::clone(&stats),
        max_deliver,
        progress_interval: Duration::from_secs(config.progress_interval_secs),
        retry_base: Duration::from_millis(config.retry_base_ms),
        retry_max: Duration::from_millis(config.retry_max_ms),
        tracing: tracing.clone(),
    });

    let advisories = crate::advisory::subscribe(
        &shared.sink.nats,
        &shared.topology.job_stream,
        &consumer_name,
    )
    .await
    .context("cannot subscribe to the MAX_DELIVERIES advisories")?;
    tokio::spawn(crate::advisory::run(
        Arc::downgrade(&shared),
        stream,
        advisories,
    ));

    let ready = Arc::new(AtomicBool::new(true));
    let http_state = http::State {
        stats: Arc::clone(&stats),
        budget: budget.clone(),
        ready: Arc::clone(&ready),
        nats: nats.clone(),
        device,
    };
    let otlp_metrics = match config.otlp_endpoint.clone() {
        Some(endpoint) => {
            let (protocol, stats, state) =
                (config.otlp_protocol, Arc::clone(&stats), http_state.clone());
            let interval = Duration::from_secs(config.otlp_metrics_interval_secs.max(1));
            Some(
                tokio::task::spawn_blocking(move || {
                    crate::otlp_metrics::OtlpMetrics::start(
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

    let (stop, stop_rx) = watch::channel(None);
    let admission = tokio::spawn(admit(
        shared,
        consumer,
        budget.clone(),
        PullPlan {
            max_messages: config.pull_max_messages,
            expires: Duration::from_millis(config.pull_expires_ms),
        },
        stop_rx,
    ));
    Ok(Running {
        stats,
        budget,
        http_addr,
        stop,
        admission,
        executor,
        ready,
        tracing,
        otlp_metrics,
    })
}

/// What the task-specific half of start-up hands the rest.
struct Started {
    engine: Engine,
    /// The thread that owns the model (the executor, or the generation thread).
    model_thread: std::thread::JoinHandle<()>,
    cost: JobCost,
    budget: Budget,
    /// The device's name for logs and status, e.g. `cpu` or `cuda:0`.
    device: String,
}

fn device_name(device: &candle_core::Device) -> String {
    match device.location() {
        candle_core::DeviceLocation::Cpu => "cpu".to_string(),
        candle_core::DeviceLocation::Cuda { gpu_id } => format!("cuda:{gpu_id}"),
        other => format!("{other:?}"),
    }
}

/// The budget: explicit, or a fraction of the headroom left after loading the model.
fn budget_limit(config: &Config, device: &candle_core::Device) -> anyhow::Result<u64> {
    Ok(match config.memory_budget_bytes {
        Some(b) => b,
        None => {
            let headroom = device_headroom_bytes(device).map_err(anyhow::Error::msg)?;
            (headroom as f64 * config.memory_fraction) as u64
        }
    })
}

/// embed: load MiniLM, size and check the budget, warm up, start the
/// batcher and the executor thread.
fn start_embed(
    config: &Config,
    stats: &Arc<Stats>,
    tracing: &crate::trace::Tracing,
) -> anyhow::Result<Started> {
    let loaded = load_embedding_model(&config.model)?;
    let device = device_name(&loaded.device);
    let model = loaded.model;
    let dim = model.dim();
    let limit = budget_limit(config, &loaded.device)?;
    let (n, len) =
        model::worst_batch_shape(config.model.max_batch_tokens, model.max_tokens_per_item());
    let activation = model.batch_cost_bytes(n, len);
    let cost = JobCost {
        max_input_bytes: config.max_input_bytes,
        max_items: config.max_items_per_job(),
        per_item: ItemCost::Embed {
            dim: dim as u64,
            max_tokens_per_item: model.max_tokens_per_item() as u64,
        },
    };
    let worst_job = cost.worst_bytes();
    if activation + worst_job > limit {
        bail!(
            "the memory budget ({} MiB) cannot hold one batch at max_batch_tokens={} ({} MiB of activations \
             for {n} items x {len} tokens) plus one job at its worst case ({} MiB, from max_input_bytes={} and \
             max_items_per_job={}): raise --memory-budget (or --memory-fraction), or lower --max-batch-tokens, \
             --max-input-bytes or --max-items-per-job",
            limit >> 20,
            config.model.max_batch_tokens,
            activation >> 20,
            worst_job >> 20,
            config.max_input_bytes,
            config.max_items_per_job(),
        );
    }
    // Warm up with the largest batch the budget allows: it proves the shape
    // fits and takes the first-call costs out of the first job.
    let warm = Instant::now();
    let dummy: Vec<Vec<u32>> = (0..n).map(|_| vec![101u32; len]).collect();
    let refs: Vec<&[u32]> = dummy.iter().map(Vec::as_slice).collect();
    model.embed(&refs).map_err(|e| {
        anyhow::anyhow!(
            "warm-up with the largest batch ({n} x {len} tokens) failed: {e}; lower --max-batch-tokens or --memory-budget"
        )
    })?;
    drop(dummy);
    tracing::info!(
        task = "embed",
        forward = model.forward_name(),
        cpu_kernels = model::cpu::level().name(),
        budget_mib = limit >> 20,
        activation_mib = activation >> 20,
        worst_job_kib = worst_job >> 10,
        warmup_ms = warm.elapsed().as_millis() as u64,
        "model ready"
    );
    // The one batch in flight holds its activations outside the job budget.
    let budget = Budget::new(limit - activation);
    let (item_tx, item_rx) = mpsc::channel(4096);
    let (batch_tx, batch_rx) = mpsc::channel(1);
    let executor = executor::spawn(
        model,
        batch_rx,
        Arc::clone(stats),
        budget.clone(),
        tracing.clone(),
    )?;
    tokio::spawn(batcher::run(
        item_rx,
        batch_tx,
        config.model.max_batch_tokens,
        Duration::from_millis(config.max_wait_ms),
    ));
    let engine = Engine::Embed(EmbedEngine {
        dim,
        tokenizer: loaded.tokenizer,
        batcher: item_tx,
    });
    Ok(Started {
        engine,
        model_thread: executor,
        cost,
        budget,
        device,
    })
}

/// generate: load the GGUF, check the limits against the model and the
/// budget (one step's activations plus one job at its worst), warm up with
/// the longest prompt chunk over the longest context, start the generation
/// thread.
fn start_generate(config: &Config, stats: &Arc<Stats>) -> anyhow::Result<Started> {
    let g = &config.generate;
    let device = model::open_device(&config.model).context("cannot open the device")?;
    let (llama, tokenizer) =
        crate::generate::load(&config.model.dir(Task::Generate), g.weights, &device)?;
    let context = g.max_prompt_tokens + g.max_new_tokens;
    if context > llama.config.context_length {
        bail!(
            "max_prompt_tokens ({}) + max_new_tokens ({}) exceed the model's context of {} tokens: lower --max-prompt-tokens or --max-new-tokens",
            g.max_prompt_tokens,
            g.max_new_tokens,
            llama.config.context_length
        );
    }
    let limit = budget_limit(config, &device)?;
    let chunk = (g.max_step_tokens / 2).max(1);
    let activation =
        llama
            .config
            .step_activation_bytes(g.max_step_tokens, g.max_sequences, chunk, context);
    let cost = JobCost {
        max_input_bytes: config.max_input_bytes,
        max_items: config.max_items_per_job(),
        per_item: ItemCost::Generate {
            kv_bytes_per_token: llama.config.kv_bytes_per_token(),
            max_prompt_tokens: g.max_prompt_tokens as u64,
            max_new_tokens: g.max_new_tokens as u64,
        },
    };
    let worst_job = cost.worst_bytes();
    if activation + worst_job > limit {
        bail!(
            "the memory budget ({} MiB) cannot hold one generation step ({} MiB of activations at max_step_tokens={} \
             and max_sequences={}) plus one job at its worst case ({} MiB: max_items_per_job={} prompts of \
             max_prompt_tokens={} + max_new_tokens={} tokens at {} KiB of KV cache per token): raise --memory-budget \
             (or --memory-fraction), or lower --max-items-per-job, --max-prompt-tokens or --max-new-tokens",
            limit >> 20,
            activation >> 20,
            g.max_step_tokens,
            g.max_sequences,
            worst_job >> 20,
            config.max_items_per_job(),
            g.max_prompt_tokens,
            g.max_new_tokens,
            llama.config.kv_bytes_per_token() >> 10,
        );
    }
    // Warm up: the longest prompt chunk into a cache as long as a sequence can be.
    let warm = Instant::now();
    {
        let mut cache = llama.new_cache(context).map_err(|e| {
            anyhow::anyhow!("warm-up failed: {e}; lower --max-prompt-tokens or --max-new-tokens")
        })?;
        let tokens = vec![tokenizer.eos_id; chunk.min(context)];
        llama
            .forward(&mut [model::llama::Segment {
                cache: &mut cache,
                tokens: &tokens,
            }])
            .map_err(|e| {
                anyhow::anyhow!(
                    "warm-up with a {chunk}-token prompt chunk failed: {e}; lower --max-step-tokens or --memory-budget"
                )
            })?;
    }
    let job_budget = limit - activation;
    tracing::info!(
        task = "generate",
        budget_mib = limit >> 20,
        activation_mib = activation >> 20,
        worst_job_mib = worst_job >> 20,
        kv_bytes_per_token = llama.config.kv_bytes_per_token(),
        weights = ?g.weights,
        cpu_kernels = model::cpu::level().name(),
        warmup_ms = warm.elapsed().as_millis() as u64,
        "model ready"
    );
    let budget = Budget::new(job_budget);
    let tokenizer = Arc::new(tokenizer);
    let (tx, rx) = mpsc::channel(1024);
    let executor = crate::generate::spawn(
        llama,
        Arc::clone(&tokenizer),
        rx,
        crate::generate::StepSettings {
            max_step_tokens: g.max_step_tokens,
            max_sequences: g.max_sequences,
            kv_budget: job_budget,
        },
        Arc::clone(stats),
    )?;
    let engine = Engine::Generate(crate::generate::GenerateEngine {
        tokenizer,
        sequences: tx,
        limits: crate::generate::GenerateLimits {
            max_prompt_tokens: g.max_prompt_tokens,
            max_new_tokens: g.max_new_tokens,
            default_max_new_tokens: g.default_max_new_tokens(),
        },
    });
    Ok(Started {
        engine,
        model_thread: executor,
        cost,
        budget,
        device: device_name(&device),
    })
}

struct PullPlan {
    max_messages: usize,
    expires: Duration,
}

/// Admission: reserve a job's worst case for each message before asking for
/// it, pull at most that many, hand each to its own task, and release what
/// the pull did not fill. On stop: drain (see [`Running::shutdown`]).
async fn admit(
    shared: Arc<Shared>,
    consumer: PullConsumer,
    budget: Budget,
    plan: PullPlan,
    mut stop: watch::Receiver<Option<Duration>>,
) -> anyhow::Result<()> {
    let worst = shared.cost.worst_bytes();
    let mut jobs = JoinSet::new();
    let (abort_tx, abort) = watch::channel(false);
    let mut backoff = Duration::from_millis(100);
    'pulling: while stop.borrow().is_none() {
        // Reap finished job tasks.
        while jobs.try_join_next().is_some() {}
        let asked_at = Instant::now();
        let first = tokio::select! {
            r = budget.reserve(worst) => r,
            _ = stop.changed() => break 'pulling,
        };
        let mut reservations = vec![first];
        while reservations.len() < plan.max_messages {
            match budget.try_reserve(worst) {
                Some(r) => reservations.push(r),
                None => break,
            }
        }
        let pull = consumer
            .batch()
            .max_messages(reservations.len())
            .expires(plan.expires)
            .messages()
            .await;
        let mut messages = match pull {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!(error = %e, retry_in_ms = backoff.as_millis() as u64, "pull failed");
                drop(reservations);
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {},
                    _ = stop.changed() => break 'pulling,
                }
                backoff = (backoff * 2).min(Duration::from_secs(5));
                continue;
            }
        };
        backoff = Duration::from_millis(100);
        loop {
            let next = tokio::select! {
                m = messages.next() => m,
                _ = stop.changed() => {
                    // What this pull still delivers goes back at once.
                    let deadline = tokio::time::Instant::now() + plan.expires + Duration::from_secs(1);
                    while let Ok(Some(Ok(msg))) = tokio::time::timeout_at(deadline, messages.next()).await {
                        job::nak_now(&msg).await;
                    }
                    break 'pulling;
                }
            };
            match next {
                Some(Ok(msg)) => {
                    let Some(reservation) = reservations.pop() else {
                        tracing::error!(
                            "bug: a pull delivered more messages than it asked for; Nak'ing it"
                        );
                        job::nak_now(&msg).await;
                        continue;
                    };
                    shared.stats.jobs_in_flight.fetch_add(1, Ordering::Relaxed);
                    let shared = Arc::clone(&shared);
                    let abort = abort.clone();
                    jobs.spawn(async move {
                        let stats = Arc::clone(&shared.stats);
                        job::handle(shared, msg, reservation, asked_at, abort).await;
                        stats.jobs_in_flight.fetch_sub(1, Ordering::Relaxed);
                    });
                }
                Some(Err(e)) => {
                    tracing::debug!(error = %e, "pull ended with an error");
                    break;
                }
                None => break,
            }
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
