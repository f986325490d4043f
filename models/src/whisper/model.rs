//! Whisper's network (transformers' `WhisperForConditionalGeneration`, its
//! weight names), in f32: the encoder reads one 30 s window of log-mel
//! features (two convolutions, exact GELU, the stored positions, pre-norm
//! attention blocks) into 1,500 audio states; the decoder reads tokens
//! against them, its self-attention keys and values cached per step and its
//! cross-attention ones computed once per window. Two forwards of the same
//! arithmetic: sluice's own on its CPU kernels (`packed.rs`) where the
//! process runs a SIMD level, candle's (here) at the plain-Rust level and
//! off the CPU.

use std::path::Path;

use candle_core::{DType, Device, Module, Tensor};
use candle_nn::{Conv1d, Conv1dConfig, LayerNorm, Linear, VarBuilder};

use super::config::WhisperConfig;
use super::packed::{PackedState, PackedWhisper};
use crate::encoder_kernels;
use crate::error::{LoadError, ModelError};

const LAYER_NORM_EPS: f64 = 1e-5;

fn linear(
    vb: &VarBuilder,
    name: &str,
    inputs: usize,
    outputs: usize,
    bias: bool,
) -> candle_core::Result<Linear> {
    let vb = vb.pp(name);
    let weight = vb.get((outputs, inputs), "weight")?;
    let bias = if bias {
        Some(vb.get(outputs, "bias")?)
    } else {
        None
    };
    Ok(Linear::new(weight, bias))
}

fn layer_norm(vb: &VarBuilder, name: &str, width: usize) -> candle_core::Result<LayerNorm> {
    let vb = vb.pp(name);
    Ok(LayerNorm::new(
        vb.get(width, "weight")?,
        vb.get(width, "bias")?,
        LAYER_NORM_EPS,
    ))
}

/// Multi-head attention: Q, K (no bias), V, out.
struct Attention {
    q: Linear,
    k: Linear,
    v: Linear,
    out: Linear,
    heads: usize,
}

impl Attention {
    fn load(vb: &VarBuilder, width: usize, heads: usize) -> candle_core::Result<Attention> {
        Ok(Attention {
            q: linear(vb, "q_proj", width, width, true)?,
            k: linear(vb, "k_proj", width, width, false)?,
            v: linear(vb, "v_proj", width, width, true)?,
            out: linear(vb, "out_proj", width, width, true)?,
            heads,
        })
    }

    /// `[batch, len, width]` to `[batch, heads, len, head width]`.
    fn split(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let (batch, len, width) = x.dims3()?;
        x.reshape((batch, len, self.heads, width / self.heads))?
            .transpose(1, 2)?
            .contiguous()
    }

    fn keys_values(&self, x: &Tensor) -> candle_core::Result<(Tensor, Tensor)> {
        Ok((
            self.split(&self.k.forward(x)?)?,
            self.split(&self.v.forward(x)?)?,
        ))
    }

    /// `x` attending to `keys`/`values` (already split), with `mask` added
    /// to the scores.
    fn attend(
        &self,
        x: &Tensor,
        keys: &Tensor,
        values: &Tensor,
        mask: Option<&Tensor>,
    ) -> candle_core::Result<Tensor> {
        let (batch, len, width) = x.dims3()?;
        let head = width / self.heads;
        let q = (self.split(&self.q.forward(x)?)? * (head as f64).powf(-0.5))?;
        let mut scores = q.matmul(&keys.transpose(2, 3)?.contiguous()?)?;
        if let Some(mask) = mask {
            scores = scores.broadcast_add(mask)?;
        }
        let weights = candle_nn::ops::softmax_last_dim(&scores)?;
        let mixed = weights
            .matmul(values)?
            .transpose(1, 2)?
            .reshape((batch, len, width))?;
        self.out.forward(&mixed)
    }
}

/// A pre-norm block: self-attention, cross-attention (decoder), MLP.
struct Block {
    self_attn: Attention,
    self_attn_norm: LayerNorm,
    cross: Option<(Attention, LayerNorm)>,
    fc1: Linear,
    fc2: Linear,
    mlp_norm: LayerNorm,
}

impl Block {
    fn load(
        vb: &VarBuilder,
        width: usize,
        heads: usize,
        ffn: usize,
        cross: bool,
    ) -> candle_core::Result<Block> {
        Ok(Block {
            self_attn: Attention::load(&vb.pp("self_attn"), width, heads)?,
            self_attn_norm: layer_norm(vb, "self_attn_layer_norm", width)?,
            cross: if cross {
                Some((
                    Attention::load(&vb.pp("encoder_attn"), width, heads)?,
                    layer_norm(vb, "encoder_attn_layer_norm", width)?,
                ))
            } else {
                None
            },
            fc1: linear(vb, "fc1", width, ffn, true)?,
            fc2: linear(vb, "fc2", ffn, width, true)?,
            mlp_norm: layer_norm(vb, "final_layer_norm", width)?,
        })
    }

