//! The gateway's Prometheus metrics, on the consumer's conventions
//! (`sluice_` prefix, `_total` counters, every series from the start where
//! its labels are known): requests by route and status, batches by the
//! status they ended in, lines by outcome, finalization time, and for
//! online requests their jobs' queue wait and streams' time to first token
//! (histograms, by endpoint). Served on
//! `/metrics` and, with `--otlp-endpoint`, pushed over OTLP/HTTP too
//! ([`OtlpMetrics`]; names without `_total`, as the consumer's).

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use opentelemetry::KeyValue;
use opentelemetry::metrics::{Histogram, MeterProvider as _};
use opentelemetry_sdk::metrics::SdkMeterProvider;
use sluice_connect::otlp::OtlpProtocol;

use crate::batch_record::BatchStatus;

const REQUESTS: &str = "HTTP requests by route and status.";
const BATCHES_CREATED: &str = "Batches created through this gateway.";
const BATCHES_ENDED: &str = "Batches this gateway ended, by final status.";
const LINES: &str = "Request lines of the batches this gateway ended, by outcome.";
const FINALIZE: &str = "Time to write a batch's output and error files.";
const FINAL_STATUSES: [BatchStatus; 4] = [
    BatchStatus::Completed,
    BatchStatus::Failed,
    BatchStatus::Expired,
    BatchStatus::Cancelled,
];
const OUTCOMES: [&str; 2] = ["completed", "failed"];
const QUEUE_WAIT: &str = "Online requests: time their jobs waited in the queue before a consumer took them, by endpoint.";
const FIRST_TOKEN: &str =
    "Streamed online requests: time from the request to its first text, by endpoint.";
/// Upper bounds (seconds) of the latency histograms' buckets.
const SECONDS: [f64; 14] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];
/// The routes latency histograms are kept for (series exist from the start).
const ONLINE_ROUTES: [&str; 3] = ["/v1/embeddings", "/v1/chat/completions", "/v1/completions"];

#[derive(Default)]
pub struct Metrics {
    inner: Mutex<Inner>,
    /// The finalization histogram of the OTLP push, once it has started.
    otel_finalize: OnceLock<Histogram<f64>>,
    /// The queue-wait and first-token histograms of the OTLP push.
    otel_latency: OnceLock<(Histogram<f64>, Histogram<f64>)>,
}

#[derive(Default)]
struct Inner {
    requests: BTreeMap<(String, u16), u64>,
    batches_created: u64,
    batches_ended: BTreeMap<&'static str, u64>,
    lines: BTreeMap<&'static str, u64>,
    finalize_seconds_sum: f64,
    finalize_count: u64,
    queue_wait: BTreeMap<&'static str, Latencies>,
    first_token: BTreeMap<&'static str, Latencies>,
}

/// One histogram: counts per bucket of [`SECONDS`] (not cumulative), sum.
#[derive(Default, Clone)]
struct Latencies {
    buckets: [u64; SECONDS.len()],
    count: u64,
    sum: f64,
}

impl Latencies {
    fn record(&mut self, seconds: f64) {
        if let Some(i) = SECONDS.iter().position(|&le| seconds <= le) {
            self.buckets[i] += 1;
        }
        self.count += 1;
        self.sum += seconds;
    }

    fn render(&self, out: &mut String, name: &str, route: &str) {
        let mut cumulative = 0;
        for (le, n) in SECONDS.iter().zip(self.buckets) {
            cumulative += n;
            let _ = writeln!(
                out,
                "{name}_bucket{{route=\"{route}\",le=\"{le}\"}} {cumulative}"
            );
        }
        let _ = writeln!(
            out,
            "{name}_bucket{{route=\"{route}\",le=\"+Inf\"}} {}",
            self.count
        );
        let _ = writeln!(out, "{name}_sum{{route=\"{route}\"}} {}", self.sum);
        let _ = writeln!(out, "{name}_count{{route=\"{route}\"}} {}", self.count);
    }
}

impl Metrics {
    fn with<T>(&self, f: impl FnOnce(&mut Inner) -> T) -> T {
        f(&mut self.inner.lock().unwrap_or_else(|e| e.into_inner()))
    }

    pub fn request(&self, route: &str, status: u16) {
        self.with(|m| *m.requests.entry((route.to_string(), status)).or_default() += 1);
    }

    pub fn batch_created(&self) {
        self.with(|m| m.batches_created += 1);
    }

