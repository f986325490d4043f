//! all-MiniLM-L6-v2 and other BERT sentence encoders, with the pooling their
//! sentence-transformers files ask for (`files.rs`: the mean
//! of the last hidden state over the sequence's own tokens, its `[CLS]`
//! state, or the maximum), over the sequence's own tokens. Normalization is
//! the job's choice and happens later.
//!
//! Two forwards: sluice's own (`packed.rs`) on x86-64 CPUs whose kernel level
//! is AVX2 + FMA (see `cpu.rs`), and candle-transformers' BERT elsewhere
//! (CUDA, other CPUs), which is also the reference the tests hold the first
//! to.

use std::path::Path;

use candle_core::{DType, Device, Tensor};
use candle_nn::VarBuilder;
use candle_transformers::models::bert::{BertModel, Config as BertConfig};
use candle_transformers::models::xlm_roberta::{Config as RobertaConfig, XLMRobertaModel};

use super::files::{EncoderFiles, Prompts};
use super::model::EmbeddingModel;
use super::packed::{BertEncoder, PositionIds};
use super::pooling::Pooling;
use crate::encoder_kernels;
use crate::error::{LoadError, ModelError};

pub struct SentenceEncoder {
    forward: Forward,
    device: Device,
    hidden: usize,
    intermediate: usize,
    heads: usize,
    vocab_size: usize,
    max_tokens_per_item: usize,
    pooling: Pooling,
    prompts: Prompts,
    /// Whether the model's sentence-transformers modules end in
    /// `Normalize` (its vectors are unit vectors there).
    normalize: bool,
    /// The id padded batches are filled with (the candle forwards).
    pad_id: u32,
}

enum Forward {
    /// Packed tokens on sluice's CPU kernels.
    Packed(BertEncoder),
    /// Padded batches on candle-transformers' BERT (any device).
    Candle(BertModel),
    /// Padded batches on candle-transformers' XLM-RoBERTa (RoBERTa too:
    /// the same network, position ids after the padding id).
    CandleRoberta(XLMRobertaModel),
}

/// Which forward [`SentenceEncoder::load_with`] builds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ForwardChoice {
    /// sluice's own on a CPU with AVX2 + FMA, candle-transformers' otherwise.
    Fastest,
    /// candle-transformers' BERT (the reference).
    Candle,
    /// sluice's own, whatever the CPU: its SIMD kernels where the kernel
    /// level allows them, else their plain-Rust references (slow; for tests
    /// of the packed forward at every kernel level).
    Packed,
    /// As `Fastest`, with the linear layers in bf16 where the CPU has
    /// AVX512_BF16 (`--embed-weights bf16`).
    FastestBf16,
}

/// Tokens per item for a model whose files declare no limit (neither
/// sentence-transformers' `max_seq_length` nor the tokenizer's
/// `model_max_length`): all-MiniLM-L6-v2's.
pub const DEFAULT_MAX_TOKENS: usize = 256;

impl SentenceEncoder {
    /// Tokens per item the model in `dir` is run with when the deployment
    /// sets none: the limit its files declare (what sentence-transformers
    /// truncates at), else [`DEFAULT_MAX_TOKENS`], never more than its
    /// positions hold.
    pub fn max_tokens_of(dir: &Path) -> Result<usize, LoadError> {
        let files = EncoderFiles::read(dir)?;
        Self::limit_within_positions(dir, files.max_seq_length)
    }

    /// `declared` (else [`DEFAULT_MAX_TOKENS`]), within the positions of
    /// the encoder in `dir`.
    pub(crate) fn limit_within_positions(
        dir: &Path,
        declared: Option<usize>,
    ) -> Result<usize, LoadError> {
        let (config, _) = read_config(dir)?;
        let positions = PositionIds::of(&config).max_tokens(config.max_position_embeddings);
        Ok(declared.unwrap_or(DEFAULT_MAX_TOKENS).min(positions))
    }

    /// The forward `weights` asks for on `device` (`auto` measures the
    /// CPU's layers, once per process; CUDA runs f32 whatever it says).
    pub(crate) fn choice_for(
        device: &Device,
        weights: super::weights::EmbedWeights,
    ) -> ForwardChoice {
        let weights = if device.is_cpu() {
            weights.resolve()
        } else {
            weights
        };
        match weights {
            super::weights::EmbedWeights::Bf16 => ForwardChoice::FastestBf16,
            super::weights::EmbedWeights::F32 | super::weights::EmbedWeights::Auto => {
                ForwardChoice::Fastest
            }
        }
    }

