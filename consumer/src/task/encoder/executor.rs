//! The executor: runs the model on a dedicated OS thread, one batch at a time,
//! so inference never blocks the async runtime. Sends each item's vector
//! (rerank: its one score) straight to its job.

use std::sync::Arc;
use std::time::Instant;

use sluice_schemas::ErrorCode;
use tokio::sync::mpsc;

use super::batcher::{Batch, BatchReport, ItemOutcome};
use crate::budget::Budget;
use crate::error::JobError;
use crate::telemetry::{Stats, Tracing};
use sluice_models::{EmbeddingModel, ModelError};

/// Starts the executor thread. It ends when the batcher hangs up.
pub fn spawn(
    model: Box<dyn EmbeddingModel>,
    mut batches: mpsc::Receiver<Batch>,
    stats: Arc<Stats>,
    budget: Budget,
    tracing: Tracing,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("sluice-executor".into())
        .spawn(move || {
            while let Some(batch) = batches.blocking_recv() {
                run_batch(model.as_ref(), batch, &stats, &budget, &tracing);
            }
        })
}

/// One span per batch, linked to each job it served.
fn trace_batch(tracing: &Tracing, batch: &Batch, started: Instant, ended: Instant, ok: bool) {
    use opentelemetry::KeyValue;
    let mut jobs: Vec<opentelemetry::trace::SpanContext> = Vec::new();
    for item in &batch.items {
        if let Some(sc) = &item.trace
            && !jobs.iter().any(|j| j.span_id() == sc.span_id())
        {
            jobs.push(sc.clone());
        }
    }
    let attributes = vec![
        KeyValue::new("sluice.batch.id", batch.id as i64),
        KeyValue::new("sluice.batch.items", batch.items.len() as i64),
        KeyValue::new("sluice.batch.jobs", jobs.len() as i64),
        KeyValue::new("sluice.batch.padded_tokens", batch.padded_tokens() as i64),
        KeyValue::new("sluice.batch.real_tokens", batch.real_tokens() as i64),
        KeyValue::new("sluice.batch.ok", ok),
    ];
    tracing.batch(started, ended, attributes, jobs);
}

fn run_batch(
    model: &dyn EmbeddingModel,
    batch: Batch,
    stats: &Stats,
    budget: &Budget,
    tracing: &Tracing,
) {
    let started = Instant::now();
    let seqs: Vec<&[u32]> = batch.items.iter().map(|i| i.ids.as_slice()).collect();
    // One engine serves one task: a rerank batch's items all carry types.
    let types: Option<Vec<&[u32]>> = batch.items.iter().map(|i| i.type_ids.as_deref()).collect();
    let result = model.embed_typed(&seqs, types.as_deref());
    let ended = Instant::now();
    let model_ms = ended.duration_since(started).as_secs_f64() * 1e3;
    stats.record_batch(&batch.figures(), model_ms, result.is_ok());
    if tracing.is_enabled() {
        trace_batch(tracing, &batch, started, ended, result.is_ok());
    }
    let report = BatchReport {
        id: batch.id,
        started,
        model_ms,
    };
    match result {
        Ok(vectors) if vectors.len() == batch.items.len() => {
            for (item, vector) in batch.items.into_iter().zip(vectors) {
                // A closed channel means the job gave up; nothing to do.
                let _ = item.job.send(ItemOutcome::Done {
                    index: item.index,
                    vector,
                    batch: report,
                });
            }
        }
        other => {
            let error = match other {
                Err(e) => {
                    let message = match &e {
                        ModelError::OutOfMemory(m) => {
                            // Something else took device memory: admit less from now on.
                            let limit = budget.snapshot().limit_bytes;
                            budget.shrink_limit(limit / 10 * 8);
                            tracing::warn!(
                                old_mib = limit >> 20,
                                new_mib = (limit / 10 * 8) >> 20,
                                "device out of memory: shrinking the budget"
                            );
                            format!("the device ran out of memory in batch {}: {m}", batch.id)
                        }
                        ModelError::Failed(m) => m.clone(),
                        ModelError::Input(input) => input.to_string(),
                    };
                    // The code comes from the one mapping (`crate::error`).
                    JobError {
                        message,
                        ..JobError::from(e)
                    }
                }
                Ok(v) => JobError::new(
                    ErrorCode::Internal,
                    format!(
                        "bug: the model returned {} vectors for {} items",
                        v.len(),
                        batch.items.len()
                    ),
                ),
            };
            tracing::warn!(batch = batch.id, error = %error, "batch failed");
            for item in batch.items {
                let _ = item.job.send(ItemOutcome::Failed {
                    index: item.index,
                    error: error.clone(),
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::time::Instant;

    use super::super::batcher::BatchItem;
    use super::*;

    /// A model whose device is always out of memory.
    struct Exhausted;

    impl EmbeddingModel for Exhausted {
        fn forward_name(&self) -> &'static str {
            "exhausted"
        }
        fn dim(&self) -> usize {
            4
        }
        fn max_tokens_per_item(&self) -> usize {
            16
        }
        fn batch_cost_bytes(&self, items: usize, len: usize) -> u64 {
            (items * len) as u64
        }
        fn embed_typed(
            &self,
            _: &[&[u32]],
            _: Option<&[&[u32]]>,
        ) -> Result<Vec<Vec<f32>>, ModelError> {
            Err(ModelError::OutOfMemory("CUDA_ERROR_OUT_OF_MEMORY".into()))
        }
    }

    #[tokio::test]
    async fn out_of_memory_fails_the_batch_retryably_and_shrinks_the_budget() {
        let budget = Budget::new(1000);
        let stats = Arc::new(Stats::default());
        let (tx, rx) = mpsc::channel(1);
        let thread = spawn(
            Box::new(Exhausted),
            rx,
            Arc::clone(&stats),
            budget.clone(),
            Tracing::disabled(),
        )
        .unwrap();
        let (job_tx, mut job_rx) = mpsc::unbounded_channel();
        let items = (0..3)
            .map(|index| BatchItem {
                ids: vec![1, 2, 3],
                type_ids: None,
                index,
                job: job_tx.clone(),
                ready_at: Instant::now(),
                trace: None,
            })
            .collect();
        tx.send(Batch { id: 7, items }).await.unwrap();
        for _ in 0..3 {
            match job_rx.recv().await.unwrap() {
                ItemOutcome::Failed { error, .. } => {
                    assert_eq!(error.code, ErrorCode::DeviceOutOfMemory);
                    assert!(
                        error.is_retryable(),
                        "an OOM is retried (Nak), not dead-lettered"
                    );
                }
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(
            budget.snapshot().limit_bytes,
            800,
            "the budget shrinks by a fifth"
        );
        drop(tx);
        thread.join().unwrap();
        assert_eq!(
            stats
                .batches_failed
                .load(std::sync::atomic::Ordering::Relaxed),
            1
        );
    }
}
