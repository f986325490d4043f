//! Whisper's forward on sluice's CPU kernels, the same arithmetic as
//! `model.rs`'s candle one up to f32 rounding (`models/tests/whisper*.rs`
//! hold both to transformers): the encoder's two convolutions as products
//! over unfolded frames, its pre-norm blocks on the packed encoder kernels
//! (Q, K and V in one product, attention without a score tensor, split by
//! queries across the threads); the decoder's step on plain buffers, its
//! self-attention keys and values written in place into a cache as long as
//! the decoder's positions, its cross-attention ones over the audio
//! computed once per window, every product of a step's few tokens shared
//! among the threads by output panels, the vocabulary projection included.

use candle_nn::VarBuilder;
use sluice_kernels::decoder::{AttentionRule, DecoderHeads, SequenceAttention, causal_attention};

use super::config::WhisperConfig;
use crate::encoder_kernels::{self as kernels, Activation, Heads, PackedLinear, Span};
use crate::packed_layers::{Norm, add, linear, stacked, values};

/// Whisper's layer norms (every one of them).
const LAYER_NORM_EPS: f32 = 1e-5;

/// A convolution of kernel 3 and padding 1 (`[out, in, 3]`) as a product
/// over unfolded inputs (`in x 3` values per output position).
fn conv(vb: &VarBuilder, name: &str, inputs: usize, d: usize) -> candle_core::Result<PackedLinear> {
    let vb = vb.pp(name);
    let w = values(vb.get((d, inputs, 3), "weight")?)?;
    let b = values(vb.get(d, "bias")?)?;
    Ok(PackedLinear::new(&w, d, inputs * 3, Some(&b)))
}

struct EncoderLayer {
    attn_norm: Norm,
    /// Queries, keys (no bias) and values: `d -> 3d`.
    qkv: PackedLinear,
    attn_out: PackedLinear,
    mlp_norm: Norm,
    fc1: PackedLinear,
    fc2: PackedLinear,
}

struct DecoderLayer {
    self_norm: Norm,
    self_qkv: PackedLinear,
    self_out: PackedLinear,
    cross_norm: Norm,
    cross_q: PackedLinear,
    /// Keys (no bias) and values of the audio: `d -> 2d`, once a window.
    cross_kv: PackedLinear,
    cross_out: PackedLinear,
    mlp_norm: Norm,
    fc1: PackedLinear,
    fc2: PackedLinear,
}

/// The packed network.
pub(super) struct PackedWhisper {
    mels: usize,
    d: usize,
    /// Audio positions a window has (1,500).
    positions: usize,
    /// Decoder positions (the self-attention cache's length).
    max_target: usize,
    conv1: PackedLinear,
    conv2: PackedLinear,
    encoder_positions: Vec<f32>,
    encoder_layers: Vec<EncoderLayer>,
    encoder_heads: Heads,
    encoder_norm: Norm,
    /// The token embeddings, tied to the output: `[vocab, d]` as the
    /// vocabulary projection, a token's row read back from it.
    vocab_projection: PackedLinear,
    decoder_positions: Vec<f32>,
    decoder_layers: Vec<DecoderLayer>,
    decoder_heads: DecoderHeads,
    decoder_norm: Norm,
}

/// One window's decoding state on the packed forward: per layer, the
/// self-attention keys and values (`[heads, max target positions, head
/// dim]`, filled up to `position`) and the cross-attention ones (`[heads,
/// 1500, head dim]`).
pub(super) struct PackedState {
    self_kv: Vec<(Vec<f32>, Vec<f32>)>,
    cross_kv: Vec<(Vec<f32>, Vec<f32>)>,
    pub(super) position: usize,
}

/// `rows` rows of `[heads * head_dim]` (from `src`, row stride `stride`,
/// starting at column `offset`) into a head-major cache `[heads, capacity,
/// head_dim]` at positions `at..`.
#[allow(clippy::too_many_arguments)]
fn scatter_heads(
    src: &[f32],
    stride: usize,
    offset: usize,
    rows: usize,
    heads: usize,
    head_dim: usize,
    capacity: usize,
    at: usize,
    cache: &mut [f32],
) {
    for r in 0..rows {
        let row = &src[r * stride + offset..r * stride + offset + heads * head_dim];
        for (h, part) in row.chunks_exact(head_dim).enumerate() {
            let to = (h * capacity + at + r) * head_dim;
            cache[to..to + head_dim].copy_from_slice(part);
        }
    }
}

