//! Text to token ids with the model's `tokenizer.json`, truncating the way
//! sentence-transformers does (at the model's limit, keeping `[CLS]`/`[SEP]`)
//! and padding nothing: our packed CPU forward never pads, and candle's BERT
//! (CUDA, CPUs without the SIMD kernels) pads each batch to its own longest
//! item.

use std::path::Path;

use tokenizers::{
    EncodeInput, Encoding, Tokenizer, TruncationDirection, TruncationParams, TruncationStrategy,
};

use crate::error::LoadError;

/// One item's token ids.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenizedItem {
    pub ids: Vec<u32>,
    /// The item was longer than the model's limit and was cut.
    pub truncated: bool,
}

/// A (query, document) pair's token ids, in the tokenizer's pair template,
/// and each token's type (0 for the first text, 1 for the second in BERT's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenizedPair {
    pub ids: Vec<u32>,
    pub type_ids: Vec<u32>,
    /// The pair was longer than the model's limit and was cut (the longer
    /// text first, as transformers' `longest_first`).
    pub truncated: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum TokenizeError {
    #[error("item {index} has more than {limit} tokens and the job set truncate=false")]
    TooLong { index: usize, limit: usize },
    #[error("tokenizer failed: {0}")]
    Failed(String),
}

pub struct TextTokenizer {
    inner: Tokenizer,
    max_tokens: usize,
}

impl TextTokenizer {
    pub fn load(path: &Path, max_tokens: usize) -> Result<TextTokenizer, LoadError> {
        let failed = |source| LoadError::Tokenizer {
            path: path.to_path_buf(),
            source,
        };
        let mut inner = Tokenizer::from_file(path).map_err(failed)?;
        // tokenizer.json ships truncation at 128 and fixed padding to 128;
        // sentence-transformers truncates at 256 and pads to the batch's longest.
        inner
            .with_truncation(Some(TruncationParams {
                max_length: max_tokens,
                strategy: TruncationStrategy::LongestFirst,
                stride: 0,
                direction: TruncationDirection::Right,
            }))
            .map_err(failed)?;
        inner.with_padding(None);
        Ok(TextTokenizer { inner, max_tokens })
    }

    /// Tokenizes `texts`. Blocking and CPU-heavy: call it off the async runtime.
    pub fn encode(
        &self,
        texts: Vec<String>,
        truncate: bool,
    ) -> Result<Vec<TokenizedItem>, TokenizeError> {
        self.encode_each(texts, truncate, |enc, truncated| TokenizedItem {
            ids: enc.get_ids().to_vec(),
            truncated,
        })
    }

    /// Tokenizes (query, document) pairs in the pair template. Blocking and
    /// CPU-heavy: call it off the async runtime.
    pub fn encode_pairs(
        &self,
        pairs: Vec<(String, String)>,
        truncate: bool,
    ) -> Result<Vec<TokenizedPair>, TokenizeError> {
        // An empty document is still a second text (`[CLS] query [SEP]
        // [SEP]`), as sentence-transformers' batched call tokenizes it.
        let inputs: Vec<EncodeInput> = pairs
            .into_iter()
            .map(|(a, b)| EncodeInput::Dual(a.into(), b.into()))
            .collect();
        self.encode_each(inputs, truncate, |enc, truncated| TokenizedPair {
            ids: enc.get_ids().to_vec(),
            type_ids: enc.get_type_ids().to_vec(),
            truncated,
        })
    }

    /// Encodes `inputs`, refusing a truncated one unless `truncate`, and
    /// makes each result from its encoding and whether it was cut.
    fn encode_each<'s, I: Into<EncodeInput<'s>> + Send, T>(
        &self,
        inputs: Vec<I>,
        truncate: bool,
        make: impl Fn(Encoding, bool) -> T,
    ) -> Result<Vec<T>, TokenizeError> {
        let encodings = self
            .inner
            .encode_batch(inputs, true)
            .map_err(|e| TokenizeError::Failed(e.to_string()))?;
        encodings
            .into_iter()
            .enumerate()
            .map(|(index, enc)| {
                let truncated = !enc.get_overflowing().is_empty();
                if truncated && !truncate {
                    return Err(TokenizeError::TooLong {
                        index,
                        limit: self.max_tokens,
                    });
                }
                Ok(make(enc, truncated))
            })
            .collect()
    }
}