    pub fn batch_ended(
        &self,
        status: BatchStatus,
        completed: u64,
        failed: u64,
        took: Option<Duration>,
    ) {
        self.with(|m| {
            *m.batches_ended.entry(status.as_str()).or_default() += 1;
            *m.lines.entry("completed").or_default() += completed;
            *m.lines.entry("failed").or_default() += failed;
            if let Some(took) = took {
                m.finalize_seconds_sum += took.as_secs_f64();
                m.finalize_count += 1;
            }
        });
        if let (Some(h), Some(took)) = (self.otel_finalize.get(), took) {
            h.record(took.as_secs_f64(), &[]);
        }
    }

    /// An online request's job waited `took` in the queue.
    pub fn queue_wait(&self, route: &'static str, took: Duration) {
        self.latency(route, took, false);
    }

    /// A streamed request's first text came `took` after the request.
    pub fn first_token(&self, route: &'static str, took: Duration) {
        self.latency(route, took, true);
    }

    fn latency(&self, route: &'static str, took: Duration, first_token: bool) {
        let seconds = took.as_secs_f64();
        self.with(|m| {
            let table = if first_token {
                &mut m.first_token
            } else {
                &mut m.queue_wait
            };
            table.entry(route).or_default().record(seconds)
        });
        if let Some((queue_wait, first)) = self.otel_latency.get() {
            let h = if first_token { first } else { queue_wait };
            h.record(seconds, &[KeyValue::new("route", route)]);
        }
    }

    /// Prometheus text format.
    pub fn render(&self) -> String {
        self.with(|m| {
            let mut out = String::new();
            let _ = writeln!(out, "# HELP sluice_gateway_requests_total {REQUESTS}");
            let _ = writeln!(out, "# TYPE sluice_gateway_requests_total counter");
            for ((route, status), n) in &m.requests {
                let _ = writeln!(
                    out,
                    "sluice_gateway_requests_total{{route=\"{route}\",status=\"{status}\"}} {n}"
                );
            }
            let _ = writeln!(
                out,
                "# HELP sluice_gateway_batches_created_total {BATCHES_CREATED}"
            );
            let _ = writeln!(out, "# TYPE sluice_gateway_batches_created_total counter");
            let _ = writeln!(
                out,
                "sluice_gateway_batches_created_total {}",
                m.batches_created
            );
            let _ = writeln!(
                out,
                "# HELP sluice_gateway_batches_ended_total {BATCHES_ENDED}"
            );
            let _ = writeln!(out, "# TYPE sluice_gateway_batches_ended_total counter");
            for status in FINAL_STATUSES {
                let n = m.batches_ended.get(status.as_str()).copied().unwrap_or(0);
                let _ = writeln!(
                    out,
                    "sluice_gateway_batches_ended_total{{status=\"{}\"}} {n}",
                    status.as_str()
                );
            }
            let _ = writeln!(out, "# HELP sluice_gateway_lines_total {LINES}");
            let _ = writeln!(out, "# TYPE sluice_gateway_lines_total counter");
            for outcome in OUTCOMES {
                let n = m.lines.get(outcome).copied().unwrap_or(0);
                let _ = writeln!(
                    out,
                    "sluice_gateway_lines_total{{outcome=\"{outcome}\"}} {n}"
                );
            }
            let _ = writeln!(out, "# HELP sluice_gateway_finalize_seconds {FINALIZE}");
            let _ = writeln!(out, "# TYPE sluice_gateway_finalize_seconds summary");
            let _ = writeln!(
                out,
                "sluice_gateway_finalize_seconds_sum {}",
                m.finalize_seconds_sum
            );
            let _ = writeln!(
                out,
                "sluice_gateway_finalize_seconds_count {}",
                m.finalize_count
            );
            for (name, help, table) in [
                (
                    "sluice_gateway_queue_wait_seconds",
                    QUEUE_WAIT,
                    &m.queue_wait,
                ),
                (
                    "sluice_gateway_time_to_first_token_seconds",
                    FIRST_TOKEN,
                    &m.first_token,
                ),
            ] {
                let _ = writeln!(out, "# HELP {name} {help}");
                let _ = writeln!(out, "# TYPE {name} histogram");
                for route in ONLINE_ROUTES {
                    table
                        .get(route)
                        .cloned()
                        .unwrap_or_default()
                        .render(&mut out, name, route);
                }
            }
            out
        })
    }
}

