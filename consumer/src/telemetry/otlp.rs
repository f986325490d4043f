//! The same metrics as `/metrics`, pushed over OTLP/HTTP when an endpoint is
//! configured (`--otlp-endpoint`, beside the traces), from the same tables
//! ([`SCALARS`], [`BY_CODE`], [`HISTOGRAMS`]). Counters and gauges are
//! observed at each export; histograms are recorded as events happen, through
//! [`OtelHistograms`]. Names are the Prometheus names without the `_total`
//! suffix (a collector's Prometheus exporter adds it back).

use std::sync::Arc;
use std::time::Duration;

use opentelemetry::KeyValue;
use opentelemetry::metrics::{Meter, MeterProvider as _};
use opentelemetry_sdk::metrics::SdkMeterProvider;

use super::stats::{
    BY_CODE, HISTOGRAMS, MetricKind, OtelHistograms, RECYCLES_HELP, RECYCLES_NAME, Readings,
    SCALARS, Stats, TENANT_TOKENS_HELP, TENANT_TOKENS_NAME, otlp_name,
};
use super::trace::OtlpProtocol;

pub struct OtlpMetrics {
    provider: SdkMeterProvider,
}

/// Reads the budget and memory at export time.
pub type ReadNow = Arc<dyn Fn() -> Readings + Send + Sync>;

impl OtlpMetrics {
    /// Starts pushing to `<endpoint>/v1/metrics` every `interval`.
    pub fn start(
        endpoint: &str,
        protocol: OtlpProtocol,
        interval: Duration,
        stats: Arc<Stats>,
        now: ReadNow,
    ) -> anyhow::Result<OtlpMetrics> {
        let provider =
            sluice_connect::otlp::meter_provider(endpoint, protocol, interval, "sluice-consumer")?;
        let meter = provider.meter("sluice-consumer");
        register(&meter, &stats, now);
        let histogram = |name: &str| {
            let Some(m) = HISTOGRAMS.iter().find(|h| h.name == name) else {
                unreachable!("{name} is in HISTOGRAMS");
            };
            let builder = meter.f64_histogram(m.name).with_description(m.help);
            if m.seconds {
                builder.with_unit("s")
            } else {
                builder
            }
            .build()
        };
        let _ = stats.otel.set(OtelHistograms {
            stage_seconds: histogram("sluice_stage_seconds"),
            batch_items: histogram("sluice_batch_items"),
            batch_padded_tokens: histogram("sluice_batch_padded_tokens"),
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

/// Observable counters and gauges over what `/metrics` reads too.
fn register(meter: &Meter, stats: &Arc<Stats>, now: ReadNow) {
    for m in SCALARS {
        let (stats, now) = (Arc::clone(stats), Arc::clone(&now));
        let name = otlp_name(m.name);
        let unit = if m.bytes { "By" } else { "" };
        let (read, device_only) = (m.read, m.device_only);
        let present = move |now: &Readings| !device_only || now.memory.device.is_some();
        match m.kind {
            MetricKind::Counter => {
                // Counts are whole numbers.
                meter
                    .u64_observable_counter(name)
                    .with_description(m.help)
                    .with_unit(unit)
                    .with_callback(move |o| {
                        let now = now();
                        if present(&now) {
                            o.observe(read(&stats, &now) as u64, &[]);
                        }
                    })
                    .build();
            }
            MetricKind::Gauge => {
                meter
                    .f64_observable_gauge(name)
                    .with_description(m.help)
                    .with_unit(unit)
                    .with_callback(move |o| {
                        let now = now();
                        if present(&now) {
                            o.observe(read(&stats, &now), &[]);
                        }
                    })
                    .build();
            }
        }
    }
    {
        let stats = Arc::clone(stats);
        meter
            .u64_observable_counter(otlp_name(RECYCLES_NAME))
            .with_description(RECYCLES_HELP)
            .with_callback(move |o| {
                for (reason, n) in stats.recycles() {
                    o.observe(n, &[KeyValue::new("reason", reason.as_str())]);
                }
            })
            .build();
    }
    {
        let stats = Arc::clone(stats);
        meter
            .u64_observable_counter(otlp_name(TENANT_TOKENS_NAME))
            .with_description(TENANT_TOKENS_HELP)
            .with_callback(move |o| {
                for (tenant, n) in stats.tenant_tokens() {
                    o.observe(n, &[KeyValue::new("tenant", tenant)]);
                }
            })
            .build();
    }
    for m in BY_CODE {
        let stats = Arc::clone(stats);
        let read = m.read;
        meter
            .u64_observable_counter(otlp_name(m.name))
            .with_description(m.help)
            .with_callback(move |o| {
                for (code, n) in read(&stats) {
                    o.observe(n, &[KeyValue::new("code", code.as_str())]);
                }
            })
            .build();
    }
}
