//! A decoder's shape and constants, read from its GGUF's metadata
//! (`general.architecture` and the `<arch>.*` keys llama.cpp's converter
//! writes), none assumed from one model. Pure: a metadata map in, a config
//! or an error naming the key out, table-tested below. What a family does
//! differently is a field here (rotary layout, biases, norms, activation,
//! soft caps, sliding windows), so the two steps read one description.

use std::collections::HashMap;

use candle_core::quantized::gguf_file::Value;

/// The decoder families sluice runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Architecture {
    /// `llama`: Llama 2 / 3.x, SmolLM, TinyLlama, Mistral's llama-style GGUFs.
    Llama,
    /// `qwen2`: biases on Q, K and V; rotary halves.
    Qwen2,
    /// `qwen3`: an RMS norm on each head of Q and K; rotary halves.
    Qwen3,
    /// `gemma2`: scaled embeddings, GELU, norms after attention and the MLP,
    /// soft-capped attention and logits, a sliding window on every other
    /// layer.
    Gemma2,
    /// `gemma3`: Gemma 2's block with Q/K norms instead of the soft caps,
    /// five sliding-window layers to each global one, their own RoPE base.
    Gemma3,
}

impl Architecture {
    pub const SUPPORTED: &'static str = "llama, qwen2, qwen3, gemma2, gemma3";

    pub fn from_name(name: &str) -> Option<Architecture> {
        Some(match name {
            "llama" => Architecture::Llama,
            "qwen2" => Architecture::Qwen2,
            "qwen3" => Architecture::Qwen3,
            "gemma2" => Architecture::Gemma2,
            "gemma3" => Architecture::Gemma3,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Architecture::Llama => "llama",
            Architecture::Qwen2 => "qwen2",
            Architecture::Qwen3 => "qwen3",
            Architecture::Gemma2 => "gemma2",
            Architecture::Gemma3 => "gemma3",
        }
    }

    fn is_gemma(self) -> bool {
        matches!(self, Architecture::Gemma2 | Architecture::Gemma3)
    }
}

/// Which values of a head the rotary embedding turns together.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeLayout {
    /// Pairs `(2i, 2i + 1)`: llama.cpp's "normal" RoPE, for the families
    /// whose Q and K the converter permuted (llama).
    Interleaved,
    /// Pairs `(i, i + head_dim / 2)`: GPT-NeoX's, for Qwen and Gemma.
    Halves,
}

/// The MLP's gate activation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    /// SwiGLU: `silu(gate) * up`.
    Silu,
    /// GeGLU with tanh's GELU approximation (Gemma).
    GeluTanh,
}

/// A rotary embedding: `angle(p, i) = p * scale * base^(-2i / dims) /
/// factor[i]`.
#[derive(Clone, Debug, PartialEq)]
pub struct Rope {
    pub base: f32,
    /// Positions multiplied by this (`1 / rope.scaling.factor` for linear
    /// scaling; 1 without).
    pub scale: f32,
}

#[derive(Clone, Debug, PartialEq)]
pub struct DecoderConfig {
    pub architecture: Architecture,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub hidden: usize,
    pub ffn: usize,
    pub vocab: usize,
    pub context_length: usize,
    pub rms_eps: f64,
    pub rope_layout: RopeLayout,
    /// The rotary embedding of global-attention layers.
    pub rope: Rope,
    /// The rotary embedding of sliding-window layers (Gemma 3 has its own
    /// base there; else the global one).
    pub rope_local: Rope,
    /// Multiplies `q . k` (before any soft cap).
    pub attention_scale: f32,
    /// `cap * tanh(score / cap)` on attention scores (Gemma 2).
    pub attention_softcap: Option<f32>,
    /// The same on the final logits (Gemma 2).
    pub final_softcap: Option<f32>,
    /// The window a sliding-window layer attends over: a query at position
    /// `p` sees keys at `p - window + 1 ..= p`.
    pub sliding_window: Option<usize>,
    /// Which layers attend over the window (the rest see every position).
    pub sliding_layers: Vec<bool>,
    /// The embeddings are multiplied by `sqrt(hidden)` (Gemma).
    pub embedding_scale: Option<f32>,
    pub activation: Activation,
}

/// A GGUF whose shape sluice cannot run, or that is malformed, named by key.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ConfigError {
    #[error("GGUF metadata has no {0}")]
    Missing(String),
    #[error("GGUF metadata {key} = {value} is not supported: {why}")]
    Unsupported {
        key: String,
        value: String,
        why: String,
    },
}

