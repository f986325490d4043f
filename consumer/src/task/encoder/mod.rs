//! The encoder tasks' engine: `embed` (texts to pooled vectors), `rerank`
//! (query-document pairs to one score each, a cross-encoder's "vector" of
//! one) and `classify` (texts to their label scores, a sequence
//! classifier's "vector" of logits). Prepare: tokenize a job's texts or pairs (off the
//! runtime) and count what they really cost. Run: hand each item to the
//! batcher, which groups items of many jobs by token sum (`batcher`, see
//! `batcher.md`), for the executor thread that owns the model
//! (`executor`), and gather one vector per item back, with the job's batch
//! wait and inference times. The tasks share every step after the
//! tokenizer, the budget's arithmetic included.

pub mod batcher;
pub mod executor;
mod job;
mod output;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use opentelemetry::KeyValue;
use sluice_schemas::{ErrorCode, Item, Task, Timings, Usage};
use tokio::sync::mpsc;

use self::batcher::{BatchItem, ItemOutcome};
use super::startup::{InFlightUnits, Pacing, Started, budget_limit, device_name, open_device};
use crate::budget::{Budget, ItemCost, JobCost};
use crate::config::{Config, ModelConfig};
use crate::error::JobError;
use crate::telemetry::{JobTrace, Stats, Tracing};
use sluice_models::encoder::classifier::{ClassifierActivation, SequenceClassifier};
use sluice_models::encoder::cross_encoder::CrossEncoder;
use sluice_models::encoder::files::Prompts;
use sluice_models::{EmbeddingModel, SentenceEncoder, TextTokenizer};

/// embed, rerank or classify: the tokenizer, and the batcher that feeds the
/// executor.
pub struct EncoderEngine {
    /// Which forward runs (`EmbeddingModel::forward_name`).
    pub forward: &'static str,
    /// Length of each item's vector: the model's width for embed, 1 (the
    /// score) for rerank, the labels for classify.
    pub dim: usize,
    pub tokenizer: Arc<TextTokenizer>,
    pub inputs: EncoderInputs,
    pub batcher: mpsc::Sender<BatchItem>,
}

/// What an encoder's items are.
#[derive(Clone, Debug)]
pub enum EncoderInputs {
    /// embed: texts, each after the prompt a job names in
    /// `parameters.prompt_name` (or the model's default); their vectors
    /// L2-normalized where a job says so, else where `normalize` says (the
    /// model's modules, or the operator's `--normalize`).
    Texts { prompts: Prompts, normalize: bool },
    /// rerank: (query, document) pairs in the tokenizer's pair template,
    /// with their token types.
    Pairs,
    /// classify: texts, each to its logits, turned into label scores by
    /// `activation` unless a job asks for `raw_scores`.
    Labels {
        labels: Arc<[String]>,
        activation: ClassifierActivation,
    },
}

impl EncoderInputs {
    pub fn task(&self) -> Task {
        match self {
            EncoderInputs::Texts { .. } => Task::Embed,
            EncoderInputs::Pairs => Task::Rerank,
            EncoderInputs::Labels { .. } => Task::Classify,
        }
    }

    /// What an item costs, in tokens: a token's id and its batch copy (a
    /// pair's token also has its type); a text's vector and its `.npy` copy
    /// of `dim` floats each, or a pair's score, or a text's logits and its
    /// labels in JSON (a label's name, id and score in up to
    /// `LABEL_JSON_BYTES` beyond the name). A text carries two special
    /// tokens beyond its bytes, a pair up to four (RoBERTa's
    /// `<s> q </s></s> d </s>`).
    pub fn item_cost(&self, dim: u64, max_tokens_per_item: u64) -> ItemCost {
        const TOKEN_ID_BYTES: u64 = 8;
        match self {
            EncoderInputs::Texts { .. } => ItemCost {
                max_units: max_tokens_per_item,
                units_beyond_bytes: Some(2),
                bytes_per_unit: TOKEN_ID_BYTES,
                bytes_per_item: 2 * 4 * dim,
                input_copies: 3,
            },
            EncoderInputs::Pairs => ItemCost {
                max_units: max_tokens_per_item,
                units_beyond_bytes: Some(4),
                bytes_per_unit: 2 * TOKEN_ID_BYTES,
                bytes_per_item: 2 * 4,
                input_copies: 3,
            },
            EncoderInputs::Labels { labels, .. } => {
                const LABEL_JSON_BYTES: u64 = 64;
                let json: u64 = labels
                    .iter()
                    .map(|l| l.len() as u64 + LABEL_JSON_BYTES)
                    .sum();
                ItemCost {
                    max_units: max_tokens_per_item,
                    units_beyond_bytes: Some(2),
                    bytes_per_unit: TOKEN_ID_BYTES,
                    bytes_per_item: 4 * dim + 2 * json,
                    input_copies: 3,
                }
            }
        }
    }
}

