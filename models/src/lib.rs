//! sluice's networks, with no knowledge of jobs, queues or storage (this
//! crate depends on `sluice-kernels` alone among sluice's crates), laid out
//! by role: [`encoder`] (the embedding and cross-encoders behind one trait,
//! [`EmbeddingModel`]), [`decoder`] (our decoder-only transformer over a
//! GGUF, the continuous-batching generator and the structured-output
//! constraint), [`tokenizer`] (a `tokenizer.json`'s, a GGUF's own) and
//! [`audio`] (a recording decoded to 16 kHz mono, Whisper's log-mel
//! features) and [`whisper`] (the speech model and its greedy decoding).
//! The
//! consumer, the offline commands, the benchmarks and this crate's tests
//! drive them the same way. A model reports its limits and what a batch
//! costs in memory, which is what the budget and the batcher plan with.

pub mod audio;
pub mod decoder;
pub mod encoder;
mod error;
pub mod image;
mod packed_layers;
pub mod tokenizer;
pub mod whisper;

/// The CPU kernels (the `sluice-kernels` crate), under the names the models
/// use.
pub use sluice_kernels::{cpu, encoder as encoder_kernels, quantized as qmatmul};

pub use encoder::{
    DEFAULT_MAX_TOKENS, EmbedWeights, EmbeddingModel, ForwardChoice, SentenceEncoder,
    worst_batch_shape,
};
pub use error::{EncoderInputError, LoadError, ModelError};
pub use tokenizer::{TextTokenizer, TokenizeError, TokenizedItem, TokenizedPair};
