//! Whisper (encoder-decoder speech recognition) from a transformers
//! directory: `config` (its shape and generation settings, refusing what
//! is not run), `directory` (all of it loaded for a transcription), `model`
//! (the network, f32: `packed` on sluice's CPU kernels, or candle's),
//! `generate` (greedy decoding of a window with the forced prompt),
//! `timestamps` (the rules a window decoded with timestamps follows),
//! `transcribe` (a recording to timed segments window after window, a
//! window's decoding a step at a time) and `transcriptions` (several
//! recordings at once, their windows sharing the decoder's steps). The
//! features come from [`crate::audio`]. Held to transformers' `generate`
//! on random-weight models by `models/tests/whisper.rs`.

pub mod config;
pub mod directory;
pub mod generate;
pub mod model;
mod packed;
pub mod timestamps;
pub mod transcribe;
pub mod transcriptions;

pub use config::{GenerationSettings, WhisperConfig};
pub use directory::Whisper;
pub use generate::{WhisperTask, greedy, prompt};
pub use model::{AudioStates, DecoderState, WhisperModel};