    fn mlp(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let h = self.fc1.forward(&self.mlp_norm.forward(x)?)?.gelu_erf()?;
        x + self.fc2.forward(&h)?
    }
}

/// One window's audio states (from [`WhisperModel::encode`]), `[1500,
/// d_model]`, in the form its forward keeps them.
pub enum AudioStates {
    Candle(Tensor),
    Packed(Vec<f32>),
}

/// One window's decoding state: each decoder layer's self-attention keys
/// and values so far, and its cross-attention ones over the audio.
pub struct DecoderState(State);

enum State {
    Candle(CandleState),
    Packed(PackedState),
}

impl DecoderState {
    /// Tokens read so far (the next one's position).
    pub fn position(&self) -> usize {
        match &self.0 {
            State::Candle(s) => s.position,
            State::Packed(s) => s.position,
        }
    }
}

struct CandleState {
    self_kv: Vec<Option<(Tensor, Tensor)>>,
    cross_kv: Vec<(Tensor, Tensor)>,
    position: usize,
}

/// Whisper's encoder and decoder, on one of the two forwards.
pub struct WhisperModel {
    pub config: WhisperConfig,
    forward: Forward,
}

enum Forward {
    Candle(CandleWhisper),
    Packed(PackedWhisper),
}

fn other_forward() -> ModelError {
    ModelError::Failed("a state made by the other forward".into())
}

/// The network on candle.
struct CandleWhisper {
    config: WhisperConfig,
    device: Device,
    conv1: Conv1d,
    conv2: Conv1d,
    encoder_positions: Tensor,
    encoder_blocks: Vec<Block>,
    encoder_norm: LayerNorm,
    embed_tokens: Tensor,
    decoder_positions: Tensor,
    decoder_blocks: Vec<Block>,
    decoder_norm: LayerNorm,
}

impl WhisperModel {
    /// From `dir`'s `config.json` and `model.safetensors` (f32, f16 or
    /// bf16; run in f32).
    pub fn load(dir: &Path, config: WhisperConfig) -> Result<WhisperModel, LoadError> {
        let path = dir.join("model.safetensors");
        let device = Device::Cpu;
        let bytes = std::fs::read(&path).map_err(|source| LoadError::Read {
            path: path.clone(),
            source,
        })?;
        let vb = VarBuilder::from_buffered_safetensors(bytes, DType::F32, &device).map_err(
            |source| LoadError::Weights {
                path: path.clone(),
                source,
            },
        )?;
        let forward = match encoder_kernels::available() {
            true => PackedWhisper::load(&vb, &config).map(Forward::Packed),
            false => CandleWhisper::build(&vb, config.clone(), device).map(Forward::Candle),
        };
        let forward = forward.map_err(|source| LoadError::Weights { path, source })?;
        Ok(WhisperModel { config, forward })
    }

