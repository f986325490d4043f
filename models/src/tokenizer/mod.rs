//! The tokenizers: `text.rs` wraps a `tokenizer.json` (the encoders'),
//! cut at the model's limit, with BERT's and RoBERTa's pair templates;
//! `gguf/` builds a decoder's tokenizer from its GGUF's own vocabulary
//! (BPE and SentencePiece, special tokens, chat templates).

pub mod gguf;
mod text;

pub use text::{TextTokenizer, TokenizeError, TokenizedItem, TokenizedPair};
