//! Audio for the speech models: what turns 16 kHz mono samples into a
//! model's input. `features`: Whisper's log-mel spectrogram.

pub mod features;

pub use features::{FeatureExtractor, LogMel};
