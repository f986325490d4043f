//! `sluice-consumer embed` and `sluice-consumer rerank`: the model alone on a
//! local JSONL file, batched by the same queue as the service. For checking a
//! model, and for benchmarks.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use sluice_schemas::{Item, Task};
use tokio::sync::mpsc;

use crate::config::ModelConfig;
use crate::fetch;
use crate::task::encoder::batcher::{BatchItem, Queue};
use crate::task::encoder::{EncoderInputs, EncoderItem, LoadedModel, l2_normalize, load_encoder};
use sluice_schemas::npy;

#[derive(Debug, Clone, clap::Args)]
pub struct EmbedArgs {
    /// JSONL input: one JSON string or {"text": ...} per line.
    #[arg(long)]
    pub input: PathBuf,
    /// Where to write the float32 `.npy` matrix, shape [items, dim].
    #[arg(long)]
    pub output: PathBuf,
    /// The prompt of the model's config_sentence_transformers.json to put
    /// before every text (default: the model's default prompt, if any).
    #[arg(long)]
    pub prompt_name: Option<String>,
    #[command(flatten)]
    pub model: ModelConfig,
}

#[derive(Debug, Clone, clap::Args)]
pub struct RerankArgs {
    /// JSONL input: one {"query": ..., "document": ...} per line.
    #[arg(long)]
    pub input: PathBuf,
    /// Where to write the float32 `.npy` vector of scores, shape [items].
    #[arg(long)]
    pub output: PathBuf,
    #[command(flatten)]
    pub model: ModelConfig,
}

/// What a run measured.
#[derive(Debug, Clone, serde::Serialize)]
pub struct EmbedReport {
    /// Which forward ran (`EmbeddingModel::forward_name`).
    pub forward: &'static str,
    pub texts: usize,
    pub real_tokens: u64,
    pub padded_tokens: u64,
    pub batches: usize,
    pub tokenize_secs: f64,
    pub model_secs: f64,
    pub total_secs: f64,
}

pub fn embed_file(args: &EmbedArgs) -> anyhow::Result<EmbedReport> {
    args.model.validate()?;
    crate::alloc::tune();
    let loaded = load_encoder(&args.model, Task::Embed)?;
    let EncoderInputs::Texts { prompts, normalize } = &loaded.inputs else {
        anyhow::bail!("bug: an embedding model loaded as a reranker");
    };
    let body = std::fs::read(&args.input)
        .with_context(|| format!("cannot read {}", args.input.display()))?;
    let mut items = Vec::new();
    fetch::parse_jsonl(Task::Embed, 0, &body, &mut items, u64::MAX)
        .map_err(|e| anyhow::anyhow!("{}: {}", args.input.display(), e.message))?;
    let texts: Vec<String> = items
        .into_iter()
        .filter_map(|i| match i {
            Item::Text(t) => Some(t),
            _ => None, // an embed input holds texts only
        })
        .collect();
    let texts = prompts.apply(args.prompt_name.as_deref(), texts)?;
    let (vectors, report) = embed_texts(&loaded, texts, args.model.max_batch_tokens)?;
    let vectors = if *normalize {
        vectors.into_iter().map(l2_normalize).collect()
    } else {
        vectors
    };
    let dim = loaded.model.dim();
    std::fs::write(&args.output, npy::encode_f32(&vectors, dim))
        .with_context(|| format!("cannot write {}", args.output.display()))?;
    Ok(report)
}