impl PackedWhisper {
    pub(super) fn load(vb: &VarBuilder, c: &WhisperConfig) -> candle_core::Result<PackedWhisper> {
        let d = c.d_model;
        let enc = vb.pp("model.encoder");
        let dec = vb.pp("model.decoder");
        let encoder_layers = (0..c.encoder_layers)
            .map(|i| {
                let vb = enc.pp(format!("layers.{i}"));
                let attn = vb.pp("self_attn");
                Ok(EncoderLayer {
                    attn_norm: Norm::load(&vb, LAYER_NORM_EPS, "self_attn_layer_norm", d)?,
                    qkv: stacked(
                        &attn,
                        &[("q_proj", true), ("k_proj", false), ("v_proj", true)],
                        d,
                    )?,
                    attn_out: linear(&attn, "out_proj", d, d, true)?,
                    mlp_norm: Norm::load(&vb, LAYER_NORM_EPS, "final_layer_norm", d)?,
                    fc1: linear(&vb, "fc1", d, c.encoder_ffn_dim, true)?,
                    fc2: linear(&vb, "fc2", c.encoder_ffn_dim, d, true)?,
                })
            })
            .collect::<candle_core::Result<Vec<_>>>()?;
        let decoder_layers = (0..c.decoder_layers)
            .map(|i| {
                let vb = dec.pp(format!("layers.{i}"));
                let attn = vb.pp("self_attn");
                let cross = vb.pp("encoder_attn");
                Ok(DecoderLayer {
                    self_norm: Norm::load(&vb, LAYER_NORM_EPS, "self_attn_layer_norm", d)?,
                    self_qkv: stacked(
                        &attn,
                        &[("q_proj", true), ("k_proj", false), ("v_proj", true)],
                        d,
                    )?,
                    self_out: linear(&attn, "out_proj", d, d, true)?,
                    cross_norm: Norm::load(&vb, LAYER_NORM_EPS, "encoder_attn_layer_norm", d)?,
                    cross_q: linear(&cross, "q_proj", d, d, true)?,
                    cross_kv: stacked(&cross, &[("k_proj", false), ("v_proj", true)], d)?,
                    cross_out: linear(&cross, "out_proj", d, d, true)?,
                    mlp_norm: Norm::load(&vb, LAYER_NORM_EPS, "final_layer_norm", d)?,
                    fc1: linear(&vb, "fc1", d, c.decoder_ffn_dim, true)?,
                    fc2: linear(&vb, "fc2", c.decoder_ffn_dim, d, true)?,
                })
            })
            .collect::<candle_core::Result<Vec<_>>>()?;
        let embed = values(dec.get((c.vocab_size, d), "embed_tokens.weight")?)?;
        Ok(PackedWhisper {
            mels: c.num_mel_bins,
            d,
            positions: c.max_source_positions,
            max_target: c.max_target_positions,
            conv1: conv(&enc, "conv1", c.num_mel_bins, d)?,
            conv2: conv(&enc, "conv2", d, d)?,
            encoder_positions: values(
                enc.get((c.max_source_positions, d), "embed_positions.weight")?,
            )?,
            encoder_layers,
            encoder_heads: Heads {
                heads: c.encoder_attention_heads,
                head_dim: d / c.encoder_attention_heads,
            },
            encoder_norm: Norm::load(&enc, LAYER_NORM_EPS, "layer_norm", d)?,
            vocab_projection: PackedLinear::new(&embed, c.vocab_size, d, None),
            decoder_positions: values(
                dec.get((c.max_target_positions, d), "embed_positions.weight")?,
            )?,
            decoder_layers,
            decoder_heads: DecoderHeads {
                heads: c.decoder_attention_heads,
                kv_heads: c.decoder_attention_heads,
                head_dim: d / c.decoder_attention_heads,
            },
            decoder_norm: Norm::load(&dec, LAYER_NORM_EPS, "layer_norm", d)?,
        })
    }