/// What the config reads: a GGUF's metadata.
pub struct Metadata<'a> {
    pub values: &'a HashMap<String, Value>,
}

impl Metadata<'_> {
    fn get(&self, key: &str) -> Option<&Value> {
        self.values.get(key)
    }

    fn require(&self, key: &str) -> Result<&Value, ConfigError> {
        self.get(key)
            .ok_or_else(|| ConfigError::Missing(key.to_string()))
    }

    /// Any unsigned or non-negative integer as usize.
    fn uint(&self, key: &str) -> Result<Option<usize>, ConfigError> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        let n = match v {
            Value::U8(x) => Some(*x as i128),
            Value::I8(x) => Some(*x as i128),
            Value::U16(x) => Some(*x as i128),
            Value::I16(x) => Some(*x as i128),
            Value::U32(x) => Some(*x as i128),
            Value::I32(x) => Some(*x as i128),
            Value::U64(x) => Some(*x as i128),
            Value::I64(x) => Some(*x as i128),
            _ => None,
        };
        match n.and_then(|n| usize::try_from(n).ok()) {
            Some(n) => Ok(Some(n)),
            None => Err(ConfigError::Unsupported {
                key: key.to_string(),
                value: format!("{v:?}"),
                why: "a non-negative integer is expected (a per-layer list is not supported)"
                    .into(),
            }),
        }
    }

    fn require_uint(&self, key: &str) -> Result<usize, ConfigError> {
        self.uint(key)?
            .ok_or_else(|| ConfigError::Missing(key.to_string()))
    }

    fn float(&self, key: &str) -> Result<Option<f64>, ConfigError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::F32(x)) => Ok(Some(f64::from(*x))),
            Some(Value::F64(x)) => Ok(Some(*x)),
            Some(v) => Err(ConfigError::Unsupported {
                key: key.to_string(),
                value: format!("{v:?}"),
                why: "a number is expected".into(),
            }),
        }
    }

    fn text(&self, key: &str) -> Option<&str> {
        match self.get(key) {
            Some(Value::String(s)) => Some(s.as_str()),
            _ => None,
        }
    }
}