    /// Which forward runs: `"sluice-<level>"` (`packed.rs` on that kernel
    /// level) or `"candle"`.
    pub fn forward_name(&self) -> &'static str {
        match (&self.forward, encoder_kernels::F32Kernels::current()) {
            (Forward::Packed(_), encoder_kernels::F32Kernels::Avx512(_)) => "sluice-avx512",
            (Forward::Packed(_), encoder_kernels::F32Kernels::Avx2(_)) => "sluice-avx2",
            (Forward::Packed(_), encoder_kernels::F32Kernels::Reference) => "sluice-portable",
            (Forward::Candle(_), _) => "candle",
        }
    }

    /// The audio states of one window: `features` is `n_mels` rows of
    /// 3,000 frames (row-major).
    pub fn encode(&self, features: &[f32], frames: usize) -> Result<AudioStates, ModelError> {
        let mels = self.config.num_mel_bins;
        if features.len() != mels * frames || frames != 2 * self.config.max_source_positions {
            return Err(ModelError::Failed(format!(
                "the encoder reads {mels} mel rows of {} frames, got {} values for {frames} frames",
                2 * self.config.max_source_positions,
                features.len()
            )));
        }
        Ok(match &self.forward {
            Forward::Candle(m) => AudioStates::Candle(m.encode(features, frames)?),
            Forward::Packed(m) => AudioStates::Packed(m.encode(features)),
        })
    }

    /// A fresh decoding state over `audio` (from [`WhisperModel::encode`]).
    pub fn start(&self, audio: &AudioStates) -> Result<DecoderState, ModelError> {
        Ok(DecoderState(match (&self.forward, audio) {
            (Forward::Candle(m), AudioStates::Candle(a)) => State::Candle(m.start(a)?),
            (Forward::Packed(m), AudioStates::Packed(a)) => State::Packed(m.start(a)),
            _ => return Err(other_forward()),
        }))
    }

    /// Reads `tokens` after what `state` has read; the logits at the last
    /// one (`vocab_size` values).
    pub fn step(&self, state: &mut DecoderState, tokens: &[u32]) -> Result<Vec<f32>, ModelError> {
        let mut logits = self.step_many(&mut [state], &[tokens])?;
        Ok(logits.pop().unwrap_or_default())
    }

    /// One decoder step shared by several windows: `states[i]` reads
    /// `tokens[i]`; each one's logits at its last token. The packed forward
    /// runs every product once over all the tokens (each window's logits
    /// the same bits as it alone would get); candle's steps them in turn.
    pub fn step_many(
        &self,
        states: &mut [&mut DecoderState],
        tokens: &[&[u32]],
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        if states.len() != tokens.len() {
            return Err(ModelError::Failed(format!(
                "{} decoding states and {} token lists",
                states.len(),
                tokens.len()
            )));
        }
        for (state, tokens) in states.iter().zip(tokens) {
            let (n, start) = (tokens.len(), state.position());
            if n == 0 || start + n > self.config.max_target_positions {
                return Err(ModelError::Failed(format!(
                    "the decoder holds {} tokens; {start} read and {n} more asked",
                    self.config.max_target_positions
                )));
            }
            if let Some(t) = tokens
                .iter()
                .find(|t| **t as usize >= self.config.vocab_size)
            {
                return Err(ModelError::Failed(format!(
                    "token {t} is outside the vocabulary of {}",
                    self.config.vocab_size
                )));
            }
        }
        match &self.forward {
            Forward::Candle(m) => states
                .iter_mut()
                .zip(tokens)
                .map(|(state, tokens)| match &mut state.0 {
                    State::Candle(s) => m.step(s, tokens),
                    State::Packed(_) => Err(other_forward()),
                })
                .collect(),
            Forward::Packed(m) => {
                let mut packed = Vec::with_capacity(states.len());
                for state in states.iter_mut() {
                    match &mut state.0 {
                        State::Packed(s) => packed.push(s),
                        State::Candle(_) => return Err(other_forward()),
                    }
                }
                Ok(m.step(&mut packed, tokens))
            }
        }
    }

    /// The most one window's encoding and decoding hold at once, in bytes
    /// (f32): one encoder layer's attention scores and their softmax (heads
    /// x 1,500 x 1,500, twice: candle's forward; the packed one holds far
    /// less), its widest activations (a few copies of 3,000 frames or 1,500
    /// positions x the feed-forward width), the window's states, and one
    /// window's decoding state ([`WhisperModel::decoding_state_bytes`]).
    pub fn window_activation_bytes(&self) -> u64 {
        let c = &self.config;
        let positions = c.max_source_positions as u64;
        let frames = 2 * positions;
        let d = c.d_model as u64;
        let wide = (c.encoder_ffn_dim.max(c.d_model) as u64).max(d);
        let scores = 2 * c.encoder_attention_heads as u64 * positions * positions;
        let encoder = scores + 4 * positions * wide + 2 * frames * d.max(c.num_mel_bins as u64);
        4 * (encoder + positions * d) + self.decoding_state_bytes()
    }

    /// What one window being decoded holds, in bytes (f32): every decoder
    /// layer's cross-attention keys and values over the audio and its
    /// self-attention cache at its full length, and a step's logits. Each
    /// recording the transcription thread holds has one while its window is
    /// decoded alongside the others'.
    pub fn decoding_state_bytes(&self) -> u64 {
        let c = &self.config;
        let d = c.d_model as u64;
        let positions = (c.max_source_positions + c.max_target_positions) as u64;
        4 * (c.decoder_layers as u64 * 2 * d * positions + 2 * c.vocab_size as u64)
    }

    /// Index of the largest logit (the first, on a tie).
    pub fn argmax(logits: &[f32]) -> u32 {
        let mut best = 0;
        for (i, &l) in logits.iter().enumerate() {
            if l > logits[best] {
                best = i;
            }
        }
        best as u32
    }
}

