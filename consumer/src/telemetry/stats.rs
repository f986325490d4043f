//! Typed telemetry: one place records each event as counters and histograms
//! (served as Prometheus text on `/metrics`, and on `/debug/memory`) and as a
//! log line. Recorded per batch and per job, never per item.
//!
//! Metric names and label values are a fixed set: error codes come from
//! [`ErrorCode::ALL`], stages from [`STAGES`]; every series is printed from
//! the start (at zero), so dashboards and alerts never see a series appear.

use std::fmt::Write;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use sluice_schemas::{ErrorCode, Timings};

use crate::budget::BudgetSnapshot;
use crate::memory::{DeviceMemory, MemoryFigures};

/// Histograms recorded as events happen, when metrics are also pushed over
/// OTLP (`super::otlp` makes them and sets them once, at start-up).
pub struct OtelHistograms {
    pub stage_seconds: opentelemetry::metrics::Histogram<f64>,
    pub batch_items: opentelemetry::metrics::Histogram<f64>,
    pub batch_padded_tokens: opentelemetry::metrics::Histogram<f64>,
}

/// What one embed batch was, for [`Stats::record_batch`].
#[derive(Debug, Clone, Copy)]
pub struct BatchFigures {
    pub id: u64,
    pub items: usize,
    /// The longest item's tokens: what a padded batch pads to.
    pub padded_len: usize,
    pub padded_tokens: usize,
    pub real_tokens: usize,
    /// Items of more than one job.
    pub multi_job: bool,
    /// Items of more than one length.
    pub mixed_length: bool,
}

/// A Prometheus histogram with fixed buckets (upper bounds, `+Inf` implied).
pub struct Histogram {
    bounds: &'static [f64],
    counts: Vec<AtomicU64>,
    count: AtomicU64,
    /// The sum, as f64 bits.
    sum: AtomicU64,
}

impl Histogram {
    pub fn new(bounds: &'static [f64]) -> Histogram {
        Histogram {
            bounds,
            counts: bounds.iter().map(|_| AtomicU64::new(0)).collect(),
            count: AtomicU64::new(0),
            sum: AtomicU64::new(0f64.to_bits()),
        }
    }

    pub fn observe(&self, value: f64) {
        if let Some(i) = self.bounds.iter().position(|b| value <= *b) {
            self.counts[i].fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        let _ = self
            .sum
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
                Some((f64::from_bits(bits) + value).to_bits())
            });
    }

    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    pub fn sum(&self) -> f64 {
        f64::from_bits(self.sum.load(Ordering::Relaxed))
    }

    /// Writes the `_bucket`, `_sum` and `_count` lines; `labels` is empty or
    /// `key="value"` pairs.
    fn render(&self, out: &mut String, name: &str, labels: &str) {
        let sep = if labels.is_empty() { "" } else { "," };
        let mut cumulative = 0;
        for (bound, n) in self.bounds.iter().zip(&self.counts) {
            cumulative += n.load(Ordering::Relaxed);
            let _ = writeln!(
                out,
                "{name}_bucket{{{labels}{sep}le=\"{bound}\"}} {cumulative}"
            );
        }
        let count = self.count();
        let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {count}");
        let braces = if labels.is_empty() {
            String::new()
        } else {
            format!("{{{labels}}}")
        };
        let _ = writeln!(out, "{name}_sum{braces} {}", self.sum());
        let _ = writeln!(out, "{name}_count{braces} {count}");
    }
}

/// The stages of a job, as in the result's `timings_ms` (and trace spans).
pub const STAGES: [&str; 7] = [
    "queue",
    "fetch",
    "tokenize",
    "batch_wait",
    "inference",
    "write",
    "total",
];

const SECONDS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];
const BATCH_ITEMS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0];
const BATCH_TOKENS: &[f64] = &[
    64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0, 32768.0,
];