impl DecoderConfig {
    /// The config of a GGUF's metadata.
    pub fn from_metadata(meta: &Metadata<'_>) -> Result<DecoderConfig, ConfigError> {
        let arch_name = match meta.require("general.architecture")? {
            Value::String(s) => s.clone(),
            v => format!("{v:?}"),
        };
        let architecture =
            Architecture::from_name(&arch_name).ok_or_else(|| ConfigError::Unsupported {
                key: "general.architecture".into(),
                value: format!("{arch_name:?}"),
                why: format!("sluice runs {}", Architecture::SUPPORTED),
            })?;
        let key = |k: &str| format!("{arch_name}.{k}");
        let hidden = meta.require_uint(&key("embedding_length"))?;
        let heads = meta.require_uint(&key("attention.head_count"))?;
        let kv_heads = meta.uint(&key("attention.head_count_kv"))?.unwrap_or(heads);
        if heads == 0 || kv_heads == 0 || !heads.is_multiple_of(kv_heads) {
            return Err(ConfigError::Unsupported {
                key: key("attention.head_count_kv"),
                value: kv_heads.to_string(),
                why: format!("the {heads} query heads must be a multiple of it"),
            });
        }
        let head_dim = meta
            .uint(&key("attention.key_length"))?
            .unwrap_or(hidden / heads);
        if let Some(v) = meta.uint(&key("attention.value_length"))?
            && v != head_dim
        {
            return Err(ConfigError::Unsupported {
                key: key("attention.value_length"),
                value: v.to_string(),
                why: format!("values must be as long as keys ({head_dim})"),
            });
        }
        if let Some(dims) = meta.uint(&key("rope.dimension_count"))?
            && dims != head_dim
        {
            return Err(ConfigError::Unsupported {
                key: key("rope.dimension_count"),
                value: dims.to_string(),
                why: format!("partial rotary embeddings; sluice rotates whole heads of {head_dim}"),
            });
        }
        if head_dim == 0 || !head_dim.is_multiple_of(2) {
            return Err(ConfigError::Unsupported {
                key: key("attention.key_length"),
                value: head_dim.to_string(),
                why: "a head must have an even, non-zero length".into(),
            });
        }
        let scaling = meta.text(&key("rope.scaling.type")).unwrap_or("none");
        let factor = match meta.float(&key("rope.scaling.factor"))? {
            Some(f) => Some(f),
            None => meta.float(&key("rope.scale_linear"))?,
        };
        let scale = match (scaling, factor) {
            ("none", _) | (_, None) => 1.0,
            ("linear", Some(f)) if f > 0.0 => (1.0 / f) as f32,
            (other, _) => {
                return Err(ConfigError::Unsupported {
                    key: key("rope.scaling.type"),
                    value: format!("{other:?}"),
                    why: "supported: none, linear (and Llama 3's frequency factors, rope_freqs)"
                        .into(),
                });
            }
        };
        let base = meta.float(&key("rope.freq_base"))?.unwrap_or(10_000.0) as f32;
        let rope = Rope { base, scale };
        let layers = meta.require_uint(&key("block_count"))?;
        let vocab = match meta.uint(&key("vocab_size"))? {
            Some(v) => v,
            None => match meta.require("tokenizer.ggml.tokens")? {
                Value::Array(tokens) => tokens.len(),
                _ => return Err(ConfigError::Missing(key("vocab_size"))),
            },
        };
        let rms_eps = meta
            .float(&key("attention.layer_norm_rms_epsilon"))?
            .ok_or_else(|| ConfigError::Missing(key("attention.layer_norm_rms_epsilon")))?;
        let softcap = |k: &str| -> Result<Option<f32>, ConfigError> {
            Ok(meta.float(&key(k))?.filter(|c| *c > 0.0).map(|c| c as f32))
        };
        // llama.cpp's rule for Gemma's query scale: 1/sqrt(hidden / heads)
        // for the 27B models (told apart by their depth), else
        // 1/sqrt(head_dim).
        let scale_dim = match (architecture, layers) {
            (Architecture::Gemma2, 46) | (Architecture::Gemma3, 62) => hidden / heads,
            _ => head_dim,
        };
        let mut config = DecoderConfig {
            architecture,
            layers,
            heads,
            kv_heads,
            head_dim,
            hidden,
            ffn: meta.require_uint(&key("feed_forward_length"))?,
            vocab,
            context_length: meta.require_uint(&key("context_length"))?,
            rms_eps,
            rope_layout: match architecture {
                Architecture::Llama => RopeLayout::Interleaved,
                _ => RopeLayout::Halves,
            },
            rope_local: rope.clone(),
            rope,
            attention_scale: 1.0 / (scale_dim as f32).sqrt(),
            attention_softcap: None,
            final_softcap: None,
            sliding_window: None,
            sliding_layers: vec![false; layers],
            embedding_scale: architecture.is_gemma().then(|| (hidden as f32).sqrt()),
            activation: if architecture.is_gemma() {
                Activation::GeluTanh
            } else {
                Activation::Silu
            },
        };
        match architecture {
            Architecture::Gemma2 => {
                // llama.cpp's defaults where the file does not say: 50 and
                // 30, Gemma 2's own.
                config.attention_softcap = match meta.float(&key("attn_logit_softcapping"))? {
                    Some(c) => Some(c as f32).filter(|c| *c > 0.0),
                    None => Some(50.0),
                };
                config.final_softcap = match meta.float(&key("final_logit_softcapping"))? {
                    Some(c) => Some(c as f32).filter(|c| *c > 0.0),
                    None => Some(30.0),
                };
                config.sliding_window =
                    Some(meta.uint(&key("attention.sliding_window"))?.unwrap_or(4096));
                config.sliding_layers = sliding_layers(meta, &key, layers, 2)?;
                if let Some(b) = meta.float(&key("rope.freq_base_swa"))? {
                    config.rope_local.base = b as f32;
                }
            }
            Architecture::Gemma3 => {
                config.final_softcap = softcap("final_logit_softcapping")?;
                if let Some(window) = meta
                    .uint(&key("attention.sliding_window"))?
                    .filter(|w| *w > 0)
                {
                    config.sliding_window = Some(window);
                    config.sliding_layers = sliding_layers(meta, &key, layers, 6)?;
                    config.rope_local = Rope {
                        base: meta.float(&key("rope.freq_base_swa"))?.unwrap_or(10_000.0) as f32,
                        scale: 1.0,
                    };
                }
            }
            _ => {
                if meta
                    .uint(&key("attention.sliding_window"))?
                    .is_some_and(|w| w > 0)
                {
                    return Err(ConfigError::Unsupported {
                        key: key("attention.sliding_window"),
                        value: format!("{:?}", meta.get(&key("attention.sliding_window"))),
                        why: format!(
                            "sliding-window attention is run for gemma2 and gemma3, not {arch_name}"
                        ),
                    });
                }
            }
        }
        Ok(config)
    }