/// The gateway's counters pushed over OTLP/HTTP, observed at each export,
/// and its finalization time as a histogram.
pub struct OtlpMetrics {
    provider: SdkMeterProvider,
}

impl OtlpMetrics {
    /// Starts pushing to `<endpoint>/v1/metrics` every `interval`. Its HTTP
    /// client blocks: call this (and `shutdown`) off the async runtime.
    pub fn start(
        endpoint: &str,
        protocol: OtlpProtocol,
        interval: Duration,
        metrics: &Arc<Metrics>,
    ) -> anyhow::Result<OtlpMetrics> {
        let provider =
            sluice_connect::otlp::meter_provider(endpoint, protocol, interval, "sluice-gateway")?;
        let meter = provider.meter("sluice-gateway");
        let m = Arc::clone(metrics);
        meter
            .u64_observable_counter("sluice_gateway_requests")
            .with_description(REQUESTS)
            .with_callback(move |o| {
                m.with(|m| {
                    for ((route, status), n) in &m.requests {
                        let labels = [
                            KeyValue::new("route", route.clone()),
                            KeyValue::new("status", status.to_string()),
                        ];
                        o.observe(*n, &labels);
                    }
                })
            })
            .build();
        let m = Arc::clone(metrics);
        meter
            .u64_observable_counter("sluice_gateway_batches_created")
            .with_description(BATCHES_CREATED)
            .with_callback(move |o| o.observe(m.with(|m| m.batches_created), &[]))
            .build();
        let m = Arc::clone(metrics);
        meter
            .u64_observable_counter("sluice_gateway_batches_ended")
            .with_description(BATCHES_ENDED)
            .with_callback(move |o| {
                m.with(|m| {
                    for status in FINAL_STATUSES {
                        let n = m.batches_ended.get(status.as_str()).copied().unwrap_or(0);
                        o.observe(n, &[KeyValue::new("status", status.as_str())]);
                    }
                })
            })
            .build();
        let m = Arc::clone(metrics);
        meter
            .u64_observable_counter("sluice_gateway_lines")
            .with_description(LINES)
            .with_callback(move |o| {
                m.with(|m| {
                    for outcome in OUTCOMES {
                        let n = m.lines.get(outcome).copied().unwrap_or(0);
                        o.observe(n, &[KeyValue::new("outcome", outcome)]);
                    }
                })
            })
            .build();
        let finalize = meter
            .f64_histogram("sluice_gateway_finalize_seconds")
            .with_description(FINALIZE)
            .with_unit("s")
            .build();
        let _ = metrics.otel_finalize.set(finalize);
        let latency = |name: &'static str, help: &'static str| {
            meter
                .f64_histogram(name)
                .with_description(help)
                .with_unit("s")
                .build()
        };
        let _ = metrics.otel_latency.set((
            latency("sluice_gateway_queue_wait_seconds", QUEUE_WAIT),
            latency("sluice_gateway_time_to_first_token_seconds", FIRST_TOKEN),
        ));
        Ok(OtlpMetrics { provider })
    }

    /// Pushes a last time and stops; call once, on shutdown, off the runtime.
    pub fn shutdown(&self) {
        if let Err(e) = self.provider.shutdown() {
            tracing::warn!(error = %e, "flushing metrics on shutdown failed");
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// Every gateway metric the shipped Grafana dashboard queries is one
    /// `/metrics` exports from the start (the consumer's crate checks the rest).
    #[test]
    fn the_grafana_dashboard_queries_only_exported_gateway_metrics() {
        let dashboard: serde_json::Value =
            serde_json::from_str(include_str!("../../deploy/grafana/sluice.json")).unwrap();
        let exported = Metrics::default().render();
        let mut checked = 0;
        for panel in dashboard["panels"].as_array().unwrap() {
            for target in panel["targets"].as_array().unwrap() {
                let expr = target["expr"].as_str().unwrap();
                for (at, _) in expr.match_indices("sluice_gateway_") {
                    let name: String = expr[at..]
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect();
                    assert!(
                        exported.lines().any(|l| l
                            .strip_prefix(name.as_str())
                            .is_some_and(|r| r.starts_with([' ', '{']))),
                        "panel {:?} queries {name}, which the gateway's /metrics does not export",
                        panel["title"]
                    );
                    checked += 1;
                }
            }
        }
        assert!(
            checked >= 2,
            "only {checked} gateway metric references found"
        );
    }
}