pub struct Stats {
    pub batches: AtomicU64,
    pub batches_failed: AtomicU64,
    pub batch_items: AtomicU64,
    pub batch_real_tokens: AtomicU64,
    pub batch_padded_tokens: AtomicU64,
    /// The largest padded cost of any batch so far.
    pub max_batch_padded_tokens: AtomicU64,
    /// Batches holding items of more than one job.
    pub batches_multi_job: AtomicU64,
    /// Batches holding items of different lengths.
    pub batches_mixed_length: AtomicU64,
    pub model_micros: AtomicU64,
    pub jobs_ok: AtomicU64,
    pub jobs_already_final: AtomicU64,
    /// Deliveries after the first (attempt > 1).
    pub redeliveries: AtomicU64,
    pub dead_lettered: AtomicU64,
    jobs_failed: Mutex<[u64; ErrorCode::ALL.len()]>,
    jobs_retried: Mutex<[u64; ErrorCode::ALL.len()]>,
    pub items_done: AtomicU64,
    pub tokens_done: AtomicU64,
    /// Jobs this process took and finished, whatever the outcome.
    pub jobs_finished: AtomicU64,
    /// Times this process recycled itself, by [`RecycleReason`] (at most once).
    recycles: [AtomicU64; 3],
    pub batch_items_histogram: Histogram,
    pub batch_padded_tokens_histogram: Histogram,
    /// generate: forward steps run, their model time, and tokens generated.
    pub generate_steps: AtomicU64,
    pub generate_step_micros: AtomicU64,
    pub generated_tokens: AtomicU64,
    /// generate: sequences holding a KV cache after the last step.
    pub generate_running: AtomicU64,
    /// generate: sequences dropped before they finished (job cancelled,
    /// client gone, drained), and stream messages published.
    pub cancelled_sequences: AtomicU64,
    pub stream_messages: AtomicU64,
    /// generate: KV-cache bytes the running sequences hold, and the most so far.
    pub kv_reserved_bytes: AtomicU64,
    pub kv_peak_bytes: AtomicU64,
    stage_seconds: [Histogram; STAGES.len()],
    /// From publish to pull, per priority level (high, normal, low).
    queue_wait_by_priority: [Histogram; 3],
    /// Tokens the model has finished, by the job's tenant.
    tenant_tokens: Mutex<std::collections::BTreeMap<String, u64>>,
    /// The OTLP histograms, when metrics are pushed over OTLP.
    pub otel: std::sync::OnceLock<OtelHistograms>,
}

impl Default for Stats {
    fn default() -> Self {
        Stats {
            batches: AtomicU64::new(0),
            batches_failed: AtomicU64::new(0),
            batch_items: AtomicU64::new(0),
            batch_real_tokens: AtomicU64::new(0),
            batch_padded_tokens: AtomicU64::new(0),
            max_batch_padded_tokens: AtomicU64::new(0),
            batches_multi_job: AtomicU64::new(0),
            batches_mixed_length: AtomicU64::new(0),
            model_micros: AtomicU64::new(0),
            jobs_ok: AtomicU64::new(0),
            jobs_already_final: AtomicU64::new(0),
            redeliveries: AtomicU64::new(0),
            dead_lettered: AtomicU64::new(0),
            jobs_failed: Mutex::new([0; ErrorCode::ALL.len()]),
            jobs_retried: Mutex::new([0; ErrorCode::ALL.len()]),
            items_done: AtomicU64::new(0),
            tokens_done: AtomicU64::new(0),
            jobs_finished: AtomicU64::new(0),
            recycles: Default::default(),
            batch_items_histogram: Histogram::new(BATCH_ITEMS),
            batch_padded_tokens_histogram: Histogram::new(BATCH_TOKENS),
            generate_steps: AtomicU64::new(0),
            generate_step_micros: AtomicU64::new(0),
            generated_tokens: AtomicU64::new(0),
            generate_running: AtomicU64::new(0),
            cancelled_sequences: AtomicU64::new(0),
            stream_messages: AtomicU64::new(0),
            kv_reserved_bytes: AtomicU64::new(0),
            kv_peak_bytes: AtomicU64::new(0),
            stage_seconds: std::array::from_fn(|_| Histogram::new(SECONDS)),
            queue_wait_by_priority: std::array::from_fn(|_| Histogram::new(SECONDS)),
            tenant_tokens: Mutex::default(),
            otel: std::sync::OnceLock::new(),
        }
    }
}

fn code_index(code: ErrorCode) -> usize {
    ErrorCode::ALL.iter().position(|c| *c == code).unwrap_or(0)
}

