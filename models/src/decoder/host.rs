//! The host step: a decoder step on plain `f32` buffers and the
//! `sluice-kernels` crate's batched quantized products and decoder pieces.
//! Q, K and V are one product, gate and up another (each a
//! `StackedMatrix`: one input quantization, a run per packing), so a layer
//! is four products with the family's norms, biases, rotary layout,
//! attention rule and gate activation between them, on the same buffers.
//! The products and the attention are parallel regions on the model's
//! thread team (`kernels::team`), whose threads spin between regions rather
//! than sleep.

use candle_core::Tensor;
use sluice_kernels::decoder::{self, AttentionRule, DecoderHeads, Gate, SequenceAttention};
use std::time::{Duration, Instant};

use sluice_kernels::quantized::{BlockType, StackedMatrix};
use sluice_kernels::team::Team;

use super::config::{Activation, DecoderConfig, RopeLayout};
use super::kv::{KvLayers, Segment};
use super::rope::Ropes;
use super::weights::{Block, Linear};
use crate::ModelError;

/// A block as the host step runs it.
pub(crate) struct HostBlock {
    attn_norm: Vec<f32>,
    qkv: StackedMatrix,
    /// Q's, K's and V's biases side by side (zeros where one has none).
    qkv_bias: Option<Vec<f32>>,
    q_norm: Option<Vec<f32>>,
    k_norm: Option<Vec<f32>>,
    o: StackedMatrix,
    o_bias: Option<Vec<f32>>,
    attn_post_norm: Option<Vec<f32>>,
    ffn_norm: Vec<f32>,
    gate_up: StackedMatrix,
    down: StackedMatrix,
    ffn_post_norm: Option<Vec<f32>>,
}

fn vector(t: &Option<Tensor>) -> Result<Option<Vec<f32>>, ModelError> {
    Ok(match t {
        Some(t) => Some(t.to_vec1()?),
        None => None,
    })
}

impl HostBlock {
    /// Whether every matrix of `b` is in the kernels' packing.
    pub(crate) fn fits(b: &Block) -> bool {
        [&b.q, &b.k, &b.v, &b.o, &b.gate, &b.up, &b.down]
            .iter()
            .all(|l| l.packed().is_some())
    }

    /// `b` for the host step, its matrices moved into stacks.
    pub(crate) fn from_block(b: Block) -> Result<HostBlock, ModelError> {
        let unfit = || ModelError::Failed("a block's weights do not fit the host step".into());
        let stack = |parts: Vec<Linear>| -> Result<StackedMatrix, ModelError> {
            let packed = parts
                .into_iter()
                .map(|l| match l {
                    Linear::Packed(p) => Ok(p),
                    _ => Err(unfit()),
                })
                .collect::<Result<Vec<_>, _>>()?;
            StackedMatrix::new(packed).ok_or_else(unfit)
        };
        let (q_rows, k_rows, v_rows) = (
            b.q.packed().map_or(0, |p| p.rows()),
            b.k.packed().map_or(0, |p| p.rows()),
            b.v.packed().map_or(0, |p| p.rows()),
        );
        let qkv_bias = if b.q_bias.is_some() || b.k_bias.is_some() || b.v_bias.is_some() {
            let part = |t: &Option<Tensor>, n: usize| -> Result<Vec<f32>, ModelError> {
                Ok(vector(t)?.unwrap_or_else(|| vec![0.0; n]))
            };
            let mut all = part(&b.q_bias, q_rows)?;
            all.extend(part(&b.k_bias, k_rows)?);
            all.extend(part(&b.v_bias, v_rows)?);
            Some(all)
        } else {
            None
        };
        Ok(HostBlock {
            attn_norm: b.attn_norm.to_vec1()?,
            qkv_bias,
            q_norm: vector(&b.q_norm)?,
            k_norm: vector(&b.k_norm)?,
            o_bias: vector(&b.o_bias)?,
            attn_post_norm: vector(&b.attn_post_norm)?,
            ffn_norm: b.ffn_norm.to_vec1()?,
            ffn_post_norm: vector(&b.ffn_post_norm)?,
            qkv: stack(vec![b.q, b.k, b.v])?,
            o: stack(vec![b.o])?,
            gate_up: stack(vec![b.gate, b.up])?,
            down: stack(vec![b.down])?,
        })
    }
}