    /// Loads `config.json` and `model.safetensors` from `dir`, with the
    /// fastest forward for `device` at the precision `weights` asks for,
    /// cutting items at `max_tokens_per_item` (none: the model's own limit,
    /// [`SentenceEncoder::max_tokens_of`]).
    pub fn load(
        dir: &Path,
        device: Device,
        max_tokens_per_item: Option<usize>,
        weights: super::weights::EmbedWeights,
    ) -> Result<SentenceEncoder, LoadError> {
        let max_tokens_per_item = match max_tokens_per_item {
            Some(n) => n,
            None => Self::max_tokens_of(dir)?,
        };
        let choice = Self::choice_for(&device, weights);
        Self::load_with(dir, device, max_tokens_per_item, choice)
    }

    pub fn load_with(
        dir: &Path,
        device: Device,
        max_tokens_per_item: usize,
        choice: ForwardChoice,
    ) -> Result<SentenceEncoder, LoadError> {
        let files = EncoderFiles::read(dir)?;
        Self::load_from(dir, files, device, max_tokens_per_item, choice).map(|(model, _)| model)
    }

    /// The encoder in `dir`, run as `files` say (read and checked by the
    /// caller: [`EncoderFiles::read`] for an embedding model, the
    /// cross-encoder's own reader for a reranker), and the weights it read
    /// (for a head on top, so the file is read once).
    pub(crate) fn load_from(
        dir: &Path,
        files: EncoderFiles,
        device: Device,
        max_tokens_per_item: usize,
        choice: ForwardChoice,
    ) -> Result<(SentenceEncoder, VarBuilder<'static>), LoadError> {
        if let Some(limit) = files.max_seq_length
            && max_tokens_per_item > limit
        {
            return Err(LoadError::Unsupported(format!(
                "max_tokens_per_item {max_tokens_per_item} exceeds the {limit} tokens the model was made for ({}: max_seq_length); sentence-transformers truncates there, so longer inputs would answer differently: set --max-tokens-per-item {limit} or less",
                dir.join("sentence_bert_config.json").display()
            )));
        }
        if let Some(limit) = files.max_seq_length
            && max_tokens_per_item < limit
        {
            tracing::warn!(
                model = %dir.display(),
                max_tokens_per_item,
                model_limit = limit,
                "items are cut at --max-tokens-per-item, before the model's own limit: texts longer than that embed differently from sentence-transformers"
            );
        }
        tracing::info!(
            model = %dir.display(),
            max_tokens_per_item,
            pooling = files.pooling.name(),
            normalize_module = files.normalize,
            prompts = files.prompts.names().collect::<Vec<_>>().join(","),
            default_prompt = files.prompts.default_name().unwrap_or(""),
            "encoder files read"
        );
        let config_path = dir.join("config.json");
        let (config, config_text) = read_config(dir)?;
        let positions = PositionIds::of(&config);
        let max_tokens = positions.max_tokens(config.max_position_embeddings);
        if max_tokens_per_item > max_tokens {
            return Err(LoadError::Unsupported(format!(
                "max_tokens_per_item {max_tokens_per_item} exceeds the {max_tokens} tokens the model's {} positions hold ({}): set --max-tokens-per-item {max_tokens} or less",
                config.max_position_embeddings,
                config_path.display()
            )));
        }
        let weights = dir.join("model.safetensors");
        // Reading the file (not mmap) keeps the model free of unsafe code; the
        // weights are 90 MB.
        let bytes = std::fs::read(&weights).map_err(|source| LoadError::Read {
            path: weights.clone(),
            source,
        })?;
        let vb = VarBuilder::from_buffered_safetensors(bytes, DType::F32, &device).map_err(
            |source| LoadError::Weights {
                path: weights.clone(),
                source,
            },
        )?;
        let build = |source| LoadError::Build {
            path: weights.clone(),
            source,
        };
        let fastest = match choice {
            ForwardChoice::Fastest | ForwardChoice::FastestBf16 => {
                device.is_cpu() && encoder_kernels::available()
            }
            ForwardChoice::Packed => device.is_cpu(),
            ForwardChoice::Candle => false,
        };
        let unsupported = fastest.then(|| BertEncoder::unsupported(&config)).flatten();
        if let Some(reason) = &unsupported {
            tracing::warn!(
                model = %dir.display(),
                "sluice's CPU forward does not run this model ({reason}); using candle-transformers' BERT, which is slower"
            );
        }
        let packed = fastest && unsupported.is_none();
        let weights_read = vb.clone();
        let forward = if packed {
            let weights = match choice {
                ForwardChoice::FastestBf16 => super::weights::EmbedWeights::Bf16,
                _ => super::weights::EmbedWeights::F32,
            };
            Forward::Packed(BertEncoder::load(vb, &config, weights).map_err(build)?)
        } else if positions == PositionIds::FromZero {
            Forward::Candle(BertModel::load(vb, &config).map_err(build)?)
        } else {
            let bad = |source| LoadError::Config {
                path: config_path.clone(),
                source,
            };
            let mut value: serde_json::Value = serde_json::from_str(&config_text).map_err(bad)?;
            // transformers 5 no longer writes the (only) absolute type.
            if let Some(fields) = value.as_object_mut() {
                fields
                    .entry("position_embedding_type")
                    .or_insert_with(|| "absolute".into());
            }
            let roberta: RobertaConfig = serde_json::from_value(value).map_err(bad)?;
            let vb = if vb.contains_tensor("roberta.embeddings.word_embeddings.weight") {
                vb.pp("roberta")
            } else {
                vb
            };
            Forward::CandleRoberta(XLMRobertaModel::new(&roberta, vb).map_err(build)?)
        };
        let model = SentenceEncoder {
            forward,
            device,
            vocab_size: config.vocab_size,
            hidden: config.hidden_size,
            intermediate: config.intermediate_size,
            heads: config.num_attention_heads,
            max_tokens_per_item,
            pooling: files.pooling,
            normalize: files.normalize,
            prompts: files.prompts,
            pad_id: config.pad_token_id as u32,
        };
        Ok((model, weights_read))
    }

