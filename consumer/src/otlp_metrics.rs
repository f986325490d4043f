//! The same metrics as `/metrics`, pushed over OTLP/HTTP when an endpoint is
//! configured (`--otlp-endpoint`, beside the traces). Counters and gauges are
//! observed from [`Stats`] at each export; histograms are recorded as events
//! happen, through [`OtelHistograms`]. Names are the Prometheus names without
//! the `_total` suffix (a collector's Prometheus exporter adds it back).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use opentelemetry::KeyValue;
use opentelemetry::metrics::{Meter, MeterProvider as _};
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider};
use sluice_schemas::ErrorCode;

use crate::budget::{Budget, peak_resident_bytes, resident_bytes};
use crate::telemetry::Stats;
use crate::trace::{OtlpProtocol, otlp_resource, otlp_target};

/// Histograms recorded as events happen (set once, when exporting).
pub struct OtelHistograms {
    pub stage_seconds: opentelemetry::metrics::Histogram<f64>,
    pub batch_items: opentelemetry::metrics::Histogram<u64>,
    pub batch_padded_tokens: opentelemetry::metrics::Histogram<u64>,
}

pub struct OtlpMetrics {
    provider: SdkMeterProvider,
}

impl OtlpMetrics {
    /// Starts pushing to `<endpoint>/v1/metrics` every `interval`.
    pub fn start(
        endpoint: &str,
        protocol: OtlpProtocol,
        interval: Duration,
        stats: Arc<Stats>,
        budget: Budget,
    ) -> anyhow::Result<OtlpMetrics> {
        let (builder, url) = otlp_target(
            opentelemetry_otlp::MetricExporter::builder().with_http(),
            endpoint,
            "metrics",
            protocol,
        );
        let exporter = builder
            .build()
            .map_err(|e| anyhow::anyhow!("cannot set up OTLP metrics export to {url}: {e}"))?;
        let reader = PeriodicReader::builder(exporter)
            .with_interval(interval)
            .build();
        let provider = SdkMeterProvider::builder()
            .with_reader(reader)
            .with_resource(otlp_resource())
            .build();
        let meter = provider.meter("sluice-consumer");
        register(&meter, &stats, budget);
        let _ = stats.otel.set(OtelHistograms {
            stage_seconds: meter
                .f64_histogram("sluice_stage_seconds")
                .with_unit("s")
                .with_description("Time per job stage (queue: from publish to pull).")
                .build(),
            batch_items: meter
                .u64_histogram("sluice_batch_items")
                .with_description("Items per batch.")
                .build(),
            batch_padded_tokens: meter
                .u64_histogram("sluice_batch_padded_tokens")
                .with_description("Padded cost (items x longest) per batch.")
                .build(),
        });
        Ok(OtlpMetrics { provider })
    }

    /// Pushes a last time and stops; call once, on shutdown.
    pub fn shutdown(&self) {
        if let Err(e) = self.provider.shutdown() {
            tracing::warn!(error = %e, "flushing metrics on shutdown failed");
        }
    }
}

/// Observable counters and gauges over the atomics `/metrics` reads too.
fn register(meter: &Meter, stats: &Arc<Stats>, budget: Budget) {
    type Read = fn(&Stats) -> &AtomicU64;
    let counters: [(&'static str, &'static str, Read); 11] = [
        ("sluice_jobs_ok", "Jobs answered ok.", |s| &s.jobs_ok),
        (
            "sluice_jobs_already_answered",
            "Redeliveries of jobs already answered.",
            |s| &s.jobs_already_final,
        ),
        (
            "sluice_redeliveries",
            "Deliveries after a job's first.",
            |s| &s.redeliveries,
        ),
        (
            "sluice_dead_lettered",
            "Jobs published to the dead-letter stream.",
            |s| &s.dead_lettered,
        ),
        ("sluice_items", "Items embedded in ok jobs.", |s| {
            &s.items_done
        }),
        ("sluice_tokens", "Real tokens in ok jobs.", |s| {
            &s.tokens_done
        }),
        ("sluice_batches", "Batches run.", |s| &s.batches),
        ("sluice_batches_failed", "Batches that failed.", |s| {
            &s.batches_failed
        }),
        (
            "sluice_batch_real_tokens",
            "Real tokens over all batches.",
            |s| &s.batch_real_tokens,
        ),
        (
            "sluice_batch_padded_tokens_sum",
            "Padded tokens over all batches.",
            |s| &s.batch_padded_tokens,
        ),
        (
            "sluice_batches_multi_job",
            "Batches holding items of several jobs.",
            |s| &s.batches_multi_job,
        ),
    ];
    for (name, help, read) in counters {
        let stats = Arc::clone(stats);
        meter
            .u64_observable_counter(name)
            .with_description(help)
            .with_callback(move |o| o.observe(read(&stats).load(Ordering::Relaxed), &[]))
            .build();
    }
    for (name, help, failed) in [
        (
            "sluice_jobs_failed",
            "Jobs failed for good, by error code.",
            true,
        ),
        (
            "sluice_jobs_retried",
            "Transient failures Nak'ed for a retry, by error code.",
            false,
        ),
    ] {
        let stats = Arc::clone(stats);
        meter
            .u64_observable_counter(name)
            .with_description(help)
            .with_callback(move |o| {
                let counts = if failed {
                    stats.jobs_failed()
                } else {
                    stats.jobs_retried()
                };
                for code in ErrorCode::ALL {
                    if !failed && !code.is_retryable() {
                        continue;
                    }
                    let n = counts
                        .iter()
                        .find(|(c, _)| *c == code)
                        .map_or(0, |(_, n)| *n);
                    o.observe(n, &[KeyValue::new("code", code.as_str())]);
                }
            })
            .build();
    }
    let gauges: [(&'static str, &'static str, Read); 2] = [
        (
            "sluice_jobs_in_flight",
            "Jobs admitted and not yet settled.",
            |s| &s.jobs_in_flight,
        ),
        (
            "sluice_tokens_in_flight",
            "Real tokens of tokenized jobs not yet settled.",
            |s| &s.tokens_in_flight,
        ),
    ];
    for (name, help, read) in gauges {
        let stats = Arc::clone(stats);
        meter
            .u64_observable_gauge(name)
            .with_description(help)
            .with_callback(move |o| o.observe(read(&stats).load(Ordering::Relaxed), &[]))
            .build();
    }
    type Bytes = fn(&Budget) -> u64;
    let bytes: [(&'static str, &'static str, Bytes); 5] = [
        ("sluice_budget_bytes", "Memory budget for jobs.", |b| {
            b.snapshot().limit_bytes
        }),
        (
            "sluice_budget_reserved_bytes",
            "Bytes reserved by in-flight jobs.",
            |b| b.snapshot().reserved_bytes,
        ),
        (
            "sluice_budget_reserved_peak_bytes",
            "Highest reserved bytes so far.",
            |b| b.snapshot().peak_reserved_bytes,
        ),
        (
            "sluice_memory_allocated_bytes",
            "Memory the model's device holds (on CPU: the resident set).",
            |_| resident_bytes().unwrap_or(0),
        ),
        (
            "sluice_memory_peak_bytes",
            "Highest memory the model's device has held (on CPU: peak resident set).",
            |_| peak_resident_bytes().unwrap_or(0),
        ),
    ];
    for (name, help, read) in bytes {
        let budget = budget.clone();
        meter
            .u64_observable_gauge(name)
            .with_unit("By")
            .with_description(help)
            .with_callback(move |o| o.observe(read(&budget), &[]))
            .build();
    }
}