impl Stats {
    pub fn record_batch(&self, batch: &BatchFigures, model_ms: f64, ok: bool) {
        let padded = batch.padded_tokens as u64;
        let real = batch.real_tokens as u64;
        let BatchFigures {
            multi_job,
            mixed_length,
            ..
        } = *batch;
        self.batches.fetch_add(1, Ordering::Relaxed);
        if !ok {
            self.batches_failed.fetch_add(1, Ordering::Relaxed);
        }
        self.batch_items
            .fetch_add(batch.items as u64, Ordering::Relaxed);
        self.batch_real_tokens.fetch_add(real, Ordering::Relaxed);
        self.batch_padded_tokens
            .fetch_add(padded, Ordering::Relaxed);
        self.max_batch_padded_tokens
            .fetch_max(padded, Ordering::Relaxed);
        self.model_micros
            .fetch_add((model_ms * 1e3) as u64, Ordering::Relaxed);
        self.batch_items_histogram.observe(batch.items as f64);
        self.batch_padded_tokens_histogram.observe(padded as f64);
        if let Some(otel) = self.otel.get() {
            otel.batch_items.record(batch.items as f64, &[]);
            otel.batch_padded_tokens.record(padded as f64, &[]);
        }
        if multi_job {
            self.batches_multi_job.fetch_add(1, Ordering::Relaxed);
        }
        if mixed_length {
            self.batches_mixed_length.fetch_add(1, Ordering::Relaxed);
        }
        tracing::debug!(
            batch = batch.id,
            items = batch.items,
            padded_len = batch.padded_len,
            padded_tokens = padded,
            real_tokens = real,
            multi_job,
            model_ms,
            ok,
            "batch"
        );
    }

    /// One generation step: its time, and the running set and KV it left.
    pub fn record_generate_step(
        &self,
        took: std::time::Duration,
        running: usize,
        kv_reserved: u64,
        kv_peak: u64,
    ) {
        self.generate_steps.fetch_add(1, Ordering::Relaxed);
        self.generate_step_micros
            .fetch_add(took.as_micros() as u64, Ordering::Relaxed);
        self.generate_running
            .store(running as u64, Ordering::Relaxed);
        self.kv_reserved_bytes.store(kv_reserved, Ordering::Relaxed);
        self.kv_peak_bytes.fetch_max(kv_peak, Ordering::Relaxed);
    }

    /// The running set after sequences left it between steps (cancelled).
    pub fn record_generate_running(&self, running: usize, kv_reserved: u64) {
        self.generate_running
            .store(running as u64, Ordering::Relaxed);
        self.kv_reserved_bytes.store(kv_reserved, Ordering::Relaxed);
    }

    /// The stage latencies of a settled job (those it reached).
    pub fn record_timings(&self, t: &Timings) {
        let stages = [
            t.queue,
            t.fetch,
            t.tokenize,
            t.batch_wait,
            t.inference,
            t.write,
            t.total,
        ];
        let otel = self.otel.get();
        for ((h, ms), stage) in self.stage_seconds.iter().zip(stages).zip(STAGES) {
            if let Some(ms) = ms {
                h.observe(ms / 1e3);
                if let Some(otel) = otel {
                    otel.stage_seconds
                        .record(ms / 1e3, &[opentelemetry::KeyValue::new("stage", stage)]);
                }
            }
        }
    }

    /// How long a job of `priority` waited in the stream.
    pub fn record_queue_wait(&self, priority: sluice_schemas::Priority, seconds: f64) {
        self.queue_wait_by_priority[priority.index()].observe(seconds);
    }

    /// The model finished `tokens` of `tenant`'s (per batch item for embed,
    /// so the split between tenants is visible within a long job).
    pub fn add_tenant_tokens(&self, tenant: &str, tokens: u64) {
        let mut m = self.tenant_tokens.lock().unwrap_or_else(|e| e.into_inner());
        match m.get_mut(tenant) {
            Some(n) => *n += tokens,
            None => {
                m.insert(tenant.to_string(), tokens);
            }
        }
    }

    /// Tokens finished so far by tenant.
    pub fn tenant_tokens(&self) -> Vec<(String, u64)> {
        let m = self.tenant_tokens.lock().unwrap_or_else(|e| e.into_inner());
        m.iter().map(|(t, n)| (t.clone(), *n)).collect()
    }

    /// The mean real tokens of the jobs answered so far (none before any).
    pub fn mean_tokens_per_job(&self) -> Option<u64> {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        get(&self.tokens_done).checked_div(get(&self.jobs_ok))
    }