    /// How the vectors are pooled (from the model's files).
    pub fn pooling(&self) -> Pooling {
        self.pooling
    }

    /// Whether sentence-transformers normalizes this model's vectors: its
    /// `modules.json` lists a `Normalize` module (a directory without
    /// `modules.json` has none, as sentence-transformers reads it).
    pub fn normalizes(&self) -> bool {
        self.normalize
    }

    /// The prompts a job may name (from the model's files).
    pub fn prompts(&self) -> &Prompts {
        &self.prompts
    }

    fn candle_forward(
        &self,
        batch: &[&[u32]],
        types: Option<&[&[u32]]>,
    ) -> candle_core::Result<Vec<Vec<f32>>> {
        let n = batch.len();
        let len = batch.iter().map(|s| s.len()).max().unwrap_or(0);
        let mut ids = vec![self.pad_id; n * len];
        let mut mask = vec![0u32; n * len];
        for (row, seq) in batch.iter().enumerate() {
            ids[row * len..row * len + seq.len()].copy_from_slice(seq);
            mask[row * len..row * len + seq.len()].fill(1);
        }
        let mut type_ids = vec![0u32; n * len];
        for (row, t) in types.into_iter().flatten().enumerate() {
            type_ids[row * len..row * len + t.len()].copy_from_slice(t);
        }
        let ids = Tensor::from_vec(ids, (n, len), &self.device)?;
        let mask = Tensor::from_vec(mask, (n, len), &self.device)?;
        let types = Tensor::from_vec(type_ids, (n, len), &self.device)?;
        let hidden = match &self.forward {
            Forward::Candle(model) => model.forward(&ids, &types, Some(&mask))?,
            Forward::CandleRoberta(model) => {
                model.forward(&ids, &mask, &types, None, None, None)?
            }
            Forward::Packed(_) => candle_core::bail!("bug: the packed forward has no candle model"),
        };
        // Mean and CLS on the device (one vector per sequence comes back);
        // the other modes over each sequence's own rows on the host.
        let pooled = match self.pooling {
            Pooling::Mean => {
                let mask = mask.to_dtype(DType::F32)?.unsqueeze(2)?;
                let summed = hidden.broadcast_mul(&mask)?.sum(1)?;
                summed.broadcast_div(&mask.sum(1)?)?
            }
            Pooling::Cls => hidden.narrow(1, 0, 1)?.squeeze(1)?,
            Pooling::Max | Pooling::MeanSqrtLen | Pooling::WeightedMean | Pooling::LastToken => {
                let states = hidden.to_device(&Device::Cpu)?.to_vec3::<f32>()?;
                return Ok(states
                    .iter()
                    .zip(batch)
                    .map(|(rows, seq)| {
                        let own: Vec<f32> = rows[..seq.len()].iter().flatten().copied().collect();
                        self.pooling.pool(&own, self.hidden)
                    })
                    .collect());
            }
        };
        pooled.to_device(&Device::Cpu)?.to_vec2::<f32>()
    }
}

/// `dir/config.json`, parsed, and its text.
fn read_config(dir: &Path) -> Result<(BertConfig, String), LoadError> {
    let path = dir.join("config.json");
    let text = std::fs::read_to_string(&path).map_err(|source| LoadError::Read {
        path: path.clone(),
        source,
    })?;
    let config =
        serde_json::from_str(&text).map_err(|source| LoadError::Config { path, source })?;
    Ok((config, text))
}

