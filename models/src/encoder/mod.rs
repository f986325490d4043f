//! The encoders: token ids in, one vector per item out (a cross-encoder's
//! "vector" is its pair's score), behind one trait ([`EmbeddingModel`]).
//!
//! - `files.rs` reads a sentence-transformers directory (pooling,
//!   `Normalize`, prompts, limits) and `pooling.rs` applies its pooling.
//! - `sentence_encoder.rs` is [`SentenceEncoder`], a BERT or XLM-RoBERTa
//!   sentence encoder on one of two forwards: `packed.rs`, sluice's own
//!   packed-token BERT on the kernels crate (x86-64 CPUs with AVX2 + FMA),
//!   or candle-transformers' (CUDA, other CPUs, and the reference).
//! - `cross_encoder.rs` scores (query, document) pairs over the same
//!   forwards.
//! - `weights.rs` is the packed forward's precision (`--embed-weights`).

pub mod cross_encoder;
pub mod files;
mod model;
mod packed;
pub mod pooling;
mod sentence_encoder;
mod weights;

pub use model::{EmbeddingModel, worst_batch_shape};
pub use sentence_encoder::{DEFAULT_MAX_TOKENS, ForwardChoice, SentenceEncoder};
pub use weights::EmbedWeights;
