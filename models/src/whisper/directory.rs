//! A Whisper directory loaded whole, as a transcription needs it: the
//! network, its generation settings (refused without timestamp tokens),
//! its feature extractor (the mel bins `config.json` names) and its
//! `tokenizer.json`, which turns a segment's tokens into text.

use std::path::Path;

use super::config::{GenerationSettings, WhisperConfig};
use super::model::WhisperModel;
use super::timestamps::TimestampRules;
use super::transcribe::rules;
use crate::audio::features::FeatureExtractor;
use crate::error::LoadError;

/// Everything a transcription reads of a Whisper directory.
pub struct Whisper {
    pub model: WhisperModel,
    pub settings: GenerationSettings,
    pub extractor: FeatureExtractor,
    pub rules: TimestampRules,
    tokenizer: tokenizers::Tokenizer,
}

impl Whisper {
    /// Loads `dir` (`config.json`, `generation_config.json`,
    /// `model.safetensors`, `tokenizer.json`); what is missing or not run is
    /// refused naming the file.
    pub fn load(dir: &Path) -> Result<Whisper, LoadError> {
        let config = WhisperConfig::load(dir)?;
        let settings = GenerationSettings::load(dir)?;
        let rules = rules(&settings).ok_or_else(|| {
            LoadError::Unsupported(format!(
                "{}: no no_timestamps_token_id: sluice transcribes with timestamps, and needs the model's timestamp tokens",
                dir.join("generation_config.json").display()
            ))
        })?;
        if rules.timestamp_begin as usize >= config.vocab_size {
            return Err(LoadError::Unsupported(format!(
                "{}: no_timestamps_token_id {} leaves no timestamp tokens in a vocabulary of {}",
                dir.join("generation_config.json").display(),
                rules.no_timestamps,
                config.vocab_size
            )));
        }
        let tokenizer_path = dir.join("tokenizer.json");
        let tokenizer = tokenizers::Tokenizer::from_file(&tokenizer_path).map_err(|e| {
            LoadError::Unsupported(format!(
                "{}: not a tokenizer sluice can read: {e}",
                tokenizer_path.display()
            ))
        })?;
        let extractor = FeatureExtractor::new(config.num_mel_bins);
        let model = WhisperModel::load(dir, config)?;
        Ok(Whisper {
            model,
            settings,
            extractor,
            rules,
            tokenizer,
        })
    }

    /// The text of `tokens`, their timestamps and special tokens left out.
    pub fn text(&self, tokens: &[u32]) -> String {
        let text: Vec<u32> = tokens
            .iter()
            .copied()
            .filter(|&t| t < self.rules.eos)
            .collect();
        // Ids below the end of text are the tokenizer's own words.
        self.tokenizer.decode(&text, true).unwrap_or_default()
    }

    pub fn is_multilingual(&self) -> bool {
        self.settings.is_multilingual
    }

    /// Whether the model knows `language` (a code such as `fr`).
    pub fn knows_language(&self, language: &str) -> bool {
        self.settings
            .lang_to_id
            .contains_key(&format!("<|{language}|>"))
    }
}