    /// KV-cache bytes one token of one sequence holds: keys and values
    /// (f32) of every layer's KV heads.
    pub fn kv_bytes_per_token(&self) -> u64 {
        (2 * self.layers * self.kv_heads * self.head_dim * std::mem::size_of::<f32>()) as u64
    }

    /// The most bytes one step holds beyond the weights and the KV caches,
    /// for a step of `step_tokens` tokens over at most `segments`
    /// sequences, whose longest prompt chunk is `chunk` tokens attending
    /// over at most `context` positions. Counted: each token's activations
    /// through a block (residual, norm, q/k/v, attention output, the MLP's
    /// gate, up and product) twice over for temporaries and the quantized
    /// copies the products make; one segment's attention scores, mask and
    /// softmax (segments run one after another); and the logits of every
    /// segment with the sampler's copy.
    pub fn step_activation_bytes(
        &self,
        step_tokens: usize,
        segments: usize,
        chunk: usize,
        context: usize,
    ) -> u64 {
        let f32_bytes = std::mem::size_of::<f32>() as u64;
        let q_dim = self.heads * self.head_dim;
        let kv_dim = self.kv_heads * self.head_dim;
        let per_token =
            (3 * self.hidden + 2 * q_dim + 2 * kv_dim + 4 * self.ffn) as u64 * f32_bytes * 2;
        let scores = 3 * (self.heads * chunk * context) as u64 * f32_bytes;
        let logits = 2 * (segments.min(step_tokens) * self.vocab) as u64 * f32_bytes;
        step_tokens as u64 * per_token + scores + logits
    }
}

