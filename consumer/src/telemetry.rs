//! Typed telemetry: one place records each event as counters (served on
//! `/metrics` and `/debug/memory`) and as a log line. Per batch, not per item.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use sluice_schemas::ErrorCode;

use crate::batcher::Batch;

#[derive(Default)]
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
    pub jobs_retried: AtomicU64,
    pub jobs_already_final: AtomicU64,
    jobs_failed: Mutex<BTreeMap<&'static str, u64>>,
    pub items_done: AtomicU64,
    pub tokens_done: AtomicU64,
    pub jobs_in_flight: AtomicU64,
}

impl Stats {
    pub fn record_batch(&self, batch: &Batch, model_ms: f64, ok: bool) {
        let padded = batch.padded_tokens() as u64;
        let real = batch.real_tokens() as u64;
        let mut lens = batch.items.iter().map(|i| i.ids.len());
        let first = lens.next().unwrap_or(0);
        let mixed_length = lens.any(|l| l != first);
        let multi_job = batch
            .items
            .iter()
            .any(|i| !i.job.same_channel(&batch.items[0].job));
        self.batches.fetch_add(1, Ordering::Relaxed);
        if !ok {
            self.batches_failed.fetch_add(1, Ordering::Relaxed);
        }
        self.batch_items
            .fetch_add(batch.items.len() as u64, Ordering::Relaxed);
        self.batch_real_tokens.fetch_add(real, Ordering::Relaxed);
        self.batch_padded_tokens
            .fetch_add(padded, Ordering::Relaxed);
        self.max_batch_padded_tokens
            .fetch_max(padded, Ordering::Relaxed);
        self.model_micros
            .fetch_add((model_ms * 1e3) as u64, Ordering::Relaxed);
        if multi_job {
            self.batches_multi_job.fetch_add(1, Ordering::Relaxed);
        }
        if mixed_length {
            self.batches_mixed_length.fetch_add(1, Ordering::Relaxed);
        }
        tracing::debug!(
            batch = batch.id,
            items = batch.items.len(),
            padded_len = batch.padded_len(),
            padded_tokens = padded,
            real_tokens = real,
            multi_job,
            model_ms,
            ok,
            "batch"
        );
    }

    pub fn record_job_ok(&self, items: u64, tokens: u64) {
        self.jobs_ok.fetch_add(1, Ordering::Relaxed);
        self.items_done.fetch_add(items, Ordering::Relaxed);
        self.tokens_done.fetch_add(tokens, Ordering::Relaxed);
    }

    pub fn record_job_failed(&self, code: ErrorCode) {
        if let Ok(mut m) = self.jobs_failed.lock() {
            *m.entry(code.as_str()).or_default() += 1;
        }
    }

    pub fn jobs_failed(&self) -> BTreeMap<&'static str, u64> {
        self.jobs_failed
            .lock()
            .map(|m| m.clone())
            .unwrap_or_default()
    }
}