    pub fn record_job_ok(&self, items: u64, tokens: u64) {
        self.jobs_ok.fetch_add(1, Ordering::Relaxed);
        self.items_done.fetch_add(items, Ordering::Relaxed);
        self.tokens_done.fetch_add(tokens, Ordering::Relaxed);
    }

    pub fn record_job_failed(&self, code: ErrorCode) {
        if let Ok(mut m) = self.jobs_failed.lock() {
            m[code_index(code)] += 1;
        }
    }

    pub fn record_job_retried(&self, code: ErrorCode) {
        if let Ok(mut m) = self.jobs_retried.lock() {
            m[code_index(code)] += 1;
        }
    }

    /// Transient failures Nak'ed for retry, by code (codes with none left out).
    pub fn jobs_retried(&self) -> Vec<(ErrorCode, u64)> {
        let mut counts = all_codes(&self.jobs_retried, |_| true);
        counts.retain(|(_, n)| *n > 0);
        counts
    }

    pub fn record_recycle(&self, reason: RecycleReason) {
        self.recycles[reason as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Recycles by reason, every reason listed.
    pub fn recycles(&self) -> Vec<(RecycleReason, u64)> {
        RecycleReason::ALL
            .iter()
            .map(|r| (*r, self.recycles[*r as usize].load(Ordering::Relaxed)))
            .collect()
    }

    /// The Prometheus text exposition of every metric.
    pub fn render_prometheus(&self, now: &Readings) -> String {
        let mut out = String::new();
        for m in SCALARS.iter().filter(|m| m.present(now)) {
            let (name, kind) = (m.name, m.kind.as_str());
            let _ = writeln!(
                out,
                "# HELP {name} {}\n# TYPE {name} {kind}\n{name} {}",
                m.help,
                (m.read)(self, now)
            );
        }
        for m in BY_CODE {
            let name = m.name;
            let _ = writeln!(out, "# HELP {name} {}\n# TYPE {name} counter", m.help);
            for (code, n) in (m.read)(self) {
                let _ = writeln!(out, "{name}{{code=\"{}\"}} {n}", code.as_str());
            }
        }
        let name = RECYCLES_NAME;
        let _ = writeln!(out, "# HELP {name} {RECYCLES_HELP}\n# TYPE {name} counter");
        for (reason, n) in self.recycles() {
            let _ = writeln!(out, "{name}{{reason=\"{}\"}} {n}", reason.as_str());
        }
        let name = TENANT_TOKENS_NAME;
        let _ = writeln!(
            out,
            "# HELP {name} {TENANT_TOKENS_HELP}\n# TYPE {name} counter"
        );
        for (tenant, n) in self.tenant_tokens() {
            let _ = writeln!(out, "{name}{{tenant=\"{tenant}\"}} {n}");
        }
        for m in HISTOGRAMS {
            let name = m.name;
            let _ = writeln!(out, "# HELP {name} {}\n# TYPE {name} histogram", m.help);
            match m.label {
                None => (m.read)(self, 0).render(&mut out, name, ""),
                Some((label, values)) => {
                    for (i, value) in values.iter().enumerate() {
                        (m.read)(self, i).render(&mut out, name, &format!("{label}=\"{value}\""));
                    }
                }
            }
        }
        out
    }
}

/// What metrics read besides [`Stats`]: the budget, the memory and the
/// readiness now.
pub struct Readings {
    pub budget: BudgetSnapshot,
    /// What admission took and has not settled.
    pub in_flight: std::sync::Arc<crate::in_flight::InFlight>,
    pub memory: MemoryFigures,
    pub ready: bool,
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum MetricKind {
    Counter,
    Gauge,
}

impl MetricKind {
    pub fn as_str(self) -> &'static str {
        match self {
            MetricKind::Counter => "counter",
            MetricKind::Gauge => "gauge",
        }
    }
}

/// One number: its Prometheus name (counters end in `_total`), kind, help
/// text, and how to read it. `/metrics` and the OTLP push both print from
/// [`SCALARS`], [`BY_CODE`] and [`HISTOGRAMS`], so the two never drift apart.
pub struct Scalar {
    pub name: &'static str,
    pub kind: MetricKind,
    /// Counted in bytes (the OTLP unit `By`).
    pub bytes: bool,
    pub help: &'static str,
    pub read: fn(&Stats, &Readings) -> f64,
    /// Only there when the model runs on a GPU (`Readings::memory.device`).
    pub device_only: bool,
}

impl Scalar {
    /// Whether the metric has a value in `now` (device metrics on a GPU only).
    pub fn present(&self, now: &Readings) -> bool {
        !self.device_only || now.memory.device.is_some()
    }
}

/// The OTLP name of a Prometheus metric: without `_total`, which a
/// collector's Prometheus exporter adds back. A counter whose bare name is
/// also a histogram's gets `_sum`.
pub fn otlp_name(prometheus_name: &str) -> String {
    let bare = prometheus_name
        .strip_suffix("_total")
        .unwrap_or(prometheus_name);
    if HISTOGRAMS.iter().any(|h| h.name == bare) {
        format!("{bare}_sum")
    } else {
        bare.to_string()
    }
}

fn load(a: &AtomicU64) -> f64 {
    a.load(Ordering::Relaxed) as f64
}

const fn counter(
    name: &'static str,
    help: &'static str,
    read: fn(&Stats, &Readings) -> f64,
) -> Scalar {
    Scalar {
        name,
        kind: MetricKind::Counter,
        bytes: false,
        help,
        read,
        device_only: false,
    }
}

const fn gauge(
    name: &'static str,
    help: &'static str,
    read: fn(&Stats, &Readings) -> f64,
) -> Scalar {
    Scalar {
        name,
        kind: MetricKind::Gauge,
        bytes: false,
        help,
        read,
        device_only: false,
    }
}

const fn bytes_gauge(
    name: &'static str,
    help: &'static str,
    read: fn(&Stats, &Readings) -> f64,
) -> Scalar {
    Scalar {
        name,
        kind: MetricKind::Gauge,
        bytes: true,
        help,
        read,
        device_only: false,
    }
}

pub const SCALARS: &[Scalar] = &[
    gauge(
        "sluice_ready",
        "1 when taking jobs (see /readyz).",
        |_, r| f64::from(u8::from(r.ready)),
    ),
    counter("sluice_jobs_ok_total", "Jobs answered ok.", |s, _| {
        load(&s.jobs_ok)
    }),
    counter(
        "sluice_jobs_already_answered_total",
        "Redeliveries of jobs already answered (acked without running).",
        |s, _| load(&s.jobs_already_final),
    ),
    counter(
        "sluice_redeliveries_total",
        "Deliveries after a job's first.",
        |s, _| load(&s.redeliveries),
    ),
    counter(
        "sluice_dead_lettered_total",
        "Jobs published to the dead-letter stream.",
        |s, _| load(&s.dead_lettered),
    ),
    counter(
        "sluice_items_total",
        "Items (texts embedded, or prompts generated) of ok jobs.",
        |s, _| load(&s.items_done),
    ),
    counter("sluice_tokens_total", "Real tokens in ok jobs.", |s, _| {
        load(&s.tokens_done)
    }),
    counter("sluice_batches_total", "Batches run.", |s, _| {
        load(&s.batches)
    }),
    counter(
        "sluice_batches_failed_total",
        "Batches that failed.",
        |s, _| load(&s.batches_failed),
    ),
    counter(
        "sluice_batch_real_tokens_total",
        "Real tokens over all batches.",
        |s, _| load(&s.batch_real_tokens),
    ),
    counter(
        "sluice_batch_padded_tokens_total",
        "Padded tokens (items x longest) over all batches.",
        |s, _| load(&s.batch_padded_tokens),
    ),
    gauge(
        "sluice_batch_padded_tokens_max",
        "Largest padded cost of a batch so far (at most --max-batch-tokens).",
        |s, _| load(&s.max_batch_padded_tokens),
    ),
    gauge(
        "sluice_batch_padding_ratio",
        "Share of padded tokens that are padding, over all batches.",
        |s, _| {
            let padded = load(&s.batch_padded_tokens);
            if padded == 0.0 {
                0.0
            } else {
                1.0 - load(&s.batch_real_tokens) / padded
            }
        },
    ),
    counter(
        "sluice_batches_multi_job_total",
        "Batches holding items of several jobs.",
        |s, _| load(&s.batches_multi_job),
    ),
    counter(
        "sluice_generate_steps_total",
        "generate: forward steps run (each over every running sequence).",
        |s, _| load(&s.generate_steps),
    ),
    counter(
        "sluice_generate_step_seconds_total",
        "generate: time spent in forward steps.",
        |s, _| load(&s.generate_step_micros) / 1e6,
    ),
    counter(
        "sluice_generated_tokens_total",
        "generate: tokens generated by finished sequences.",
        |s, _| load(&s.generated_tokens),
    ),
    gauge(
        "sluice_generate_running_sequences",
        "generate: sequences decoding together after the last step (at most --max-sequences).",
        |s, _| load(&s.generate_running),
    ),
    counter(
        "sluice_generate_cancelled_sequences_total",
        "generate: sequences stopped before they finished (job cancelled, client gone, drained); each frees its KV cache before the next step.",
        |s, _| load(&s.cancelled_sequences),
    ),
    counter(
        "sluice_stream_messages_total",
        "generate: stream messages published for jobs that set output.stream.",
        |s, _| load(&s.stream_messages),
    ),
    bytes_gauge(
        "sluice_kv_cache_bytes",
        "generate: KV-cache bytes the running sequences hold.",
        |s, _| load(&s.kv_reserved_bytes),
    ),
    bytes_gauge(
        "sluice_kv_cache_peak_bytes",
        "generate: most KV-cache bytes held at once (never above the budget).",
        |s, _| load(&s.kv_peak_bytes),
    ),
    gauge(
        "sluice_jobs_in_flight",
        "Jobs admitted and not yet settled.",
        |_, r| r.in_flight.jobs() as f64,
    ),
    gauge(
        "sluice_tokens_in_flight",
        "Real tokens of tokenized jobs not yet settled.",
        |_, r| r.in_flight.tokens() as f64,
    ),
    bytes_gauge(
        "sluice_budget_bytes",
        "Memory budget for jobs: --memory-budget (or the free-memory fraction) minus one batch's activations set aside at start-up; shrinks after a device out-of-memory.",
        |_, r| r.budget.limit_bytes as f64,
    ),
    bytes_gauge(
        "sluice_budget_reserved_bytes",
        "Bytes reserved by in-flight jobs.",
        |_, r| r.budget.reserved_bytes as f64,
    ),
    bytes_gauge(
        "sluice_budget_reserved_peak_bytes",
        "Highest reserved bytes so far.",
        |_, r| r.budget.peak_reserved_bytes as f64,
    ),
    bytes_gauge(
        "sluice_host_resident_bytes",
        "The process's resident set in host memory (RSS) now.",
        |_, r| r.memory.host_resident_bytes as f64,
    ),
    bytes_gauge(
        "sluice_host_resident_peak_bytes",
        "The process's highest resident set in host memory (RSS high-water mark).",
        |_, r| r.memory.host_peak_resident_bytes as f64,
    ),
    device_gauge(
        "sluice_device_memory_used_bytes",
        "--device cuda: the GPU's memory in use now (cuMemGetInfo total - free; the whole device, other processes included).",
        |_, r| device_bytes(r, |d| d.used_bytes),
    ),
    device_gauge(
        "sluice_device_memory_used_peak_bytes",
        "--device cuda: the highest GPU memory in use seen (read every 100 ms and at each scrape).",
        |_, r| device_bytes(r, |d| d.peak_used_bytes),
    ),
    device_gauge(
        "sluice_device_memory_total_bytes",
        "--device cuda: the GPU's memory in all.",
        |_, r| device_bytes(r, |d| d.total_bytes),
    ),
];

const fn device_gauge(
    name: &'static str,
    help: &'static str,
    read: fn(&Stats, &Readings) -> f64,
) -> Scalar {
    Scalar {
        device_only: true,
        ..bytes_gauge(name, help, read)
    }
}

fn device_bytes(now: &Readings, field: fn(&DeviceMemory) -> u64) -> f64 {
    now.memory.device.as_ref().map_or(0.0, |d| field(d) as f64)
}

/// Why a process recycled itself (the `reason` label of
/// `sluice_recycles_total`; `recycle.rs` decides).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecycleReason {
    Jobs,
    Age,
    Memory,
}

impl RecycleReason {
    pub const ALL: [RecycleReason; 3] = [
        RecycleReason::Jobs,
        RecycleReason::Age,
        RecycleReason::Memory,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            RecycleReason::Jobs => "jobs",
            RecycleReason::Age => "age",
            RecycleReason::Memory => "memory",
        }
    }
}

