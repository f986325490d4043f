//! The encoders: token ids in, one vector per item out (a cross-encoder's
//! "vector" is its pair's score, a classifier's its text's logits), behind
//! one trait ([`EmbeddingModel`]).
//!
//! - `files.rs` reads a sentence-transformers directory (pooling,
//!   `Normalize`, prompts, limits) and `pooling.rs` applies its pooling.
//! - `sentence_encoder.rs` is [`SentenceEncoder`], a BERT or XLM-RoBERTa
//!   sentence encoder on one of two forwards: `packed.rs`, sluice's own
//!   packed-token BERT on the kernels crate (x86-64 CPUs with AVX2 + FMA),
//!   or candle-transformers' (CUDA, other CPUs, and the reference).
//! - `cross_encoder.rs` scores (query, document) pairs and `classifier.rs`
//!   gives a text's label scores, over the same forwards, with the head
//!   and `config.json` fields of `sequence_classification.rs`.
//! - `weights.rs` is the packed forward's precision (`--embed-weights`).

pub mod classifier;
pub mod cross_encoder;
pub mod files;
mod model;
mod packed;
pub mod pooling;
mod sentence_encoder;
mod sequence_classification;
mod weights;

pub use model::{EmbeddingModel, worst_batch_shape};
pub use sentence_encoder::{DEFAULT_MAX_TOKENS, ForwardChoice, SentenceEncoder};
pub use weights::EmbedWeights;