    /// One window's audio states, `[positions, d]`, from its features
    /// (`mels` rows of `2 * positions` frames, row-major).
    pub(super) fn encode(&self, features: &[f32]) -> Vec<f32> {
        let (mels, d, n) = (self.mels, self.d, self.positions);
        let frames = 2 * n;
        // conv1 (stride 1) over unfolded frames: row p holds, for each mel
        // bin i, frames p - 1, p, p + 1 (zeros past the ends).
        let mut unfolded = vec![0f32; frames * mels * 3];
        for (p, row) in unfolded.chunks_exact_mut(mels * 3).enumerate() {
            for (i, taps) in row.chunks_exact_mut(3).enumerate() {
                let bin = &features[i * frames..(i + 1) * frames];
                for (t, v) in taps.iter_mut().enumerate() {
                    if let Some(f) = (p + t).checked_sub(1).filter(|f| *f < frames) {
                        *v = bin[f];
                    }
                }
            }
        }
        let mut h = Vec::new();
        self.conv1
            .forward_into(&unfolded, frames, &mut h, Activation::Gelu);
        // conv2 (stride 2): row p holds frames 2p - 1, 2p, 2p + 1 of every
        // channel, channel-major as the weights are.
        unfolded.clear();
        unfolded.resize(n * d * 3, 0.0);
        for (p, row) in unfolded.chunks_exact_mut(d * 3).enumerate() {
            for t in 0..3 {
                if let Some(f) = (2 * p + t).checked_sub(1).filter(|f| *f < frames) {
                    for (c, v) in h[f * d..(f + 1) * d].iter().enumerate() {
                        row[c * 3 + t] = *v;
                    }
                }
            }
        }
        let mut x = Vec::new();
        self.conv2
            .forward_into(&unfolded, n, &mut x, Activation::Gelu);
        drop(unfolded);
        add(&mut x, &self.encoder_positions[..n * d]);
        let spans = [Span { start: 0, len: n }];
        let (mut qkv, mut context, mut out, mut inner) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for layer in &self.encoder_layers {
            layer.attn_norm.apply(&x, &mut h);
            layer.qkv.forward_into(&h, n, &mut qkv, Activation::None);
            kernels::attention_into(&qkv, &spans, self.encoder_heads, &mut context);
            layer
                .attn_out
                .forward_into(&context, n, &mut out, Activation::None);
            add(&mut x, &out);
            layer.mlp_norm.apply(&x, &mut h);
            layer.fc1.forward_into(&h, n, &mut inner, Activation::Gelu);
            layer
                .fc2
                .forward_into(&inner, n, &mut out, Activation::None);
            add(&mut x, &out);
        }
        self.encoder_norm.apply(&x, &mut h);
        h
    }

    /// A fresh decoding state over `audio` (`[positions, d]`).
    pub(super) fn start(&self, audio: &[f32]) -> PackedState {
        let DecoderHeads {
            heads, head_dim, ..
        } = self.decoder_heads;
        let (d, n) = (self.d, audio.len() / self.d);
        let mut kv = Vec::new();
        let cross_kv = self
            .decoder_layers
            .iter()
            .map(|layer| {
                layer
                    .cross_kv
                    .forward_into(audio, n, &mut kv, Activation::None);
                let (mut k, mut v) = (vec![0f32; n * d], vec![0f32; n * d]);
                scatter_heads(&kv, 2 * d, 0, n, heads, head_dim, n, 0, &mut k);
                scatter_heads(&kv, 2 * d, d, n, heads, head_dim, n, 0, &mut v);
                (k, v)
            })
            .collect();
        let cache = self.max_target * d;
        PackedState {
            self_kv: (0..self.decoder_layers.len())
                .map(|_| (vec![0f32; cache], vec![0f32; cache]))
                .collect(),
            cross_kv,
            position: 0,
        }
    }