/// One item's tokens: a text's ids, or a pair's with their token types.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EncoderItem {
    pub ids: Vec<u32>,
    pub type_ids: Option<Vec<u32>>,
}

/// A job's items, tokenized.
pub struct Prepared {
    pub items: Vec<EncoderItem>,
    pub usage: Usage,
}

/// The model side of start-up, also used by the offline `embed` command.
pub struct LoadedModel {
    pub model: Box<dyn EmbeddingModel>,
    pub tokenizer: Arc<TextTokenizer>,
    pub inputs: EncoderInputs,
    pub device: candle_core::Device,
}

/// Loads `task`'s model (embed: a sentence-transformers encoder; rerank: a
/// cross-encoder; classify: a sequence classifier) and its tokenizer, cut
/// at the model's token limit.
pub fn load_encoder(config: &ModelConfig, task: Task) -> anyhow::Result<LoadedModel> {
    let device = open_device(config).context("cannot open the device")?;
    let dir = &config.dir(task);
    if !dir.join("model.safetensors").is_file() {
        match task {
            Task::Rerank => bail!(
                "no model at {}: the rerank task needs --model-dir, a cross-encoder's directory (what sentence-transformers' CrossEncoder.save writes: config.json, model.safetensors, tokenizer.json)",
                dir.display()
            ),
            Task::Classify => bail!(
                "no model at {}: the classify task needs --model-dir, a sequence classifier's directory (what transformers' save_pretrained writes for a ...ForSequenceClassification model: config.json with id2label, model.safetensors, tokenizer.json)",
                dir.display()
            ),
            _ => bail!(
                "no model at {}: run ./scripts/setup (it unpacks all-MiniLM-L6-v2 into weights/), or set --model-dir",
                dir.display()
            ),
        }
    }
    let (model, inputs): (Box<dyn EmbeddingModel>, EncoderInputs) = match task {
        Task::Rerank => (
            Box::new(CrossEncoder::load(
                dir,
                device.clone(),
                config.max_tokens_per_item,
                config.embed_weights,
            )?),
            EncoderInputs::Pairs,
        ),
        Task::Classify => {
            let model = SequenceClassifier::load(
                dir,
                device.clone(),
                config.max_tokens_per_item,
                config.embed_weights,
            )?;
            let inputs = EncoderInputs::Labels {
                labels: model.labels().into(),
                activation: model.activation(),
            };
            (Box::new(model), inputs)
        }
        _ => {
            let model = SentenceEncoder::load(
                dir,
                device.clone(),
                config.max_tokens_per_item,
                config.embed_weights,
            )?;
            let prompts = model.prompts().clone();
            let normalize = config.normalize.default_for(model.normalizes());
            tracing::info!(
                model_normalizes = model.normalizes(),
                rule = ?config.normalize,
                normalize,
                "vectors of jobs that do not set parameters.normalize"
            );
            (Box::new(model), EncoderInputs::Texts { prompts, normalize })
        }
    };
    let max_tokens = model.max_tokens_per_item();
    config.check_batch_holds(max_tokens)?;
    let tokenizer = TextTokenizer::load(&dir.join("tokenizer.json"), max_tokens)?;
    Ok(LoadedModel {
        model,
        tokenizer: Arc::new(tokenizer),
        inputs,
        device,
    })
}

