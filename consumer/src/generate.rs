//! The generate task's path after fetch: prompts are tokenized (chat messages
//! through the model's template), checked against the limits, and handed one
//! sequence each to the generation thread, which owns the model and a
//! continuous-batching [`Generator`]: sequences join a step as they arrive and
//! leave it as they finish.
//!
//! Memory: a job's reservation (see `budget.md`) covers the KV cache of all
//! its prompts at `prompt + max_new_tokens` tokens, so the sum of the KV
//! caches the thread allocates never exceeds the budget; the generator is
//! also given the budget as its own KV cap, a second guard.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use anyhow::{Context, bail};
use candle_core::Device;
use sluice_schemas::{ErrorCode, Generation, Item, Parameters, PromptInput};
use tokio::sync::{mpsc, oneshot};

use crate::error::JobError;
use crate::model::generation::{Generated, GenerationParams, Generator};
use crate::model::gguf_tokenizer::GgufTokenizer;
use crate::model::llama::{Llama, WeightFormat};
use crate::telemetry::Stats;

/// The limits a generate job is checked against.
#[derive(Debug, Clone)]
pub struct GenerateLimits {
    pub max_prompt_tokens: usize,
    pub max_new_tokens: usize,
    pub default_max_new_tokens: usize,
}

/// One prompt on its way to the generation thread.
pub struct Sequence {
    pub prompt: Vec<u32>,
    pub params: GenerationParams,
    pub reply: oneshot::Sender<Result<Generated, JobError>>,
}

/// What the job side holds of the generate task.
pub struct GenerateEngine {
    pub tokenizer: Arc<GgufTokenizer>,
    pub sequences: mpsc::Sender<Sequence>,
    pub limits: GenerateLimits,
}

/// The one `.gguf` file in `dir` (or `dir` itself when it is a file).
pub fn find_gguf(dir: &Path) -> anyhow::Result<PathBuf> {
    if dir.is_file() {
        return Ok(dir.to_path_buf());
    }
    let entries = std::fs::read_dir(dir).with_context(|| {
        format!(
            "no model at {}: run ./scripts/setup (it unpacks SmolLM2 into models/smollm2), or set --model-dir",
            dir.display()
        )
    })?;
    let mut found: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "gguf"))
        .collect();
    found.sort();
    match found.len() {
        1 => Ok(found.remove(0)),
        0 => bail!(
            "no .gguf file in {}: run ./scripts/setup, or point --model-dir at a GGUF file",
            dir.display()
        ),
        _ => bail!(
            "{} holds {} .gguf files: point --model-dir at the one to serve",
            dir.display(),
            found.len()
        ),
    }
}

/// Loads the GGUF model and its tokenizer.
pub fn load(
    dir: &Path,
    weights: WeightFormat,
    device: &Device,
) -> anyhow::Result<(Llama, GgufTokenizer)> {
    let path = find_gguf(dir)?;
    Llama::load(&path, weights, device).map_err(|e| anyhow::anyhow!("{e}"))
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
                Generator::new(&model, &tokenizer, settings.max_step_tokens)
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
                        let code = match e {
                            crate::model::ModelError::OutOfMemory(_) => {
                                ErrorCode::DeviceOutOfMemory
                            }
                            crate::model::ModelError::Failed(_) => ErrorCode::Internal,
                        };
                        for (_, reply) in replies.drain() {
                            let _ = reply.send(Err(JobError::new(
                                code,
                                format!("generation step failed: {e}"),
                            )));
                        }
                        generator = new_generator();
                    }
                }
            }
        })
}

/// A prompt with its parameters resolved and checked.
struct Planned {
    input: PromptInput,
    params: GenerationParams,
}