/// Recycles by reason (`recycle.rs`); pushed over OTLP once more as the
/// process exits.
pub const TENANT_TOKENS_NAME: &str = "sluice_tenant_tokens_total";
pub const TENANT_TOKENS_HELP: &str = "Tokens the model finished, by the job's tenant (its subject's, else its Sluice-Tenant header, else default).";
pub const RECYCLES_NAME: &str = "sluice_recycles_total";
pub const RECYCLES_HELP: &str = "Times this process recycled itself (drained and exited 0 for its supervisor), by reason: jobs, age or memory.";

/// A counter with one series per error code.
pub struct ByCode {
    pub name: &'static str,
    pub help: &'static str,
    /// Every code the series exists for, with its count.
    pub read: fn(&Stats) -> Vec<(ErrorCode, u64)>,
}

pub const BY_CODE: &[ByCode] = &[
    ByCode {
        name: "sluice_jobs_failed_total",
        help: "Jobs failed for good (answered with an error), by error code.",
        read: |s| all_codes(&s.jobs_failed, |_| true),
    },
    ByCode {
        name: "sluice_jobs_retried_total",
        help: "Transient failures Nak'ed for a retry, by error code.",
        read: |s| all_codes(&s.jobs_retried, ErrorCode::is_retryable),
    },
];

