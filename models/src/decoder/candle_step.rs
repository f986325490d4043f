//! The candle step: the same arithmetic as the host step in candle ops, for
//! CUDA, CPUs without the kernels, weights the kernels do not pack, and as
//! the reference the tests hold the host step to. Attention runs per
//! sequence against its cache, the query heads that share a KV head side by
//! side, a mask for causality and the sliding window.

use candle_core::{D, Device, Tensor};

use super::config::{Activation, DecoderConfig, RopeLayout};
use super::kv::{KvLayers, Segment};
use super::rope::Ropes;
use super::weights::Block;
use crate::ModelError;

/// The blocks over `x`, the step's embeddings `[tokens, hidden]`; returns
/// the hidden state of every token. Writes the new keys and values into the
/// caches (their `len` is advanced by the caller).
pub(crate) fn forward(
    c: &DecoderConfig,
    ropes: &Ropes,
    blocks: &[Block],
    segments: &mut [Segment],
    mut x: Tensor,
) -> Result<Tensor, ModelError> {
    let device = x.device().clone();
    let eps = c.rms_eps as f32;
    let group = c.heads / c.kv_heads;
    // Each segment's rotations, for global and sliding-window layers.
    let tables = |angles: &super::rope::RopeAngles| -> candle_core::Result<Vec<(Tensor, Tensor)>> {
        segments
            .iter()
            .map(|s| {
                let n = s.tokens.len();
                let (cos, sin) = angles.tables(s.cache.len..s.cache.len + n);
                Ok((
                    Tensor::from_vec(cos, (n, angles.half()), &device)?,
                    Tensor::from_vec(sin, (n, angles.half()), &device)?,
                ))
            })
            .collect()
    };
    let global = tables(&ropes.global)?;
    let local = match &ropes.local {
        Some(l) => Some(tables(l)?),
        None => None,
    };
    for (layer, block) in blocks.iter().enumerate() {
        let sliding = c.sliding_layers.get(layer).copied().unwrap_or(false);
        let rotations = match (&local, sliding) {
            (Some(l), true) => l,
            _ => &global,
        };
        let window = if sliding { c.sliding_window } else { None };
        let h = candle_nn::ops::rms_norm(&x, &block.attn_norm, eps)?;
        let with_bias = |t: Tensor, b: &Option<Tensor>| -> candle_core::Result<Tensor> {
            match b {
                Some(b) => t.broadcast_add(b),
                None => Ok(t),
            }
        };
        let q = with_bias(block.q.forward(&h)?, &block.q_bias)?;
        let k = with_bias(block.k.forward(&h)?, &block.k_bias)?;
        let v = with_bias(block.v.forward(&h)?, &block.v_bias)?;
        let mut contexts = Vec::with_capacity(segments.len());
        let mut offset = 0;
        for (s, (cos, sin)) in segments.iter_mut().zip(rotations) {
            let n = s.tokens.len();
            let start = s.cache.len;
            let heads = |t: &Tensor, count: usize| -> candle_core::Result<Tensor> {
                t.narrow(0, offset, n)?
                    .reshape((n, count, c.head_dim))?
                    .transpose(0, 1)?
                    .contiguous()
            };
            let norm = |t: Tensor, w: &Option<Tensor>| -> candle_core::Result<Tensor> {
                match w {
                    Some(w) => candle_nn::ops::rms_norm(&t, w, eps),
                    None => Ok(t),
                }
            };
            let rope = |t: Tensor| -> candle_core::Result<Tensor> {
                let t = t.unsqueeze(0)?;
                match c.rope_layout {
                    RopeLayout::Interleaved => candle_nn::rotary_emb::rope_i(&t, cos, sin)?,
                    RopeLayout::Halves => candle_nn::rotary_emb::rope(&t, cos, sin)?,
                }
                .squeeze(0)
            };
            let qs = rope(norm(heads(&q, c.heads)?, &block.q_norm)?)?;
            let ks = rope(norm(heads(&k, c.kv_heads)?, &block.k_norm)?)?;
            let vs = heads(&v, c.kv_heads)?;
            let KvLayers::Tensors(caches) = &s.cache.layers else {
                return Err(ModelError::Failed(
                    "a KV cache made for the host step in the candle step".into(),
                ));
            };
            let (k_cache, v_cache) = &caches[layer];
            k_cache.slice_set(&ks, 1, start)?;
            v_cache.slice_set(&vs, 1, start)?;
            let len = start + n;
            let keys = k_cache.narrow(1, 0, len)?;
            let values = v_cache.narrow(1, 0, len)?;
            // The query heads that share a KV head, side by side:
            // [kv_heads, group * n, head_dim].
            let qg = qs.reshape((c.kv_heads, group * n, c.head_dim))?;
            let mut scores = (qg.matmul(&keys.t()?)? * f64::from(c.attention_scale))?;
            if let Some(cap) = c.attention_softcap {
                scores = ((scores / f64::from(cap))?.tanh()? * f64::from(cap))?;
            }
            if n > 1 || window.is_some_and(|w| w < len) {
                scores = scores.broadcast_add(&mask(group, n, start, window, &device)?)?;
            }
            let weights = candle_nn::ops::softmax_last_dim(&scores)?;
            let ctx = weights
                .matmul(&values.contiguous()?)?
                .reshape((c.heads, n, c.head_dim))?
                .transpose(0, 1)?
                .reshape((n, c.heads * c.head_dim))?;
            contexts.push(ctx);
            offset += n;
        }
        let attn = with_bias(block.o.forward(&Tensor::cat(&contexts, 0)?)?, &block.o_bias)?;
        let attn = match &block.attn_post_norm {
            Some(w) => candle_nn::ops::rms_norm(&attn, w, eps)?,
            None => attn,
        };
        x = (x + attn)?;
        let h = candle_nn::ops::rms_norm(&x, &block.ffn_norm, eps)?;
        let gate = block.gate.forward(&h)?;
        let gate = match c.activation {
            Activation::Silu => candle_nn::ops::silu(&gate)?,
            // candle's `gelu` is tanh's approximation.
            Activation::GeluTanh => gate.gelu()?,
        };
        let mlp = block.down.forward(&(gate * block.up.forward(&h)?)?)?;
        let mlp = match &block.ffn_post_norm {
            Some(w) => candle_nn::ops::rms_norm(&mlp, w, eps)?,
            None => mlp,
        };
        x = (x + mlp)?;
    }
    Ok(x)
}

/// 0 where query `i` (of `n`, at position `start + i`, repeated for each of
/// `group` heads) may see key `j`, minus infinity where `j` is in its
/// future or, with a window, `window` or more positions in its past.
fn mask(
    group: usize,
    n: usize,
    start: usize,
    window: Option<usize>,
    device: &Device,
) -> candle_core::Result<Tensor> {
    let len = start + n;
    let mask: Vec<f32> = (0..group * n)
        .flat_map(|row| {
            let pos = start + row % n;
            (0..len).map(move |j| {
                let seen = j <= pos && window.is_none_or(|w| pos - j < w);
                if seen { 0.0 } else { f32::NEG_INFINITY }
            })
        })
        .collect();
    Tensor::from_vec(mask, (group * n, len), device)
}

/// Index of the largest logit (greedy decoding).
pub fn argmax(logits: &Tensor) -> Result<u32, ModelError> {
    Ok(logits.argmax(D::Minus1)?.to_scalar::<u32>()?)
}
