//! The generation thread: owns the llama model and a continuous-batching
//! [`Generator`]; sequences join a step as they arrive and leave it as they
//! finish, and each answer goes back on the sequence's own channel. A
//! sequence whose job went away (drained, aborted) is cancelled before the
//! next step, freeing its KV cache.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use sluice_schemas::ErrorCode;
use tokio::sync::{mpsc, oneshot};

use crate::error::JobError;
use crate::model::generation::{Generated, GenerationParams, Generator};
use crate::model::gguf_tokenizer::GgufTokenizer;
use crate::model::llama::Llama;
use crate::telemetry::Stats;

/// One prompt on its way to the generation thread.
pub struct Sequence {
    pub prompt: Vec<u32>,
    pub params: GenerationParams,
    pub reply: oneshot::Sender<Result<Generated, JobError>>,
}

/// How the generation thread steps.
#[derive(Debug, Clone)]
pub struct StepSettings {
    pub max_step_tokens: usize,
    pub max_sequences: usize,
    /// The generator's own KV cap (the job budget: reservations already
    /// cover every admitted sequence's cache).
    pub kv_budget: u64,
}

/// Starts the generation thread. It ends when every sender of `sequences`
/// is gone and its last sequence has finished.
pub fn spawn(
    model: Llama,
    tokenizer: Arc<GgufTokenizer>,
    mut sequences: mpsc::Receiver<Sequence>,
    settings: StepSettings,
    stats: Arc<Stats>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("sluice-generate".into())
        .spawn(move || {
            let new_generator = || {
                Generator::new(&model, tokenizer.as_ref(), settings.max_step_tokens)
                    .with_kv_budget(settings.kv_budget)
                    .with_max_running(settings.max_sequences)
            };
            let mut generator = new_generator();
            let mut replies: HashMap<u64, oneshot::Sender<Result<Generated, JobError>>> =
                HashMap::new();
            let mut next_key = 0u64;
            let mut open = true;
            loop {
                let mut add = |s: Sequence, generator: &mut Generator<'_, u64>| {
                    next_key += 1;
                    match generator.add(next_key, s.prompt, s.params) {
                        Ok(()) => {
                            replies.insert(next_key, s.reply);
                        }
                        Err(e) => {
                            let _ = s.reply.send(Err(JobError::new(
                                ErrorCode::InvalidParameters,
                                e.to_string(),
                            )));
                        }
                    }
                };
                if generator.is_empty() {
                    if !open {
                        break;
                    }
                    match sequences.blocking_recv() {
                        Some(s) => add(s, &mut generator),
                        None => break,
                    }
                }
                loop {
                    match sequences.try_recv() {
                        Ok(s) => add(s, &mut generator),
                        Err(mpsc::error::TryRecvError::Empty) => break,
                        Err(mpsc::error::TryRecvError::Disconnected) => {
                            open = false;
                            break;
                        }
                    }
                }
                // A job that went away (drained, aborted) frees its sequences.
                replies.retain(|key, reply| {
                    let keep = !reply.is_closed();
                    if !keep {
                        generator.cancel(key);
                    }
                    keep
                });
                if generator.is_empty() {
                    continue;
                }
                let started = Instant::now();
                let result = generator.step();
                stats.record_generate_step(
                    started.elapsed(),
                    generator.running(),
                    generator.reserved_kv_bytes(),
                    generator.peak_kv_bytes(),
                );
                match result {
                    Ok(done) => {
                        for (key, generated) in done {
                            stats
                                .generated_tokens
                                .fetch_add(generated.completion_tokens as u64, Ordering::Relaxed);
                            if let Some(reply) = replies.remove(&key) {
                                let _ = reply.send(Ok(generated));
                            }
                        }
                    }
                    Err(e) => {
                        tracing::error!(error = %e, sequences = replies.len(), "generation step failed; failing its sequences");
                        let inner = JobError::from(e);
                        let error = JobError {
                            message: format!("generation step failed: {}", inner.message),
                            ..inner
                        };
                        for (_, reply) in replies.drain() {
                            let _ = reply.send(Err(error.clone()));
                        }
                        generator = new_generator();
                    }
                }
            }
        })
}
