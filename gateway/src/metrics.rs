//! The gateway's Prometheus metrics, on the consumer's conventions
//! (`sluice_` prefix, `_total` counters, every series from the start where
//! its labels are known): requests by route and status, batches by the
//! status they ended in, lines by outcome, finalization time.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;
use std::time::Duration;

use crate::batch_record::BatchStatus;

#[derive(Default)]
pub struct Metrics {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    requests: BTreeMap<(String, u16), u64>,
    batches_created: u64,
    batches_ended: BTreeMap<&'static str, u64>,
    lines: BTreeMap<&'static str, u64>,
    finalize_seconds_sum: f64,
    finalize_count: u64,
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
    }

    /// Prometheus text format.
    pub fn render(&self) -> String {
        self.with(|m| {
            let mut out = String::new();
            let _ = writeln!(out, "# HELP sluice_gateway_requests_total HTTP requests by route and status.");
            let _ = writeln!(out, "# TYPE sluice_gateway_requests_total counter");
            for ((route, status), n) in &m.requests {
                let _ = writeln!(out, "sluice_gateway_requests_total{{route=\"{route}\",status=\"{status}\"}} {n}");
            }
            let _ = writeln!(out, "# HELP sluice_gateway_batches_created_total Batches created through this gateway.");
            let _ = writeln!(out, "# TYPE sluice_gateway_batches_created_total counter");
            let _ = writeln!(out, "sluice_gateway_batches_created_total {}", m.batches_created);
            let _ = writeln!(out, "# HELP sluice_gateway_batches_ended_total Batches this gateway ended, by final status.");
            let _ = writeln!(out, "# TYPE sluice_gateway_batches_ended_total counter");
            for status in [BatchStatus::Completed, BatchStatus::Failed, BatchStatus::Expired, BatchStatus::Cancelled] {
                let n = m.batches_ended.get(status.as_str()).copied().unwrap_or(0);
                let _ = writeln!(out, "sluice_gateway_batches_ended_total{{status=\"{}\"}} {n}", status.as_str());
            }
            let _ = writeln!(out, "# HELP sluice_gateway_lines_total Request lines of the batches this gateway ended, by outcome.");
            let _ = writeln!(out, "# TYPE sluice_gateway_lines_total counter");
            for outcome in ["completed", "failed"] {
                let n = m.lines.get(outcome).copied().unwrap_or(0);
                let _ = writeln!(out, "sluice_gateway_lines_total{{outcome=\"{outcome}\"}} {n}");
            }
            let _ = writeln!(out, "# HELP sluice_gateway_finalize_seconds Time to write a batch's output and error files.");
            let _ = writeln!(out, "# TYPE sluice_gateway_finalize_seconds summary");
            let _ = writeln!(out, "sluice_gateway_finalize_seconds_sum {}", m.finalize_seconds_sum);
            let _ = writeln!(out, "sluice_gateway_finalize_seconds_count {}", m.finalize_count);
            out
        })
    }
}