    /// One decoder step shared by several windows: each `states[i]` reads
    /// `tokens[i]` (each below the vocabulary, within the decoder's
    /// positions: checked by the caller) after what it has read; the
    /// logits at each one's last token. Every product runs once over all
    /// their tokens (the weights read once a step), the attention per
    /// window; a window's logits are the same bits whichever others share
    /// its step.
    pub(super) fn step(&self, states: &mut [&mut PackedState], tokens: &[&[u32]]) -> Vec<Vec<f32>> {
        let d = self.d;
        let rows: usize = tokens.iter().map(|t| t.len()).sum();
        let shape = self.decoder_heads;
        let (heads, hd, cap) = (shape.heads, shape.head_dim, self.max_target);
        let rule = AttentionRule::default();
        let mut x = Vec::with_capacity(rows * d);
        for (state, tokens) in states.iter().zip(tokens) {
            for (i, &t) in tokens.iter().enumerate() {
                let at = state.position + i;
                let embedded = self.vocab_projection.weight_row(t as usize);
                let position = &self.decoder_positions[at * d..(at + 1) * d];
                x.extend(embedded.iter().zip(position).map(|(e, p)| e + p));
            }
        }
        let (mut h, mut qkv, mut q, mut out, mut inner) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for (l, layer) in self.decoder_layers.iter().enumerate() {
            layer.self_norm.apply(&x, &mut h);
            layer
                .self_qkv
                .forward_into(&h, rows, &mut qkv, Activation::None);
            let queries: Vec<f32> = qkv
                .chunks_exact(3 * d)
                .flat_map(|r| &r[..d])
                .copied()
                .collect();
            // Each window's new keys and values into its cache, in place.
            let mut first = 0;
            for (state, tokens) in states.iter_mut().zip(tokens) {
                let n = tokens.len();
                let mine = &qkv[first * 3 * d..(first + n) * 3 * d];
                let (keys, values) = &mut state.self_kv[l];
                scatter_heads(mine, 3 * d, d, n, heads, hd, cap, state.position, keys);
                scatter_heads(
                    mine,
                    3 * d,
                    2 * d,
                    n,
                    heads,
                    hd,
                    cap,
                    state.position,
                    values,
                );
                first += n;
            }
            let mut first = 0;
            let sequences: Vec<SequenceAttention<'_>> = states
                .iter()
                .zip(tokens)
                .map(|(state, tokens)| {
                    let n = tokens.len();
                    let (keys, values) = &state.self_kv[l];
                    first += n;
                    SequenceAttention {
                        queries: &queries[(first - n) * d..first * d],
                        keys,
                        values,
                        capacity: cap,
                        start: state.position,
                    }
                })
                .collect();
            let context = causal_attention(shape, rule, &sequences);
            layer
                .self_out
                .forward_into(&context, rows, &mut out, Activation::None);
            add(&mut x, &out);
            // Every token sees all of its window's audio: each its own
            // "sequence" at the audio's last position.
            layer.cross_norm.apply(&x, &mut h);
            layer
                .cross_q
                .forward_into(&h, rows, &mut q, Activation::None);
            let mut rows_of = q.chunks_exact(d);
            let mut per_token = Vec::with_capacity(rows);
            for (state, tokens) in states.iter().zip(tokens) {
                let (keys, values) = &state.cross_kv[l];
                let audio = keys.len() / d;
                for queries in rows_of.by_ref().take(tokens.len()) {
                    per_token.push(SequenceAttention {
                        queries,
                        keys,
                        values,
                        capacity: audio,
                        start: audio - 1,
                    });
                }
            }
            let context = causal_attention(shape, rule, &per_token);
            layer
                .cross_out
                .forward_into(&context, rows, &mut out, Activation::None);
            add(&mut x, &out);
            layer.mlp_norm.apply(&x, &mut h);
            layer
                .fc1
                .forward_into(&h, rows, &mut inner, Activation::Gelu);
            layer
                .fc2
                .forward_into(&inner, rows, &mut out, Activation::None);
            add(&mut x, &out);
        }
        // Each window's last token to logits, all in one product.
        let mut last = Vec::with_capacity(states.len() * d);
        let mut end = 0;
        for (state, tokens) in states.iter_mut().zip(tokens) {
            end += tokens.len();
            last.extend_from_slice(&x[(end - 1) * d..end * d]);
            state.position += tokens.len();
        }
        self.decoder_norm.apply(&last, &mut h);
        let vocab = self.vocab_projection.outputs();
        self.vocab_projection
            .forward(&h, states.len())
            .chunks_exact(vocab)
            .map(<[f32]>::to_vec)
            .collect()
    }
}
