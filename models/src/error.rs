//! What loading or running a model can fail with.

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

/// A batch the packed BERT forward (`encoder/packed.rs`) cannot run: a bug upstream, since
/// the tokenizer and `SentenceEncoder::embed` check both limits first.
#[derive(Debug, thiserror::Error)]
pub enum EncoderInputError {
    #[error("a sequence of {tokens} tokens (the model has {positions} positions)")]
    TooLong { tokens: usize, positions: usize },
    #[error("token id {id} is outside the vocabulary ({vocab})")]
    OutOfVocabulary { id: u32, vocab: usize },
    #[error("token type {id} is outside the model's {types} token types")]
    BadTokenType { id: u32, types: usize },
}
