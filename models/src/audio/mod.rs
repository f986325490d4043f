//! Audio for the speech models: what turns a recording into a model's
//! input. `decode`: a file's bytes (WAV, FLAC, MP3, Ogg Vorbis, AAC) to
//! 16 kHz mono samples, or an error naming what it saw; `resample`: any
//! rate to 16 kHz, streaming; `features`: Whisper's log-mel spectrogram.

pub mod decode;
pub mod features;
pub mod resample;
pub mod wav;

pub use decode::{Audio, AudioError, decode_bytes, decode_file};
pub use features::{FeatureExtractor, LogMel};
pub use resample::Resampler;