impl CandleWhisper {
    fn build(
        vb: &VarBuilder,
        config: WhisperConfig,
        device: Device,
    ) -> candle_core::Result<CandleWhisper> {
        let c = &config;
        let d = c.d_model;
        let enc = vb.pp("model.encoder");
        let dec = vb.pp("model.decoder");
        let conv = |name: &str, inputs: usize, stride: usize| -> candle_core::Result<Conv1d> {
            let vb = enc.pp(name);
            Ok(Conv1d::new(
                vb.get((d, inputs, 3), "weight")?,
                Some(vb.get(d, "bias")?),
                Conv1dConfig {
                    padding: 1,
                    stride,
                    dilation: 1,
                    groups: 1,
                    cudnn_fwd_algo: None,
                },
            ))
        };
        let blocks = |vb: &VarBuilder, n: usize, heads: usize, ffn: usize, cross: bool| {
            (0..n)
                .map(|i| Block::load(&vb.pp(format!("layers.{i}")), d, heads, ffn, cross))
                .collect::<candle_core::Result<Vec<_>>>()
        };
        Ok(CandleWhisper {
            conv1: conv("conv1", c.num_mel_bins, 1)?,
            conv2: conv("conv2", d, 2)?,
            encoder_positions: enc.get((c.max_source_positions, d), "embed_positions.weight")?,
            encoder_blocks: blocks(
                &enc,
                c.encoder_layers,
                c.encoder_attention_heads,
                c.encoder_ffn_dim,
                false,
            )?,
            encoder_norm: layer_norm(&enc, "layer_norm", d)?,
            embed_tokens: dec.get((c.vocab_size, d), "embed_tokens.weight")?,
            decoder_positions: dec.get((c.max_target_positions, d), "embed_positions.weight")?,
            decoder_blocks: blocks(
                &dec,
                c.decoder_layers,
                c.decoder_attention_heads,
                c.decoder_ffn_dim,
                true,
            )?,
            decoder_norm: layer_norm(&dec, "layer_norm", d)?,
            config,
            device,
        })
    }

    /// `[1, 1500, d_model]` audio states (the shape checked by the caller).
    fn encode(&self, features: &[f32], frames: usize) -> Result<Tensor, ModelError> {
        let mels = self.config.num_mel_bins;
        let x = Tensor::from_slice(features, (1, mels, frames), &self.device)?;
        let x = self.conv1.forward(&x)?.gelu_erf()?;
        let x = self.conv2.forward(&x)?.gelu_erf()?;
        let mut x = x.transpose(1, 2)?.broadcast_add(&self.encoder_positions)?;
        for block in &self.encoder_blocks {
            let h = block.self_attn_norm.forward(&x)?;
            let (k, v) = block.self_attn.keys_values(&h)?;
            x = (&x + block.self_attn.attend(&h, &k, &v, None)?)?;
            x = block.mlp(&x)?;
        }
        Ok(self.encoder_norm.forward(&x)?)
    }

    fn start(&self, audio: &Tensor) -> Result<CandleState, ModelError> {
        let cross_kv = self
            .decoder_blocks
            .iter()
            .map(|b| match &b.cross {
                Some((attn, _)) => attn.keys_values(audio),
                None => Err(candle_core::Error::Msg(
                    "a decoder block without cross-attention".into(),
                )),
            })
            .collect::<candle_core::Result<Vec<_>>>()?;
        Ok(CandleState {
            self_kv: vec![None; self.decoder_blocks.len()],
            cross_kv,
            position: 0,
        })
    }

    fn step(&self, state: &mut CandleState, tokens: &[u32]) -> Result<Vec<f32>, ModelError> {
        let n = tokens.len();
        let start = state.position;
        let ids = Tensor::from_slice(tokens, (1, n), &self.device)?;
        let embedded = self
            .embed_tokens
            .embedding(&ids.flatten_all()?)?
            .unsqueeze(0)?;
        let mut x = embedded.broadcast_add(&self.decoder_positions.narrow(0, start, n)?)?;
        // Causal over the new tokens; every earlier one is visible.
        let mask = (n > 1)
            .then(|| {
                let values: Vec<f32> = (0..n)
                    .flat_map(|i| {
                        (0..start + n).map(move |j| {
                            if j > start + i {
                                f32::NEG_INFINITY
                            } else {
                                0.0
                            }
                        })
                    })
                    .collect();
                Tensor::from_vec(values, (n, start + n), &self.device)
            })
            .transpose()?;
        for (i, block) in self.decoder_blocks.iter().enumerate() {
            let h = block.self_attn_norm.forward(&x)?;
            let (k, v) = block.self_attn.keys_values(&h)?;
            let (k, v) = match state.self_kv[i].take() {
                Some((pk, pv)) => (Tensor::cat(&[&pk, &k], 2)?, Tensor::cat(&[&pv, &v], 2)?),
                None => (k, v),
            };
            x = (&x + block.self_attn.attend(&h, &k, &v, mask.as_ref())?)?;
            state.self_kv[i] = Some((k, v));
            if let Some((attn, norm)) = &block.cross {
                let (ck, cv) = &state.cross_kv[i];
                x = (&x + attn.attend(&norm.forward(&x)?, ck, cv, None)?)?;
            }
            x = block.mlp(&x)?;
        }
        state.position += n;
        let last = self.decoder_norm.forward(&x.narrow(1, n - 1, 1)?)?;
        let logits = last.squeeze(0)?.matmul(&self.embed_tokens.t()?)?;
        Ok(logits.squeeze(0)?.to_vec1::<f32>()?)
    }
}