/// A histogram, optionally one per value of a label.
pub struct HistogramMetric {
    pub name: &'static str,
    pub help: &'static str,
    /// Seconds (the OTLP unit `s`).
    pub seconds: bool,
    pub label: Option<(&'static str, &'static [&'static str])>,
    /// The histogram for the label's `i`th value (0 without a label).
    pub read: fn(&Stats, usize) -> &Histogram,
}

pub const HISTOGRAMS: &[HistogramMetric] = &[
    HistogramMetric {
        name: "sluice_batch_items",
        help: "Items per batch.",
        seconds: false,
        label: None,
        read: |s, _| &s.batch_items_histogram,
    },
    HistogramMetric {
        name: "sluice_batch_padded_tokens",
        help: "Padded cost (items x longest) per batch.",
        seconds: false,
        label: None,
        read: |s, _| &s.batch_padded_tokens_histogram,
    },
    HistogramMetric {
        name: "sluice_stage_seconds",
        help: "Time per job stage (queue: from publish to pull).",
        seconds: true,
        label: Some(("stage", &STAGES)),
        read: |s, i| &s.stage_seconds[i],
    },
    HistogramMetric {
        name: "sluice_queue_wait_seconds",
        help: "Time from publish to pull, by the job's priority level.",
        seconds: true,
        label: Some(("priority", &["high", "normal", "low"])),
        read: |s, i| &s.queue_wait_by_priority[i],
    },
];

fn all_codes(
    counts: &Mutex<[u64; ErrorCode::ALL.len()]>,
    keep: fn(ErrorCode) -> bool,
) -> Vec<(ErrorCode, u64)> {
    let counts = counts.lock().map(|m| *m).unwrap_or_default();
    ErrorCode::ALL
        .iter()
        .zip(counts)
        .filter(|(c, _)| keep(**c))
        .map(|(c, n)| (*c, n))
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative_and_sum_and_count_add_up() {
        let h = Histogram::new(&[1.0, 10.0]);
        for v in [0.5, 1.0, 5.0, 50.0] {
            h.observe(v);
        }
        let mut out = String::new();
        h.render(&mut out, "x", "stage=\"fetch\"");
        assert_eq!(
            out,
            "x_bucket{stage=\"fetch\",le=\"1\"} 2\nx_bucket{stage=\"fetch\",le=\"10\"} 3\n\
             x_bucket{stage=\"fetch\",le=\"+Inf\"} 4\nx_sum{stage=\"fetch\"} 56.5\nx_count{stage=\"fetch\"} 4\n"
        );
    }

    #[test]
    fn every_series_is_there_from_the_start() {
        let stats = Stats::default();
        let budget = crate::budget::Budget::new(100).snapshot();
        let text = stats.render_prometheus(&Readings {
            budget,
            in_flight: Default::default(),
            memory: MemoryFigures {
                host_resident_bytes: 1,
                host_peak_resident_bytes: 2,
                device: None,
            },
            ready: true,
        });
        for code in ErrorCode::ALL {
            assert!(text.contains(&format!(
                "sluice_jobs_failed_total{{code=\"{}\"}} 0",
                code.as_str()
            )));
        }
        for stage in STAGES {
            assert!(text.contains(&format!(
                "sluice_stage_seconds_count{{stage=\"{stage}\"}} 0"
            )));
        }
        assert!(text.contains("sluice_ready 1"));
        assert!(text.contains("sluice_budget_bytes 100"));
        assert!(text.contains("sluice_host_resident_peak_bytes 2"));
        for reason in ["jobs", "age", "memory"] {
            assert!(text.contains(&format!("sluice_recycles_total{{reason=\"{reason}\"}} 0")));
        }
        assert!(
            !text.contains("sluice_device_memory"),
            "no GPU, no device series"
        );
    }

    #[test]
    fn on_a_gpu_the_device_memory_is_exported_beside_the_hosts() {
        let text = Stats::default().render_prometheus(&Readings {
            budget: crate::budget::Budget::new(100).snapshot(),
            in_flight: Default::default(),
            memory: MemoryFigures {
                host_resident_bytes: 1,
                host_peak_resident_bytes: 2,
                device: Some(DeviceMemory {
                    used_bytes: 30,
                    peak_used_bytes: 40,
                    free_bytes: 70,
                    total_bytes: 100,
                }),
            },
            ready: true,
        });
        for line in [
            "sluice_host_resident_bytes 1",
            "sluice_device_memory_used_bytes 30",
            "sluice_device_memory_used_peak_bytes 40",
            "sluice_device_memory_total_bytes 100",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing");
        }
    }
}

#[cfg(test)]
mod name_tests {
    use super::*;

    /// OTLP drops `_total`, so a counter could collide with a histogram.
    #[test]
    fn otlp_names_are_unique() {
        let mut names: Vec<String> = SCALARS.iter().map(|m| otlp_name(m.name)).collect();
        names.extend(BY_CODE.iter().map(|m| otlp_name(m.name)));
        names.push(otlp_name(RECYCLES_NAME));
        names.push(otlp_name(TENANT_TOKENS_NAME));
        names.extend(HISTOGRAMS.iter().map(|m| m.name.to_string()));
        let count = names.len();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), count, "{names:?}");
        assert!(names.contains(&"sluice_batch_padded_tokens_sum".to_string()));
    }
}

