//! sluice's networks, with no knowledge of jobs, queues or storage (this
//! crate depends on `sluice-kernels` alone among sluice's crates): the
//! embedding encoders behind one trait ([`EmbeddingModel`]), the llama step
//! ([`llama`]), the tokenizers ([`TextTokenizer`] for `tokenizer.json`,
//! [`gguf_tokenizer`] for a GGUF's own vocabulary) and the continuous-batching
//! generator ([`generation`]). The consumer, the offline `embed` command, the
//! benchmarks and this crate's tests drive them the same way. A model reports
//! its limits and what a batch costs in memory, which is what the budget and
//! the batcher plan with.

mod bert;
pub mod cross_encoder;
pub mod decoder;
pub mod generation;
pub mod gguf_tokenizer;
mod minilm;
pub mod pooling;
pub mod sentence_transformers;
pub mod structured;
mod tokenizer;

/// The CPU kernels (the `sluice-kernels` crate), under the names the models
/// use.
pub use sluice_kernels::{cpu, encoder as encoder_kernels, quantized as qmatmul};

pub use bert::EncoderInputError;

/// The precision of the packed BERT forward's linear layers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum EmbedWeights {
    /// bf16 where [`sluice_kernels::encoder::bf16_by_rule`] says the CPU
    /// runs it faster (AMX tiles; AVX512_BF16 on an AMD core), f32
    /// elsewhere: a rule, so every start on one CPU answers alike.
    #[default]
    Auto,
    /// f32 weights and sums.
    F32,
    /// bf16 weights and activations, f32 sums (`vdpbf16ps`), where the CPU
    /// has AVX512_BF16; f32 elsewhere.
    Bf16,
}

impl std::str::FromStr for EmbedWeights {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(EmbedWeights::Auto),
            "f32" => Ok(EmbedWeights::F32),
            "bf16" => Ok(EmbedWeights::Bf16),
            other => Err(format!("unknown embed weights {other:?} (auto, f32, bf16)")),
        }
    }
}

impl EmbedWeights {
    /// `Auto` decided by [`sluice_kernels::encoder::bf16_by_rule`] (what
    /// the CPU is, never a timing: the same vectors at every start on one
    /// CPU; logged once per process); the others as they are.
    pub fn resolve(self) -> EmbedWeights {
        if self != EmbedWeights::Auto {
            return self;
        }
        static LOGGED: std::sync::Once = std::sync::Once::new();
        let (weights, why) = match sluice_kernels::encoder::bf16_by_rule() {
            Some((true, why)) => (EmbedWeights::Bf16, why),
            Some((false, why)) => (EmbedWeights::F32, why),
            None => (EmbedWeights::F32, "this process runs no bf16 layers"),
        };
        LOGGED.call_once(|| {
            tracing::info!(
                weights = weights.name(),
                why,
                "--embed-weights auto (a rule on the CPU, the same at every start)"
            );
        });
        weights
    }

    pub fn name(self) -> &'static str {
        match self {
            EmbedWeights::Auto => "auto",
            EmbedWeights::F32 => "f32",
            EmbedWeights::Bf16 => "bf16",
        }
    }
}
pub use minilm::{DEFAULT_MAX_TOKENS, ForwardChoice, MiniLm};
pub use tokenizer::{TextTokenizer, TokenizeError, TokenizedItem, TokenizedPair};

/// An embedding model: token ids in, one pooled vector per item out (pooled
/// as the model's sentence-transformers files say). A cross-encoder is one
/// too ([`cross_encoder::CrossEncoder`]): its items are (query, document)
/// pairs with their token types, its vector the pair's one score, so the
/// rerank task is batched, budgeted and run exactly as embeddings are.
pub trait EmbeddingModel: Send {
    /// Which forward runs (for logs and reports), e.g. `"sluice-avx512"`.
    fn forward_name(&self) -> &'static str;
    /// Length of the vectors.
    fn dim(&self) -> usize;
    /// Tokens per item the model accepts.
    fn max_tokens_per_item(&self) -> usize;
    /// Peak bytes a forward pass over `items` sequences padded to `len`
    /// tokens needs beyond the weights: activations, and attention, which grows
    /// with `len^2`.
    fn batch_cost_bytes(&self, items: usize, len: usize) -> u64;
    /// Pooled, unnormalized vectors, one per sequence, in order, every
    /// token of type 0.
    fn embed(&self, batch: &[&[u32]]) -> Result<Vec<Vec<f32>>, ModelError> {
        self.embed_typed(batch, None)
    }
    /// [`EmbeddingModel::embed`] with each token's type (`types[i]` as long
    /// as `batch[i]`; a pair's second text is type 1 in BERT's template;
    /// `None`: all type 0). A model that reads no token types ignores them.
    fn embed_typed(
        &self,
        batch: &[&[u32]],
        types: Option<&[&[u32]]>,
    ) -> Result<Vec<Vec<f32>>, ModelError>;
}

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// The device ran out of memory: retry later with a smaller budget.
    #[error("device out of memory: {0}")]
    OutOfMemory(String),
    #[error("model failed: {0}")]
    Failed(String),
    /// A batch the forward refuses (a bug upstream: inputs are checked first).
    #[error("model failed: {0}")]
    Input(#[from] EncoderInputError),
}

/// A model or tokenizer that cannot be loaded from its files, naming the
/// file and keeping the cause.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("{} is not a BERT config: {source}", path.display())]
    Config {
        path: std::path::PathBuf,
        source: serde_json::Error,
    },
    #[error("cannot load {}: {source}", path.display())]
    Weights {
        path: std::path::PathBuf,
        source: candle_core::Error,
    },
    #[error("cannot build BERT from {}: {source}", path.display())]
    Build {
        path: std::path::PathBuf,
        source: candle_core::Error,
    },
    #[error("cannot load tokenizer {}: {source}", path.display())]
    Tokenizer {
        path: std::path::PathBuf,
        source: tokenizers::Error,
    },
    /// A setting the model files cannot honour.
    #[error("{0}")]
    Unsupported(String),
}

impl From<candle_core::Error> for ModelError {
    fn from(e: candle_core::Error) -> Self {
        let text = e.to_string();
        if text.to_lowercase().contains("out of memory") {
            ModelError::OutOfMemory(text)
        } else {
            ModelError::Failed(text)
        }
    }
}

/// The batch shape with the highest cost that `max_batch_tokens` allows: items
/// at the longest length, since attention grows with the square of the length.
pub fn worst_batch_shape(max_batch_tokens: usize, max_tokens_per_item: usize) -> (usize, usize) {
    let len = max_tokens_per_item.min(max_batch_tokens).max(1);
    ((max_batch_tokens / len).max(1), len)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `auto` becomes bf16 exactly where the rule says so; an explicit
    /// choice stays as asked.
    #[test]
    fn auto_weights_follow_the_rule() {
        let expected = match sluice_kernels::encoder::bf16_by_rule() {
            Some((true, _)) => EmbedWeights::Bf16,
            _ => EmbedWeights::F32,
        };
        assert_eq!(EmbedWeights::Auto.resolve(), expected);
        assert_eq!(EmbedWeights::F32.resolve(), EmbedWeights::F32);
        assert_eq!(EmbedWeights::Bf16.resolve(), EmbedWeights::Bf16);
    }
}