/// The encoder tasks: load the model, size and check the budget, warm up,
/// start the batcher and the executor thread.
pub fn start(config: &Config, stats: &Arc<Stats>, tracing: &Tracing) -> anyhow::Result<Started> {
    let loaded = load_encoder(&config.model, config.task())?;
    let device = device_name(&loaded.device);
    let model = loaded.model;
    let dim = model.dim();
    let limit = budget_limit(config, &loaded.device)?;
    let (n, len) = sluice_models::worst_batch_shape(
        config.model.max_batch_tokens,
        model.max_tokens_per_item(),
    );
    let activation = model.batch_cost_bytes(n, len);
    let cost = JobCost {
        max_input_bytes: config.max_input_bytes(),
        max_items: config.max_items_per_job(),
        per_item: loaded
            .inputs
            .item_cost(dim as u64, model.max_tokens_per_item() as u64),
    };
    let worst_job = cost.worst_bytes();
    if activation + worst_job > limit {
        bail!(
            "the memory budget ({} MiB) cannot hold one batch at max_batch_tokens={} ({} MiB of activations \
             for {n} items x {len} tokens) plus one job at its worst case ({} MiB, from max_input_bytes={} and \
             max_items_per_job={}): raise --memory-budget (or --memory-fraction), or lower --max-batch-tokens, \
             --max-input-bytes or --max-items-per-job",
            limit >> 20,
            config.model.max_batch_tokens,
            activation >> 20,
            worst_job >> 20,
            config.max_input_bytes(),
            config.max_items_per_job(),
        );
    }
    // Warm up with the largest batch the budget allows: it proves the shape
    // fits and takes the first-call costs out of the first job.
    let warm = Instant::now();
    let dummy: Vec<Vec<u32>> = (0..n).map(|_| vec![101u32; len]).collect();
    let refs: Vec<&[u32]> = dummy.iter().map(Vec::as_slice).collect();
    model.embed(&refs).map_err(|e| {
        anyhow::anyhow!(
            "warm-up with the largest batch ({n} x {len} tokens) failed: {e}; lower --max-batch-tokens or --memory-budget"
        )
    })?;
    drop(dummy);
    tracing::info!(
        task = config.task().as_str(),
        forward = model.forward_name(),
        cpu_kernels = sluice_models::cpu::level().name(),
        budget_mib = limit >> 20,
        activation_mib = activation >> 20,
        worst_job_kib = worst_job >> 10,
        warmup_ms = warm.elapsed().as_millis() as u64,
        "model ready"
    );
    let forward = model.forward_name();
    // The one batch in flight holds its activations outside the job budget.
    let budget = Budget::new(limit - activation).with_floor(worst_job);
    let (item_tx, item_rx) = mpsc::channel(4096);
    let (batch_tx, batch_rx) = mpsc::channel(1);
    let executor = executor::spawn(
        model,
        batch_rx,
        Arc::clone(stats),
        budget.clone(),
        tracing.clone(),
    )?;
    tokio::spawn(batcher::run(
        item_rx,
        batch_tx,
        config.model.max_batch_tokens,
        Duration::from_millis(config.max_wait_ms),
    ));
    let engine = EncoderEngine {
        forward,
        dim,
        tokenizer: loaded.tokenizer,
        inputs: loaded.inputs,
        batcher: item_tx,
    };
    let max_tokens_per_item = cost.per_item.max_units;
    let pacing = Pacing {
        in_flight: Some(InFlightUnits {
            cap: match config.max_tokens_in_flight {
                0 => 2 * config.model.max_batch_tokens,
                n => n,
            } as u64,
            per_job: max_tokens_per_item,
        }),
        tenant_quantum: config.model.max_batch_tokens as u64,
        job_estimate: max_tokens_per_item,
    };
    Ok(Started {
        engine: Box::new(engine),
        model_thread: executor,
        cost,
        pacing,
        budget,
        memory: crate::memory::MemoryProbe::for_device(&loaded.device),
        device,
    })
}

impl EncoderEngine {
    /// Tokenizes a job's items (off the runtime): embed's texts each after
    /// the prompt `prompt_name` names (none: the model's default prompt, if
    /// it has one; a name it lacks is `invalid_parameters`), classify's
    /// texts as they are, rerank's pairs in the pair template. `truncate` cuts an item over the model's limit
    /// instead of failing the job.
    pub async fn prepare(
        &self,
        items: Vec<Item>,
        truncate: bool,
        prompt_name: Option<&str>,
    ) -> Result<Prepared, JobError> {
        let misread = || {
            JobError::new(
                ErrorCode::Internal,
                format!(
                    "bug: a {} job's input was read as another task's items",
                    self.inputs.task()
                ),
            )
        };
        let tokenizer = Arc::clone(&self.tokenizer);
        let tokenized: Vec<(EncoderItem, bool)> = match &self.inputs {
            EncoderInputs::Texts { .. } | EncoderInputs::Labels { .. } => {
                let texts = items
                    .into_iter()
                    .map(|item| match item {
                        Item::Text(t) => Ok(t),
                        _ => Err(misread()),
                    })
                    .collect::<Result<Vec<String>, JobError>>()?;
                let texts = match &self.inputs {
                    EncoderInputs::Texts { prompts, .. } => {
                        prompts.apply(prompt_name, texts).map_err(|e| {
                            JobError::new(
                                ErrorCode::InvalidParameters,
                                format!("parameters.prompt_name: {e}"),
                            )
                        })?
                    }
                    _ => texts,
                };
                off_runtime(move || tokenizer.encode(texts, truncate))
                    .await?
                    .into_iter()
                    .map(|t| {
                        let item = EncoderItem {
                            ids: t.ids,
                            type_ids: None,
                        };
                        (item, t.truncated)
                    })
                    .collect()
            }
            EncoderInputs::Pairs => {
                let pairs = items
                    .into_iter()
                    .map(|item| match item {
                        Item::Pair(p) => Ok((p.query, p.document)),
                        _ => Err(misread()),
                    })
                    .collect::<Result<Vec<(String, String)>, JobError>>()?;
                off_runtime(move || tokenizer.encode_pairs(pairs, truncate))
                    .await?
                    .into_iter()
                    .map(|p| {
                        let item = EncoderItem {
                            ids: p.ids,
                            type_ids: Some(p.type_ids),
                        };
                        (item, p.truncated)
                    })
                    .collect()
            }
        };
        let usage = Usage {
            items: tokenized.len() as u64,
            tokens: tokenized.iter().map(|(t, _)| t.ids.len() as u64).sum(),
            truncated_items: tokenized.iter().filter(|(_, cut)| *cut).count() as u64,
            completion_tokens: 0,
            item_tokens: tokenized.iter().map(|(t, _)| t.ids.len() as u64).collect(),
            audio_ms: 0,
        };
        Ok(Prepared {
            items: tokenized.into_iter().map(|(t, _)| t).collect(),
            usage,
        })
    }

