//! A Whisper directory's settings: `config.json` (the network's shape) and
//! `generation_config.json` (the special tokens generation forces and
//! suppresses), as transformers saves them. What this implementation does
//! not run is refused by name.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

use crate::error::LoadError;

/// The network's shape (`config.json`).
#[derive(Debug, Clone, Deserialize)]
pub struct WhisperConfig {
    pub num_mel_bins: usize,
    pub d_model: usize,
    pub encoder_layers: usize,
    pub encoder_attention_heads: usize,
    pub encoder_ffn_dim: usize,
    pub decoder_layers: usize,
    pub decoder_attention_heads: usize,
    pub decoder_ffn_dim: usize,
    pub vocab_size: usize,
    pub max_source_positions: usize,
    pub max_target_positions: usize,
    #[serde(default = "gelu")]
    pub activation_function: String,
    #[serde(default)]
    pub scale_embedding: bool,
    #[serde(default)]
    pub model_type: String,
}

fn gelu() -> String {
    "gelu".into()
}

/// What generation forces and suppresses (`generation_config.json`).
#[derive(Debug, Clone, Deserialize)]
pub struct GenerationSettings {
    pub decoder_start_token_id: u32,
    /// The end of a transcript (`<|endoftext|>`).
    pub eos_token_id: u32,
    pub no_timestamps_token_id: Option<u32>,
    #[serde(default)]
    pub suppress_tokens: Vec<u32>,
    #[serde(default)]
    pub begin_suppress_tokens: Vec<u32>,
    /// `<|en|>` to its id, for a multilingual model.
    #[serde(default)]
    pub lang_to_id: BTreeMap<String, u32>,
    /// `transcribe` and `translate` to their ids.
    #[serde(default)]
    pub task_to_id: BTreeMap<String, u32>,
    #[serde(default)]
    pub is_multilingual: bool,
    /// How far into a window its first timestamp may be, in 0.02 s steps
    /// (50 = 1 s, openai-whisper's `max_initial_timestamp`); none: anywhere.
    #[serde(default)]
    pub max_initial_timestamp_index: Option<u32>,
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, LoadError> {
    let text = std::fs::read_to_string(path).map_err(|source| LoadError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|e| {
        LoadError::Unsupported(format!("{} is not a Whisper file: {e}", path.display()))
    })
}

impl WhisperConfig {
    pub fn load(dir: &Path) -> Result<WhisperConfig, LoadError> {
        let path = dir.join("config.json");
        let config: WhisperConfig = read_json(&path)?;
        let refuse = |what: String| {
            Err(LoadError::Unsupported(format!(
                "{}: {what}",
                path.display()
            )))
        };
        if !config.model_type.is_empty() && config.model_type != "whisper" {
            return refuse(format!("model_type {:?} is not whisper", config.model_type));
        }
        if config.activation_function != "gelu" {
            return refuse(format!(
                "activation_function {:?}: only \"gelu\" (exact) is supported",
                config.activation_function
            ));
        }
        if config.scale_embedding {
            return refuse("scale_embedding true is not supported".into());
        }
        for (name, width, heads) in [
            ("encoder", config.d_model, config.encoder_attention_heads),
            ("decoder", config.d_model, config.decoder_attention_heads),
        ] {
            if heads == 0 || width % heads != 0 {
                return refuse(format!(
                    "d_model {width} does not split into {heads} {name} attention heads"
                ));
            }
        }
        Ok(config)
    }
}

impl GenerationSettings {
    pub fn load(dir: &Path) -> Result<GenerationSettings, LoadError> {
        read_json(&dir.join("generation_config.json"))
    }
}
