//! Whisper (encoder-decoder speech recognition) from a transformers
//! directory: `config` (its shape and generation settings, refusing what
//! is not run), `directory` (all of it loaded for a transcription), `model` (the network, f32 on candle), `generate` (greedy
//! decoding of a window with the forced prompt), `timestamps` (the rules a
//! window decoded with timestamps follows) and `transcribe` (a recording of
//! any length to timed segments, window after window). The features come from
//! [`crate::audio`]. Held to transformers' `generate` on random-weight
//! models by `models/tests/whisper.rs`.

pub mod config;
pub mod directory;
pub mod generate;
pub mod model;
pub mod timestamps;
pub mod transcribe;

pub use config::{GenerationSettings, WhisperConfig};
pub use directory::Whisper;
pub use generate::{WhisperTask, greedy, prompt};
pub use model::WhisperModel;