/// Which of `layers` attend over the sliding window:
/// `<arch>.attention.sliding_window_pattern` as a list of booleans, or as
/// `n` (each group of `n` layers: `n - 1` windowed, then one global), or
/// the family's `default_pattern` (llama.cpp's `set_swa_pattern`).
fn sliding_layers(
    meta: &Metadata<'_>,
    key: &dyn Fn(&str) -> String,
    layers: usize,
    default_pattern: usize,
) -> Result<Vec<bool>, ConfigError> {
    let k = key("attention.sliding_window_pattern");
    if let Some(Value::Array(flags)) = meta.get(&k) {
        let flags: Option<Vec<bool>> = flags
            .iter()
            .map(|f| match f {
                Value::Bool(b) => Some(*b),
                _ => None,
            })
            .collect();
        return match flags {
            Some(f) if f.len() == layers => Ok(f),
            _ => Err(ConfigError::Unsupported {
                key: k,
                value: "a list".into(),
                why: format!("one boolean per layer ({layers}) is expected"),
            }),
        };
    }
    let n = meta.uint(&k)?.unwrap_or(default_pattern);
    Ok((0..layers).map(|l| n == 0 || l % n < n - 1).collect())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn meta(arch: &str, extra: &[(&str, Value)]) -> HashMap<String, Value> {
        let mut m: HashMap<String, Value> = [
            (
                "general.architecture".to_string(),
                Value::String(arch.into()),
            ),
            (format!("{arch}.block_count"), Value::U32(6)),
            (format!("{arch}.context_length"), Value::U32(2048)),
            (format!("{arch}.embedding_length"), Value::U32(256)),
            (format!("{arch}.feed_forward_length"), Value::U32(512)),
            (format!("{arch}.attention.head_count"), Value::U32(4)),
            (format!("{arch}.attention.head_count_kv"), Value::U32(2)),
            (
                format!("{arch}.attention.layer_norm_rms_epsilon"),
                Value::F32(1e-6),
            ),
            (format!("{arch}.vocab_size"), Value::U32(1000)),
        ]
        .into_iter()
        .collect();
        for (k, v) in extra {
            m.insert(k.to_string(), v.clone());
        }
        m
    }

    fn read(m: &HashMap<String, Value>) -> Result<DecoderConfig, ConfigError> {
        DecoderConfig::from_metadata(&Metadata { values: m })
    }

    /// Each family's constants, from its keys and its defaults.
    #[test]
    fn each_family_reads_its_shape_and_constants() {
        let llama = read(&meta("llama", &[])).unwrap();
        assert_eq!(
            (
                llama.head_dim,
                llama.rope_layout,
                llama.activation,
                llama.embedding_scale
            ),
            (64, RopeLayout::Interleaved, Activation::Silu, None)
        );
        assert_eq!((llama.rope.base, llama.rope.scale), (10_000.0, 1.0));
        assert_eq!(llama.attention_scale, 0.125);
        assert_eq!(llama.kv_bytes_per_token(), 2 * 6 * 2 * 64 * 4);

        let qwen = read(&meta(
            "qwen3",
            &[
                ("qwen3.attention.key_length", Value::U32(128)),
                ("qwen3.attention.value_length", Value::U32(128)),
                ("qwen3.rope.freq_base", Value::F32(1e6)),
            ],
        ))
        .unwrap();
        assert_eq!(
            (qwen.head_dim, qwen.rope_layout, qwen.rope.base),
            (128, RopeLayout::Halves, 1e6)
        );

        let gemma2 = read(&meta(
            "gemma2",
            &[
                ("gemma2.attn_logit_softcapping", Value::F32(50.0)),
                ("gemma2.final_logit_softcapping", Value::F32(30.0)),
                ("gemma2.attention.sliding_window", Value::U32(4096)),
            ],
        ))
        .unwrap();
        assert_eq!(
            (gemma2.attention_softcap, gemma2.final_softcap),
            (Some(50.0), Some(30.0))
        );
        assert_eq!(
            gemma2.sliding_layers,
            [true, false, true, false, true, false]
        );
        assert_eq!(gemma2.embedding_scale, Some(16.0));
        assert_eq!(gemma2.activation, Activation::GeluTanh);

        let gemma3 = read(&meta(
            "gemma3",
            &[
                ("gemma3.attention.sliding_window", Value::U32(512)),
                ("gemma3.rope.freq_base", Value::F32(1e6)),
                ("gemma3.rope.scaling.type", Value::String("linear".into())),
                ("gemma3.rope.scaling.factor", Value::F32(8.0)),
            ],
        ))
        .unwrap();
        assert_eq!(gemma3.sliding_layers, [true, true, true, true, true, false]);
        assert_eq!((gemma3.rope.base, gemma3.rope.scale), (1e6, 0.125));
        assert_eq!(
            (gemma3.rope_local.base, gemma3.rope_local.scale),
            (10_000.0, 1.0)
        );
        assert_eq!(
            (gemma3.attention_softcap, gemma3.sliding_window),
            (None, Some(512))
        );

        // Gemma 2 without the keys: llama.cpp's defaults.
        let bare = read(&meta("gemma2", &[])).unwrap();
        assert_eq!(
            (bare.attention_softcap, bare.final_softcap),
            (Some(50.0), Some(30.0))
        );
        assert_eq!(bare.sliding_window, Some(4096));

        let pattern = read(&meta(
            "gemma3",
            &[
                ("gemma3.attention.sliding_window", Value::U32(8)),
                ("gemma3.attention.sliding_window_pattern", Value::U32(2)),
            ],
        ))
        .unwrap();
        assert_eq!(
            pattern.sliding_layers,
            [true, false, true, false, true, false]
        );
    }

    /// What sluice cannot run is refused naming the key and what is
    /// supported.
    #[test]
    fn what_cannot_run_is_refused_by_key() {
        let cases: Vec<(HashMap<String, Value>, Vec<&str>)> = vec![
            (
                meta("phi3", &[]),
                vec![
                    "general.architecture",
                    "\"phi3\"",
                    "llama, qwen2, qwen3, gemma2, gemma3",
                ],
            ),
            (
                meta("llama", &[("llama.rope.dimension_count", Value::U32(32))]),
                vec!["llama.rope.dimension_count = 32", "partial rotary"],
            ),
            (
                meta(
                    "llama",
                    &[
                        ("llama.rope.scaling.type", Value::String("yarn".into())),
                        ("llama.rope.scaling.factor", Value::F32(4.0)),
                    ],
                ),
                vec!["llama.rope.scaling.type = \"yarn\"", "linear"],
            ),
            (
                meta("llama", &[("llama.attention.head_count_kv", Value::U32(3))]),
                vec!["head_count_kv = 3", "multiple"],
            ),
            (
                meta(
                    "llama",
                    &[(
                        "llama.attention.head_count_kv",
                        Value::Array(vec![Value::U32(2); 6]),
                    )],
                ),
                vec!["head_count_kv", "per-layer"],
            ),
            (
                meta(
                    "llama",
                    &[("llama.attention.sliding_window", Value::U32(4096))],
                ),
                vec!["sliding_window", "gemma2 and gemma3"],
            ),
        ];
        for (m, words) in cases {
            let e = read(&m).unwrap_err().to_string();
            for w in words {
                assert!(e.contains(w), "{e:?} lacks {w:?}");
            }
        }
        let mut m = meta("llama", &[]);
        m.remove("llama.attention.layer_norm_rms_epsilon");
        assert_eq!(
            read(&m).unwrap_err(),
            ConfigError::Missing("llama.attention.layer_norm_rms_epsilon".into())
        );
    }
}