#[cfg(test)]
mod dashboard_tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// Every metric the shipped Grafana dashboard queries is one we export
    /// (the gateway's `sluice_gateway_*` panels are checked by its crate).
    #[test]
    fn the_grafana_dashboard_queries_only_exported_metrics() {
        let dashboard: serde_json::Value =
            serde_json::from_str(include_str!("../../../deploy/grafana/sluice.json")).unwrap();
        let stats = Stats::default();
        // Labelled series appear once they have a label value.
        stats.add_tenant_tokens("default", 0);
        let exported = stats.render_prometheus(&Readings {
            in_flight: Default::default(),
            budget: crate::budget::Budget::new(1).snapshot(),
            memory: MemoryFigures {
                host_resident_bytes: 0,
                host_peak_resident_bytes: 0,
                device: Some(DeviceMemory {
                    used_bytes: 0,
                    peak_used_bytes: 0,
                    free_bytes: 0,
                    total_bytes: 0,
                }),
            },
            ready: true,
        });
        let mut checked = 0;
        for panel in dashboard["panels"].as_array().unwrap() {
            for target in panel["targets"].as_array().unwrap() {
                let expr = target["expr"].as_str().unwrap();
                let mut rest = expr;
                while let Some(at) = rest.find("sluice_") {
                    let name: String = rest[at..]
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect();
                    if name.starts_with("sluice_gateway_") {
                        rest = &rest[at + name.len()..];
                        continue;
                    }
                    assert!(
                        exported.lines().any(|l| l
                            .strip_prefix(name.as_str())
                            .is_some_and(|r| r.starts_with([' ', '{']))),
                        "panel {:?} queries {name}, which /metrics does not export",
                        panel["title"]
                    );
                    checked += 1;
                    rest = &rest[at + name.len()..];
                }
            }
        }
        assert!(checked > 20, "only {checked} metric references found");
    }
}