impl EmbeddingModel for SentenceEncoder {
    /// `"sluice-avx512"` / `"sluice-avx2"` (`packed.rs` on that level's
    /// kernels), `"sluice-avx512-bf16"` / `"sluice-amx-bf16"` (its bf16
    /// layers on `vdpbf16ps` or AMX tiles), `"sluice-portable"` (`packed.rs` on
    /// the kernels' plain-Rust references) or `"candle"`
    /// (candle-transformers).
    fn forward_name(&self) -> &'static str {
        use encoder_kernels::{Bf16Kernels, F32Kernels};
        match self.forward {
            Forward::Packed(ref e) => match (e.bf16_kernels(), F32Kernels::current()) {
                (Some(Bf16Kernels::Amx(_)), _) => "sluice-amx-bf16",
                (Some(Bf16Kernels::Avx512(_)), _) => "sluice-avx512-bf16",
                (None, F32Kernels::Avx512(_)) => "sluice-avx512",
                (None, F32Kernels::Avx2(_)) => "sluice-avx2",
                (None, F32Kernels::Reference) => "sluice-portable",
            },
            Forward::Candle(_) | Forward::CandleRoberta(_) => "candle",
        }
    }

    fn dim(&self) -> usize {
        self.hidden
    }

    fn max_tokens_per_item(&self) -> usize {
        self.max_tokens_per_item
    }

    fn batch_cost_bytes(&self, items: usize, len: usize) -> u64 {
        if let Forward::Packed(encoder) = &self.forward {
            return encoder.batch_cost_bytes(items * len, len);
        }
        // Live f32 tensors at the peak of one layer, counted generously: the
        // hidden state and its residual, Q/K/V and their head-major copies, the
        // attention output, the intermediate and its activation (per token);
        // scores, scaled, masked and softmaxed attention (per token pair, per
        // head). Checked against measured peaks in the model tests.
        let tokens = (items * len) as u64;
        let per_token = (12 * self.hidden + 3 * self.intermediate) as u64;
        let per_pair = (4 * self.heads) as u64;
        4 * (tokens * per_token + tokens * len as u64 * per_pair)
    }

    fn embed_typed(
        &self,
        batch: &[&[u32]],
        types: Option<&[&[u32]]>,
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        if let Some(long) = batch.iter().find(|s| s.len() > self.max_tokens_per_item) {
            return Err(ModelError::Failed(format!(
                "bug: a sequence of {} tokens reached the model (limit {})",
                long.len(),
                self.max_tokens_per_item
            )));
        }
        // Checked here for both forwards: candle's embedding lookup would
        // fail with an index error that names neither the id nor the limit.
        if let Some(id) = batch
            .iter()
            .flat_map(|s| s.iter())
            .find(|id| **id as usize >= self.vocab_size)
        {
            return Err(ModelError::Failed(format!(
                "token id {id} is outside the vocabulary ({})",
                self.vocab_size
            )));
        }
        if let Some(types) = types
            && (types.len() != batch.len()
                || batch.iter().zip(types).any(|(s, t)| s.len() != t.len()))
        {
            return Err(ModelError::Failed(
                "bug: token types that do not match their sequences".into(),
            ));
        }
        match &self.forward {
            Forward::Packed(encoder) => Ok(encoder.embed_typed(batch, types, self.pooling)?),
            Forward::Candle(_) | Forward::CandleRoberta(_) => {
                Ok(self.candle_forward(batch, types)?)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use std::error::Error;

    use super::*;

    /// A load failure names the file and keeps the I/O error as its source,
    /// so a caller can tell a missing file from a bad one.
    #[test]
    fn a_missing_model_names_the_file_and_keeps_the_cause() {
        let dir = std::env::temp_dir().join("sluice-no-such-model");
        let err = match SentenceEncoder::load(&dir, Device::Cpu, Some(128), Default::default()) {
            Err(e) => e,
            Ok(_) => panic!("loaded a model from {}", dir.display()),
        };
        assert!(
            err.to_string().starts_with(&format!(
                "cannot read {}",
                dir.join("config.json").display()
            )),
            "{err}"
        );
        let io = err
            .source()
            .and_then(|s| s.downcast_ref::<std::io::Error>())
            .expect("the I/O error as the source");
        assert_eq!(io.kind(), std::io::ErrorKind::NotFound);
    }

    #[test]
    fn a_config_that_is_not_bert_says_so() {
        let dir = std::env::temp_dir().join(format!("sluice-bad-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("config.json"), "{\"hidden_size\": \"wide\"}").unwrap();
        let err = match SentenceEncoder::load(&dir, Device::Cpu, Some(128), Default::default()) {
            Err(e) => e,
            Ok(_) => panic!("loaded a model from a bad config"),
        };
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(matches!(err, LoadError::Config { .. }), "{err:?}");
        assert!(err.to_string().contains("is not a BERT config"), "{err}");
        assert!(err.source().is_some());
    }
}