    /// Hands the items to the batcher and gathers one vector per item;
    /// `served` hears each item's tokens as its batch finishes.
    pub async fn run(
        &self,
        tokenized: Vec<EncoderItem>,
        timings: &mut Timings,
        trace: &JobTrace,
        served: impl Fn(u64),
    ) -> Result<Vec<Vec<f32>>, JobError> {
        let n = tokenized.len();
        let lengths: Vec<u64> = tokenized.iter().map(|t| t.ids.len() as u64).collect();
        let span = trace.span_context();
        let (tx, mut rx) = mpsc::unbounded_channel();
        let mut ready_at = Instant::now();
        for (index, item) in tokenized.into_iter().enumerate() {
            ready_at = Instant::now();
            let item = BatchItem {
                ids: item.ids,
                type_ids: item.type_ids,
                index,
                job: tx.clone(),
                ready_at,
                trace: span.clone(),
            };
            self.batcher.send(item).await.map_err(|_| {
                JobError::new(
                    ErrorCode::Internal,
                    "the batcher has stopped (shutting down)",
                )
            })?;
        }
        drop(tx);
        let mut vectors: Vec<Option<Vec<f32>>> = vec![None; n];
        let mut batches = HashSet::new();
        let mut inference_ms = 0.0;
        let mut last_start = ready_at;
        let mut first_start: Option<Instant> = None;
        let mut last_end = ready_at;
        for _ in 0..n {
            match rx.recv().await {
                Some(ItemOutcome::Done {
                    index,
                    vector,
                    batch,
                }) => {
                    if batches.insert(batch.id) {
                        inference_ms += batch.model_ms;
                    }
                    last_start = last_start.max(batch.started);
                    first_start = Some(first_start.map_or(batch.started, |f| f.min(batch.started)));
                    last_end =
                        last_end.max(batch.started + Duration::from_secs_f64(batch.model_ms / 1e3));
                    if let Some(slot) = vectors.get_mut(index) {
                        *slot = Some(vector);
                        served(lengths[index]);
                    }
                }
                Some(ItemOutcome::Failed { error, .. }) => return Err(error),
                None => {
                    return Err(JobError::new(
                        ErrorCode::Internal,
                        "the executor stopped before the job's items were done",
                    ));
                }
            }
        }
        timings.batch_wait =
            Some(last_start.saturating_duration_since(ready_at).as_secs_f64() * 1e3);
        timings.inference = Some(inference_ms);
        trace.stage("batch_wait", ready_at, last_start.max(ready_at));
        trace.stage_with(
            "inference",
            first_start.unwrap_or(ready_at),
            last_end,
            vec![
                KeyValue::new("sluice.batches", batches.len() as i64),
                KeyValue::new("sluice.model_ms", inference_ms),
            ],
        );
        vectors
            .into_iter()
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| JobError::new(ErrorCode::Internal, "bug: an item got no vector"))
    }
}

/// Runs the tokenizer on the blocking pool.
async fn off_runtime<T: Send + 'static>(
    tokenize: impl FnOnce() -> Result<T, sluice_models::TokenizeError> + Send + 'static,
) -> Result<T, JobError> {
    tokio::task::spawn_blocking(tokenize)
        .await
        .map_err(|e| JobError::new(ErrorCode::Internal, format!("tokenizer task failed: {e}")))?
        .map_err(JobError::from)
}

/// Scales `v` to unit length (sentence-transformers' `normalize_embeddings`).
pub fn l2_normalize(mut v: Vec<f32>) -> Vec<f32> {
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-12);
    v.iter_mut().for_each(|x| *x /= norm);
    v
}
