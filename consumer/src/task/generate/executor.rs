//! The generation thread: owns the llama model and a continuous-batching
//! [`Generator`]; sequences join a step as they arrive and leave it as they
//! finish, and each answer goes back on the sequence's own channel. A
//! sequence whose job went away (drained, aborted, cancelled) is cancelled
//! before the next step, freeing its KV cache. A streamed sequence's new
//! text goes out after every step, on its job's [`StreamEvent`] channel.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use sluice_schemas::ErrorCode;
use tokio::sync::{mpsc, oneshot};

use super::logprobs::wire_logprobs;
use crate::error::JobError;
use crate::telemetry::Stats;
use sluice_models::decoder::Decoder;
use sluice_models::decoder::generation::{
    FinishReason, Generated, GenerationParams, Generator, TokenLogprob,
};
use sluice_models::tokenizer::gguf::GgufTokenizer;

/// One prompt on its way to the generation thread.
pub struct Sequence {
    pub prompt: Vec<u32>,
    pub params: GenerationParams,
    pub reply: oneshot::Sender<Result<Generated, JobError>>,
    /// Set when the job streams: where this prompt's text goes as it grows.
    pub stream: Option<StreamTo>,
}

/// A streamed prompt's channel: its index in the job, and the job's events.
pub struct StreamTo {
    pub item: usize,
    pub events: mpsc::UnboundedSender<StreamEvent>,
    /// Whether its events carry logprobs (its parameters asked for them).
    pub logprobs: bool,
}

/// What a streamed prompt reports, in order: its new text after each step
/// that added some, then how it ended (sent before its reply).
#[derive(Debug, Clone, PartialEq)]
pub enum StreamEvent {
    Text {
        item: usize,
        text: String,
        /// The logprobs of the tokens recorded since its previous event
        /// (None: not asked for).
        logprobs: Option<Vec<sluice_schemas::Logprob>>,
    },
    /// The rest of its text (possibly empty) and logprobs, why it ended and
    /// its tokens.
    Finished {
        item: usize,
        text: String,
        logprobs: Option<Vec<sluice_schemas::Logprob>>,
        finish_reason: sluice_schemas::FinishReason,
        prompt_tokens: usize,
        completion_tokens: usize,
    },
}

/// The wire contract's name for why a generation ended.
pub(crate) fn wire_finish_reason(reason: FinishReason) -> sluice_schemas::FinishReason {
    match reason {
        FinishReason::Length => sluice_schemas::FinishReason::Length,
        FinishReason::Stop => sluice_schemas::FinishReason::Stop,
        FinishReason::Eos => sluice_schemas::FinishReason::Eos,
    }
}

/// A sequence's answer channels while it runs.
struct Waiter {
    reply: oneshot::Sender<Result<Generated, JobError>>,
    stream: Option<StreamTo>,
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
    model: Decoder,
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
            let mut replies: HashMap<u64, Waiter> = HashMap::new();
            let mut next_key = 0u64;
            let mut open = true;
            loop {
                let mut add = |s: Sequence, generator: &mut Generator<'_, u64>| {
                    next_key += 1;
                    let added = if s.stream.is_some() {
                        generator.add_streamed(next_key, s.prompt, s.params)
                    } else {
                        generator.add(next_key, s.prompt, s.params)
                    };
                    match added {
                        Ok(()) => {
                            replies.insert(
                                next_key,
                                Waiter {
                                    reply: s.reply,
                                    stream: s.stream,
                                },
                            );
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
                // A job that went away (drained, aborted, cancelled) frees
                // its sequences.
                let mut cancelled = false;
                replies.retain(|key, waiter| {
                    let keep = !waiter.reply.is_closed();
                    if !keep && generator.cancel(key) {
                        stats.cancelled_sequences.fetch_add(1, Ordering::Relaxed);
                        cancelled = true;
                    }
                    keep
                });
                if cancelled {
                    stats.record_generate_running(
                        generator.running(),
                        generator.reserved_kv_bytes(),
                    );
                }
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
                        // A finished prompt's last piece (text and logprobs) goes with how it ended.
                        let mut last_piece = HashMap::new();
                        let wire = |to: &StreamTo, logprobs: &[TokenLogprob]| {
                            to.logprobs
                                .then(|| wire_logprobs(&tokenizer, logprobs))
                        };
                        for (key, piece) in generator.take_streamed() {
                            if done.iter().any(|(k, _)| *k == key) {
                                last_piece.insert(key, piece);
                            } else if let Some(Waiter {
                                stream: Some(to), ..
                            }) = replies.get(&key)
                            {
                                let _ = to.events.send(StreamEvent::Text {
                                    item: to.item,
                                    logprobs: wire(to, &piece.logprobs),
                                    text: piece.text,
                                });
                            }
                        }
                        for (key, generated) in done {
                            stats
                                .generated_tokens
                                .fetch_add(generated.completion_tokens as u64, Ordering::Relaxed);
                            if let Some(waiter) = replies.remove(&key) {
                                if let Some(to) = &waiter.stream {
                                    let last = last_piece.remove(&key).unwrap_or_default();
                                    let _ = to.events.send(StreamEvent::Finished {
                                        item: to.item,
                                        logprobs: wire(to, &last.logprobs),
                                        text: last.text,
                                        finish_reason: wire_finish_reason(generated.finish_reason),
                                        prompt_tokens: generated.prompt_tokens,
                                        completion_tokens: generated.completion_tokens,
                                    });
                                }
                                let _ = waiter.reply.send(Ok(generated));
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
                        for (_, waiter) in replies.drain() {
                            let _ = waiter.reply.send(Err(error.clone()));
                        }
                        generator = new_generator();
                    }
                }
            }
        })
}