/// Scores every (query, document) pair of `args.input` with a cross-encoder
/// and writes the scores.
pub fn rerank_file(args: &RerankArgs) -> anyhow::Result<EmbedReport> {
    args.model.validate()?;
    crate::alloc::tune();
    let loaded = load_encoder(&args.model, Task::Rerank)?;
    let body = std::fs::read(&args.input)
        .with_context(|| format!("cannot read {}", args.input.display()))?;
    let mut items = Vec::new();
    fetch::parse_jsonl(Task::Rerank, 0, &body, &mut items, u64::MAX)
        .map_err(|e| anyhow::anyhow!("{}: {}", args.input.display(), e.message))?;
    let pairs: Vec<(String, String)> = items
        .into_iter()
        .filter_map(|i| match i {
            Item::Pair(p) => Some((p.query, p.document)),
            _ => None, // a rerank input holds pairs only
        })
        .collect();
    let start = Instant::now();
    let tokenized = loaded.tokenizer.encode_pairs(pairs, true)?;
    let tokenize_secs = start.elapsed().as_secs_f64();
    let items = tokenized
        .into_iter()
        .map(|p| EncoderItem {
            ids: p.ids,
            type_ids: Some(p.type_ids),
        })
        .collect();
    let (vectors, mut report) = run_items(&loaded, items, args.model.max_batch_tokens)?;
    report.tokenize_secs = tokenize_secs;
    report.total_secs = start.elapsed().as_secs_f64();
    let scores: Vec<f32> = vectors.iter().filter_map(|v| v.first().copied()).collect();
    std::fs::write(&args.output, npy::encode_f32_vector(&scores))
        .with_context(|| format!("cannot write {}", args.output.display()))?;
    Ok(report)
}

/// Embeds `texts` (not normalized) through the service's batcher queue at
/// `max_batch_tokens`; the vectors in input order, and what it measured.
pub fn embed_texts(
    loaded: &LoadedModel,
    texts: Vec<String>,
    max_batch_tokens: usize,
) -> anyhow::Result<(Vec<Vec<f32>>, EmbedReport)> {
    let start = Instant::now();
    let tokenized = loaded.tokenizer.encode(texts, true)?;
    let tokenize_secs = start.elapsed().as_secs_f64();
    let items = tokenized
        .into_iter()
        .map(|t| EncoderItem {
            ids: t.ids,
            type_ids: None,
        })
        .collect();
    let (vectors, mut report) = run_items(loaded, items, max_batch_tokens)?;
    report.tokenize_secs = tokenize_secs;
    report.total_secs = start.elapsed().as_secs_f64();
    Ok((vectors, report))
}

/// Runs tokenized items through the service's batcher queue at
/// `max_batch_tokens`: the model's vectors in input order, and what it
/// measured (the caller adds its tokenizing time).
fn run_items(
    loaded: &LoadedModel,
    items: Vec<EncoderItem>,
    max_batch_tokens: usize,
) -> anyhow::Result<(Vec<Vec<f32>>, EmbedReport)> {
    let n = items.len();
    let real_tokens = items.iter().map(|t| t.ids.len() as u64).sum();
    let (tx, _rx) = mpsc::unbounded_channel();
    let mut queue = Queue::default();
    let now = Instant::now();
    for (index, item) in items.into_iter().enumerate() {
        queue.push(BatchItem {
            ids: item.ids,
            type_ids: item.type_ids,
            index,
            job: tx.clone(),
            ready_at: now,
            trace: None,
        });
    }
    let mut vectors = vec![Vec::new(); n];
    let mut batches = 0;
    let mut padded_tokens = 0u64;
    let model_start = Instant::now();
    while !queue.is_empty() {
        let batch = queue.next_batch(max_batch_tokens);
        let longest = batch.iter().map(|i| i.ids.len()).max().unwrap_or(0);
        padded_tokens += (batch.len() * longest) as u64;
        let seqs: Vec<&[u32]> = batch.iter().map(|i| i.ids.as_slice()).collect();
        let types: Option<Vec<&[u32]>> = batch
            .iter()
            .map(|i| i.type_ids.as_deref())
            .collect::<Option<_>>();
        let out = loaded.model.embed_typed(&seqs, types.as_deref())?;
        for (item, v) in batch.iter().zip(out) {
            vectors[item.index] = v;
        }
        batches += 1;
    }
    let model_secs = model_start.elapsed().as_secs_f64();
    let report = EmbedReport {
        forward: loaded.model.forward_name(),
        texts: n,
        real_tokens,
        padded_tokens,
        batches,
        tokenize_secs: 0.0,
        model_secs,
        total_secs: model_secs,
    };
    Ok((vectors, report))
}
