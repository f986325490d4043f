//! Text to token ids with the model's `tokenizer.json`, truncating the way
//! sentence-transformers does (at the model's limit, keeping `[CLS]`/`[SEP]`)
//! and padding nothing: our packed CPU forward never pads, and candle's BERT
//! (CUDA, CPUs without the SIMD kernels) pads each batch to its own longest
//! item.

use std::path::Path;

use tokenizers::{Tokenizer, TruncationDirection, TruncationParams, TruncationStrategy};

use super::LoadError;

/// One item's token ids.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenizedItem {
    pub ids: Vec<u32>,
    /// The item was longer than the model's limit and was cut.
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
        let encodings = self
            .inner
            .encode_batch(texts, true)
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
                Ok(TokenizedItem {
                    ids: enc.get_ids().to_vec(),
                    truncated,
                })
            })
            .collect()
    }
}