impl GenerateEngine {
    /// Resolves each prompt's parameters (its own, else the job's, else the
    /// consumer's defaults) and checks them against the limits.
    fn plan(&self, items: Vec<Item>, job: &Parameters) -> Result<Vec<Planned>, JobError> {
        let defaults = job.generate();
        items
            .into_iter()
            .enumerate()
            .map(|(i, item)| {
                let Item::Prompt(prompt) = item else {
                    return Err(JobError::new(
                        ErrorCode::InputInvalid,
                        format!("item {i} is not a prompt"),
                    ));
                };
                let p = prompt.parameters.or(&defaults);
                p.check().map_err(|m| {
                    JobError::new(ErrorCode::InvalidParameters, format!("item {i}: {m}"))
                })?;
                let max_new = p
                    .max_new_tokens
                    .map_or(self.limits.default_max_new_tokens, |n| n as usize);
                if max_new > self.limits.max_new_tokens {
                    return Err(JobError::new(
                        ErrorCode::InvalidParameters,
                        format!(
                            "item {i}: max_new_tokens is {max_new}; this consumer generates at most {} per prompt (--max-new-tokens)",
                            self.limits.max_new_tokens
                        ),
                    ));
                }
                Ok(Planned {
                    input: prompt.input,
                    params: GenerationParams {
                        max_new_tokens: max_new,
                        temperature: p.temperature.unwrap_or(0.0),
                        top_p: p.top_p.unwrap_or(1.0),
                        seed: p.seed.unwrap_or(0),
                        stop: p.stop.unwrap_or_default(),
                        ignore_eos: false,
                    },
                })
            })
            .collect()
    }

    /// Plans and tokenizes the prompts (off the runtime): each sequence's
    /// ids and parameters, in item order.
    pub async fn prepare(
        &self,
        items: Vec<Item>,
        job: &Parameters,
    ) -> Result<Vec<(Vec<u32>, GenerationParams)>, JobError> {
        let planned = self.plan(items, job)?;
        let tokenizer = Arc::clone(&self.tokenizer);
        let max_prompt = self.limits.max_prompt_tokens;
        tokio::task::spawn_blocking(move || {
            planned
                .into_iter()
                .enumerate()
                .map(|(i, p)| {
                    // A raw prompt is the publisher's own template, special
                    // tokens included; chat contents are always plain text.
                    let ids = match &p.input {
                        PromptInput::Text(t) => tokenizer.encode(t),
                        PromptInput::Messages(m) => tokenizer.encode_chat(m),
                    }
                    .map_err(|e| {
                        JobError::new(ErrorCode::InputInvalid, format!("item {i}: {e}"))
                    })?;
                    if ids.is_empty() {
                        return Err(JobError::new(
                            ErrorCode::InputInvalid,
                            format!("item {i}: the prompt is empty"),
                        ));
                    }
                    if ids.len() > max_prompt {
                        return Err(JobError::new(
                            ErrorCode::ItemTooLong,
                            format!(
                                "item {i}: the prompt is {} tokens; this consumer accepts at most {max_prompt} (--max-prompt-tokens): shorten it",
                                ids.len()
                            ),
                        ));
                    }
                    Ok((ids, p.params))
                })
                .collect()
        })
        .await
        .map_err(|e| JobError::new(ErrorCode::Internal, format!("tokenizer task failed: {e}")))?
    }

    /// Sends the sequences to the generation thread and waits for all of
    /// them; the generations come back in item order.
    pub async fn generate(
        &self,
        prepared: Vec<(Vec<u32>, GenerationParams)>,
    ) -> Result<Vec<Generation>, JobError> {
        let stopped = || {
            JobError::new(
                ErrorCode::Internal,
                "the generation thread has stopped (shutting down)",
            )
        };
        let mut waiting = Vec::with_capacity(prepared.len());
        for (prompt, params) in prepared {
            let (reply, rx) = oneshot::channel();
            self.sequences
                .send(Sequence {
                    prompt,
                    params,
                    reply,
                })
                .await
                .map_err(|_| stopped())?;
            waiting.push(rx);
        }
        let mut out = Vec::with_capacity(waiting.len());
        for rx in waiting {
            let g = rx.await.map_err(|_| stopped())??;
            out.push(Generation {
                text: g.text,
                finish_reason: g.finish_reason,
                prompt_tokens: g.prompt_tokens as u64,
                completion_tokens: g.completion_tokens as u64,
            });
        }
        Ok(out)
    }
}