impl HostBlock {
    /// Whether any of the block's matrices is held in 4 bits.
    pub(crate) fn has_four_bit(&self) -> bool {
        self.stacks()
            .iter()
            .any(|m| m.block_types().contains(&BlockType::Q4_1))
    }

    fn stacks(&self) -> [&StackedMatrix; 4] {
        [&self.qkv, &self.o, &self.gate_up, &self.down]
    }

    /// The block with its 4-bit matrices requantized to Q8_0 (`--weights
    /// auto`'s other choice).
    pub(crate) fn to_q8_0(&self) -> Result<HostBlock, ModelError> {
        let q8 = |m: &StackedMatrix| {
            m.to_q8_0()
                .ok_or_else(|| ModelError::Failed("cannot requantize a stack to Q8_0".into()))
        };
        Ok(HostBlock {
            attn_norm: self.attn_norm.clone(),
            qkv: q8(&self.qkv)?,
            qkv_bias: self.qkv_bias.clone(),
            q_norm: self.q_norm.clone(),
            k_norm: self.k_norm.clone(),
            o: q8(&self.o)?,
            o_bias: self.o_bias.clone(),
            attn_post_norm: self.attn_post_norm.clone(),
            ffn_norm: self.ffn_norm.clone(),
            gate_up: q8(&self.gate_up)?,
            down: q8(&self.down)?,
            ffn_post_norm: self.ffn_post_norm.clone(),
        })
    }
}

/// The time one step's products take over all of `blocks` at `tokens`
/// tokens: the part of a step the weights' packing decides.
pub(crate) fn time_products(blocks: &[HostBlock], team: &Team, tokens: usize) -> Duration {
    let start = Instant::now();
    for b in blocks {
        for m in b.stacks() {
            let x = vec![0.01f32; tokens * m.cols()];
            std::hint::black_box(m.matmul_on(team, &x, tokens));
        }
    }
    start.elapsed()
}

/// The blocks of the host step and the threads they run on.
pub(crate) struct HostLayers {
    pub(crate) blocks: Vec<HostBlock>,
    /// The final RMS norm's weights.
    pub(crate) norm: Vec<f32>,
    /// The threads the step's products and attention share (as many as
    /// rayon's pool: `RAYON_NUM_THREADS`, else one per core).
    pub(crate) team: Team,
}

impl HostLayers {
    /// The blocks over `x`, the step's embeddings `[tokens, hidden]`;
    /// returns the hidden state after each segment's last token,
    /// `[segments, hidden]`. Writes the new keys and values into the caches
    /// (their `len` is advanced by the caller).
    pub(crate) fn forward(
        &self,
        c: &DecoderConfig,
        ropes: &Ropes,
        segments: &mut [Segment],
        mut x: Vec<f32>,
    ) -> Result<Vec<f32>, ModelError> {
        let team = &self.team;
        let (hidden, hd) = (c.hidden, c.head_dim);
        let half = hd / 2;
        let q_dim = c.heads * hd;
        let kv_dim = c.kv_heads * hd;
        let qkv_dim = q_dim + 2 * kv_dim;
        let tokens = x.len() / hidden;
        let eps = c.rms_eps as f32;
        let shape = DecoderHeads {
            heads: c.heads,
            kv_heads: c.kv_heads,
            head_dim: hd,
        };
        let gate = match c.activation {
            Activation::Silu => Gate::Silu,
            Activation::GeluTanh => Gate::GeluTanh,
        };
        let rope = match c.rope_layout {
            RopeLayout::Interleaved => decoder::rope_interleaved,
            RopeLayout::Halves => decoder::rope_halves,
        };
        // Each token's rotation, for global and (where they differ)
        // sliding-window layers.
        let positions = || {
            segments
                .iter()
                .flat_map(|s| s.cache.len..s.cache.len + s.tokens.len())
                .collect::<Vec<_>>()
                .into_iter()
        };
        let global = ropes.global.tables(positions());
        let local = ropes.local.as_ref().map(|l| l.tables(positions()));
        let mut h = vec![0f32; x.len()];
        let mut head = vec![0f32; hd];
        for (layer, block) in self.blocks.iter().enumerate() {
            let sliding = c.sliding_layers.get(layer).copied().unwrap_or(false);
            let (cos, sin) = match (&local, sliding) {
                (Some(l), true) => (&l.0, &l.1),
                _ => (&global.0, &global.1),
            };
            decoder::rms_norm(&x, &block.attn_norm, eps, &mut h);
            let mut qkv = block.qkv.matmul_on(team, &h, tokens);
            if let Some(bias) = &block.qkv_bias {
                for row in qkv.chunks_exact_mut(qkv_dim) {
                    add(row, bias);
                }
            }
            // Norm and rotate Q and K at each token's position; K and V go
            // into the sequence's cache, Q into the step's queries.
            let mut queries = vec![0f32; tokens * q_dim];
            let mut row = 0;
            for s in segments.iter_mut() {
                let (start, capacity) = (s.cache.len, s.cache.capacity);
                let KvLayers::Host(caches) = &mut s.cache.layers else {
                    return Err(ModelError::Failed(
                        "a KV cache made for the candle step in the host step".into(),
                    ));
                };
                let (keys, values) = &mut caches[layer];
                for pos in start..start + s.tokens.len() {
                    let angles = row * half..(row + 1) * half;
                    let (cos, sin) = (&cos[angles.clone()], &sin[angles]);
                    let (q, kv) = qkv[row * qkv_dim..(row + 1) * qkv_dim].split_at_mut(q_dim);
                    let (k, v) = kv.split_at_mut(kv_dim);
                    for qh in q.chunks_exact_mut(hd) {
                        if let Some(w) = &block.q_norm {
                            head.copy_from_slice(qh);
                            decoder::rms_norm(&head, w, eps, qh);
                        }
                        rope(qh, cos, sin);
                    }
                    for (g, (kh, vh)) in k.chunks_exact_mut(hd).zip(v.chunks_exact(hd)).enumerate()
                    {
                        if let Some(w) = &block.k_norm {
                            head.copy_from_slice(kh);
                            decoder::rms_norm(&head, w, eps, kh);
                        }
                        rope(kh, cos, sin);
                        let at = (g * capacity + pos) * hd;
                        keys[at..at + hd].copy_from_slice(kh);
                        values[at..at + hd].copy_from_slice(vh);
                    }
                    queries[row * q_dim..(row + 1) * q_dim].copy_from_slice(q);
                    row += 1;
                }
            }
            let mut row = 0;
            let mut sequences = Vec::with_capacity(segments.len());
            for s in segments.iter() {
                let KvLayers::Host(caches) = &s.cache.layers else {
                    return Err(ModelError::Failed(
                        "a KV cache made for the candle step in the host step".into(),
                    ));
                };
                let n = s.tokens.len();
                sequences.push(SequenceAttention {
                    queries: &queries[row * q_dim..(row + n) * q_dim],
                    keys: &caches[layer].0,
                    values: &caches[layer].1,
                    capacity: s.cache.capacity,
                    start: s.cache.len,
                });
                row += n;
            }
            let rule = AttentionRule {
                scale: Some(c.attention_scale),
                softcap: c.attention_softcap,
                window: if sliding { c.sliding_window } else { None },
            };
            let context = decoder::causal_attention_on(team, shape, rule, &sequences);
            let mut attn = block.o.matmul_on(team, &context, tokens);
            if let Some(bias) = &block.o_bias {
                for row in attn.chunks_exact_mut(hidden) {
                    add(row, bias);
                }
            }
            if let Some(w) = &block.attn_post_norm {
                decoder::rms_norm(&attn, w, eps, &mut h);
                std::mem::swap(&mut attn, &mut h);
            }
            add(&mut x, &attn);
            decoder::rms_norm(&x, &block.ffn_norm, eps, &mut h);
            let gate_up = block.gate_up.matmul_on(team, &h, tokens);
            let mut mlp =
                block
                    .down
                    .matmul_on(team, &decoder::gated(gate, &gate_up, c.ffn), tokens);
            if let Some(w) = &block.ffn_post_norm {
                decoder::rms_norm(&mlp, w, eps, &mut h);
                std::mem::swap(&mut mlp, &mut h);
            }
            add(&mut x, &mlp);
        }
        let mut last = Vec::with_capacity(segments.len() * hidden);
        let mut end = 0;
        for s in segments.iter() {
            end += s.tokens.len();
            last.extend_from_slice(&x[(end - 1) * hidden..end * hidden]);
        }
        Ok(last)
    }
}

/// `x += y`, elementwise (residuals, biases).
pub(crate) fn add(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}
