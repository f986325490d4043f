//! The f32 pieces of a decoder step on plain buffers, between the
//! quantized matrix products ([`crate::quantized`]): RMS norm, rotary
//! embeddings (interleaved pairs, or halves), causal attention of a
//! sequence's new tokens against its KV cache (grouped-query heads; a scale,
//! a soft cap and a sliding window where the family has them), and the
//! gated MLP product (SwiGLU, or tanh-GELU's GeGLU).
//!
//! They are plain Rust, built at `opt-level = 3` for every CPU (the compiler
//! vectorizes the inner loops for the baseline instruction set), except the
//! attention's per-head work, which runs `f32_kernels::decode_attend` at the
//! process's level where `head_dim` is a multiple of 32 and the scores take
//! no soft cap (it was 6-16% of an 8-sequence decode in plain Rust, growing
//! with the context), and the gated product, whose `exp` per value is a
//! vector polynomial there too. Each token's result depends on
//! its own row and its own sequence's cache only, so a token's logits do not
//! depend on the other sequences of its step (batch invariance).

use rayon::prelude::*;

use crate::encoder::F32Kernels;
use crate::scalar;
pub use crate::scalar::Gate;
/// One value of a gate's activation, `act(g)`, in plain Rust.
pub use crate::scalar::gated as gate_scalar;
use crate::team::{Team, parts_mut, take};

/// `out[t] = x[t] / sqrt(mean(x[t]^2) + eps) * weight` for each row `t` of
/// `x` (`[tokens, weight.len()]`).
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let dim = weight.len();
    assert_eq!(x.len(), out.len());
    for (row, dst) in x.chunks_exact(dim).zip(out.chunks_exact_mut(dim)) {
        let scale = 1.0 / (sum_squares(row) / dim as f32 + eps).sqrt();
        for ((d, v), w) in dst.iter_mut().zip(row).zip(weight) {
            *d = v * scale * w;
        }
    }
}

/// Sum of squares in eight interleaved partial sums (vectorizable).
fn sum_squares(x: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let chunks = x.chunks_exact(8);
    let rest = chunks.remainder();
    for c in chunks {
        for (a, v) in acc.iter_mut().zip(c) {
            *a += v * v;
        }
    }
    acc.iter().sum::<f32>() + rest.iter().map(|v| v * v).sum::<f32>()
}

/// `a . b` in eight interleaved partial sums (vectorizable).
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let rest: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    acc.iter().sum::<f32>() + rest
}

/// Rotary position embedding in the interleaved (pairwise) layout, in place
/// on one head's vector: pair `(x[2i], x[2i + 1])` turns by the angle whose
/// cosine and sine are `cos[i]` and `sin[i]` (candle's `rope_i`).
pub fn rope_interleaved(x: &mut [f32], cos: &[f32], sin: &[f32]) {
    for ((pair, c), s) in x.chunks_exact_mut(2).zip(cos).zip(sin) {
        let (a, b) = (pair[0], pair[1]);
        pair[0] = a * c - b * s;
        pair[1] = a * s + b * c;
    }
}

/// Rotary position embedding in the halves layout (GPT-NeoX's, Qwen's and
/// Gemma's), in place on one head's vector: pair `(x[i], x[i + d / 2])`
/// turns by the angle whose cosine and sine are `cos[i]` and `sin[i]`
/// (candle's `rope`).
pub fn rope_halves(x: &mut [f32], cos: &[f32], sin: &[f32]) {
    let (first, second) = x.split_at_mut(x.len() / 2);
    for (((a, b), c), s) in first.iter_mut().zip(second.iter_mut()).zip(cos).zip(sin) {
        let (x0, x1) = (*a, *b);
        *a = x0 * c - x1 * s;
        *b = x0 * s + x1 * c;
    }
}

/// `act(gate) * up` per row of `gate_up` (`[tokens, 2 * ffn]`, each row the
/// gate's `ffn` values then the up projection's), as `[tokens, ffn]`.
pub fn gated(act: Gate, gate_up: &[f32], ffn: usize) -> Vec<f32> {
    gated_with(F32Kernels::current(), act, gate_up, ffn)
}

/// [`gated`] at the level `kernels` (its vector `exp` at AVX2 and AVX-512,
/// `f32::exp` in the references).
pub fn gated_with(kernels: F32Kernels, act: Gate, gate_up: &[f32], ffn: usize) -> Vec<f32> {
    let mut out = vec![0f32; gate_up.len() / 2];
    for (row, out) in gate_up.chunks_exact(2 * ffn).zip(out.chunks_exact_mut(ffn)) {
        let (gate, up) = row.split_at(ffn);
        match kernels {
            F32Kernels::Avx512(t) => t.gated(act, gate, up, out),
            F32Kernels::Avx2(t) => t.gated(act, gate, up, out),
            F32Kernels::Reference => {
                for ((g, u), o) in gate.iter().zip(up).zip(out.iter_mut()) {
                    *o = scalar::gated(act, *g) * u;
                }
            }
        }
    }
    out
}

/// The shape of a decoder's attention.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecoderHeads {
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
}

/// How a layer's scores are made: `score = scale * q . k`, then `cap *
/// tanh(score / cap)` with a soft cap; with a window, a query at position
/// `p` sees only keys at `p - window + 1 ..= p`.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct AttentionRule {
    /// `None`: `1 / sqrt(head_dim)`.
    pub scale: Option<f32>,
    pub softcap: Option<f32>,
    pub window: Option<usize>,
}

/// One sequence's part in a step's attention: its queries, its cache, and
/// where its new tokens go.
pub struct SequenceAttention<'a> {
    /// Queries of the sequence's new tokens, `[tokens, heads * head_dim]`,
    /// rotated already.
    pub queries: &'a [f32],
    /// The sequence's keys and values for this layer, each `[kv_heads,
    /// capacity, head_dim]`, holding the new tokens already.
    pub keys: &'a [f32],
    pub values: &'a [f32],
    pub capacity: usize,
    /// Position of the first new token (the tokens cached before it).
    pub start: usize,
}

/// Causal attention for every sequence of a step: token `i` of a sequence
/// (at position `start + i`) attends to the sequence's positions up to its
/// own. Returns the contexts, `[all new tokens, heads * head_dim]`, in the
/// sequences' order. The (token, head) items run on the rayon pool when a
/// step has enough of them to pay for the hand-off.
pub fn causal_attention(
    shape: DecoderHeads,
    rule: AttentionRule,
    sequences: &[SequenceAttention<'_>],
) -> Vec<f32> {
    causal_attention_with(F32Kernels::current(), shape, rule, sequences)
}

/// [`causal_attention`] at the level `kernels` (the plain-Rust reference
/// where `head_dim` is not a multiple of 32).
pub fn causal_attention_with(
    kernels: F32Kernels,
    shape: DecoderHeads,
    rule: AttentionRule,
    sequences: &[SequenceAttention<'_>],
) -> Vec<f32> {
    let scored: usize = sequences
        .iter()
        .map(|seq| {
            let tokens = seq.queries.len() / (shape.heads * shape.head_dim).max(1);
            (0..tokens).map(|i| seq.start + i + 1).sum::<usize>()
        })
        .sum();
    // About 4 * head_dim flops per (head, position) scored.
    let parts = if scored * shape.heads * shape.head_dim * 4 >= 1 << 18 {
        rayon::current_num_threads().max(1)
    } else {
        1
    };
    attention_in_parts(kernels, shape, rule, sequences, parts, |part| {
        (0..parts).into_par_iter().for_each(part)
    })
}

/// [`causal_attention`] with the (token, head) items shared among `team`'s
/// members.
pub fn causal_attention_on(
    team: &Team,
    shape: DecoderHeads,
    rule: AttentionRule,
    sequences: &[SequenceAttention<'_>],
) -> Vec<f32> {
    let kernels = F32Kernels::current();
    attention_in_parts(kernels, shape, rule, sequences, team.size(), |part| {
        team.run(part)
    })
}

/// The attention in `parts` runs of consecutive (token, head) items of
/// about equal cost (the positions each attends to), each writing its own
/// contiguous part of the output; `run_parts` calls the part's closure once
/// for each of `0..parts`.
fn attention_in_parts(
    kernels: F32Kernels,
    shape: DecoderHeads,
    rule: AttentionRule,
    sequences: &[SequenceAttention<'_>],
    parts: usize,
    run_parts: impl FnOnce(&(dyn Fn(usize) + Sync)),
) -> Vec<f32> {
    let DecoderHeads {
        heads,
        kv_heads,
        head_dim,
    } = shape;
    assert!(kv_heads > 0 && heads.is_multiple_of(kv_heads));
    let width = heads * head_dim;
    // (sequence, token, head) in output order, and the running cost.
    let mut items = Vec::new();
    let mut cost = Vec::new();
    let mut total = 0usize;
    for (s, seq) in sequences.iter().enumerate() {
        let tokens = seq.queries.len() / width;
        assert_eq!(seq.queries.len(), tokens * width);
        assert!(seq.start + tokens <= seq.capacity);
        assert_eq!(seq.keys.len(), kv_heads * seq.capacity * head_dim);
        assert_eq!(seq.values.len(), seq.keys.len());
        for i in 0..tokens {
            for h in 0..heads {
                items.push((s, i, h));
                total += seq.start + i + 1;
                cost.push(total);
            }
        }
    }
    // Part p ends at the first item whose running cost reaches (p + 1) /
    // parts of the total.
    let mut bounds = vec![0usize];
    for p in 1..parts {
        let target = total * p / parts;
        bounds.push(cost.partition_point(|c| *c <= target).max(bounds[p - 1]));
    }
    bounds.push(items.len());
    let mut out = vec![0f32; items.len() * head_dim];
    // The kernels scale by 1 / sqrt(head_dim): another scale is folded
    // into the query.
    let standard = 1.0 / (head_dim as f32).sqrt();
    let rescale = rule.scale.filter(|s| *s != standard).map(|s| s / standard);
    let simd = head_dim.is_multiple_of(32) && rule.softcap.is_none();
    let outs = parts_mut(
        &mut out,
        bounds.windows(2).map(|w| (w[1] - w[0]) * head_dim),
    );
    run_parts(&|part| {
        let mut ctx = take(&outs[part]);
        let mut scores = Vec::new();
        let mut scaled = vec![0f32; head_dim];
        let mine = &items[bounds[part]..bounds[part + 1]];
        for (&(s, i, h), ctx) in mine.iter().zip(ctx.chunks_exact_mut(head_dim)) {
            let seq = &sequences[s];
            let len = seq.start + i + 1;
            let first = rule.window.map_or(0, |w| len.saturating_sub(w));
            let g = h / (heads / kv_heads);
            let cached = (g * seq.capacity + first) * head_dim..(g * seq.capacity + len) * head_dim;
            let mut q = &seq.queries[i * width + h * head_dim..i * width + (h + 1) * head_dim];
            if let Some(r) = rescale {
                for (d, v) in scaled.iter_mut().zip(q) {
                    *d = v * r;
                }
                q = &scaled;
            }
            let (keys, values) = (&seq.keys[cached.clone()], &seq.values[cached]);
            match kernels {
                F32Kernels::Avx512(t) if simd => t.decode_attend(q, keys, values, &mut scores, ctx),
                F32Kernels::Avx2(t) if simd => t.decode_attend(q, keys, values, &mut scores, ctx),
                _ => attend(q, keys, values, rule.softcap, &mut scores, ctx),
            }
        }
    });
    drop(outs);
    out
}

/// One query head against `keys` and `values` (`[len, head_dim]` each):
/// `out = softmax(cap(q . k / sqrt(head_dim))) v`, in plain Rust (the
/// reference of `f32_kernels::decode_attend`, and the path of soft-capped
/// scores).
fn attend(
    q: &[f32],
    keys: &[f32],
    values: &[f32],
    softcap: Option<f32>,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    let dim = q.len();
    let scale = 1.0 / (dim as f32).sqrt();
    scores.clear();
    scores.extend(keys.chunks_exact(dim).map(|k| {
        let score = dot(q, k) * scale;
        match softcap {
            Some(cap) => cap * (score / cap).tanh(),
            None => score,
        }
    }));
    let max = scores.iter().fold(f32::NEG_INFINITY, |m, v| m.max(*v));
    let mut sum = 0f32;
    for v in scores.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    let inv = 1.0 / sum;
    out.fill(0.0);
    for (p, v) in scores.iter().zip(values.chunks_exact(dim)) {
        let p = p * inv;
        for (o, x) in out.iter_mut().zip(v) {
            *o += p * x;
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::test_values::values;

    #[test]
    fn rms_norm_scales_each_row_to_unit_rms() {
        let x = values(3 * 40, 1);
        let w: Vec<f32> = (0..40).map(|i| 0.5 + i as f32 / 40.0).collect();
        let mut out = vec![0f32; x.len()];
        rms_norm(&x, &w, 1e-5, &mut out);
        for (row, o) in x.chunks(40).zip(out.chunks(40)) {
            let ms: f64 = row.iter().map(|v| f64::from(*v).powi(2)).sum::<f64>() / 40.0;
            let s = 1.0 / (ms + 1e-5).sqrt();
            for j in 0..40 {
                let want = f64::from(row[j]) * s * f64::from(w[j]);
                assert!((f64::from(o[j]) - want).abs() < 1e-5, "{} vs {want}", o[j]);
            }
        }
    }

    #[test]
    fn rope_turns_pairs_and_keeps_their_length() {
        let mut x = vec![1.0, 0.0, 3.0, 4.0];
        let (c, s) = (std::f32::consts::FRAC_PI_2.cos(), 1f32);
        rope_interleaved(&mut x, &[c, 1.0], &[s, 0.0]);
        assert!((x[0] - c).abs() < 1e-6 && (x[1] - 1.0).abs() < 1e-6);
        assert_eq!(&x[2..], &[3.0, 4.0]);
    }

    #[test]
    fn the_gated_product_is_the_same_at_every_level() {
        let ffn = 40; // two 16-lane vectors and a tail
        let gate_up: Vec<f32> = values(3 * 2 * ffn, 11).iter().map(|v| v * 30.0).collect();
        for act in [Gate::Silu, Gate::GeluTanh] {
            let plain = gated_with(F32Kernels::Reference, act, &gate_up, ffn);
            for kernels in F32Kernels::all() {
                let got = gated_with(kernels, act, &gate_up, ffn);
                for (i, (g, p)) in got.iter().zip(&plain).enumerate() {
                    assert!(
                        (g - p).abs() <= 1e-6 * (1.0 + p.abs()),
                        "{act:?}, {} [{i}]: {g} vs {p}",
                        kernels.name()
                    );
                }
            }
        }
    }

    /// SiLU, and tanh's GELU against its textbook form.
    #[test]
    fn each_gate_is_its_activation_of_gate_times_up() {
        let gu = vec![0.0, 2.0, 5.0, 3.0];
        let out = gated(Gate::Silu, &gu, 2);
        assert_eq!(out[0], 0.0);
        let silu2 = 2.0 / (1.0 + (-2f32).exp());
        assert!((out[1] - silu2 * 3.0).abs() < 1e-6);
        for g in [-6.0f32, -1.5, -0.3, 0.0, 0.7, 2.0, 9.0] {
            let got = gated(Gate::GeluTanh, &[g, 1.0], 1)[0];
            let u = (2.0f64 / std::f64::consts::PI).sqrt()
                * (f64::from(g) + 0.044715 * f64::from(g).powi(3));
            let want = 0.5 * f64::from(g) * (1.0 + u.tanh());
            assert!(
                (f64::from(got) - want).abs() < 1e-5 * (1.0 + want.abs()),
                "{g}: {got} vs {want}"
            );
        }
    }

    #[test]
    fn rope_halves_turns_the_pairs_half_a_head_apart() {
        let mut x = vec![1.0, 3.0, 0.0, 4.0];
        let (c, s) = (std::f32::consts::FRAC_PI_2.cos(), 1f32);
        rope_halves(&mut x, &[c, 1.0], &[s, 0.0]);
        // (x0, x2) = (1, 0) turned a quarter: (0, 1); (x1, x3) kept.
        assert!((x[0] - c).abs() < 1e-6 && (x[2] - 1.0).abs() < 1e-6);
        assert_eq!((x[1], x[3]), (3.0, 4.0));
    }

    /// Against a plain softmax in f64, for a prompt chunk after a cached
    /// prefix, beside a one-token sequence, large enough to run in parallel
    /// and small enough not to; each sequence's contexts are the same
    /// whichever sequences share its step.
    #[test]
    fn causal_attention_matches_the_plain_softmax_per_sequence() {
        let rules = [
            AttentionRule::default(),
            // Another scale and a window shorter than the chunk (the SIMD
            // path at 64), and a soft cap (always the plain-Rust path).
            AttentionRule {
                scale: Some(0.3),
                softcap: None,
                window: Some(7),
            },
            AttentionRule {
                scale: None,
                softcap: Some(2.0),
                window: None,
            },
        ];
        // 16: the plain-Rust path; 64: the SIMD one at this process's level.
        for hd in [16, 64] {
            for rule in rules {
                causal_attention_matches_at(hd, rule);
            }
        }
    }

    /// Every level's per-head kernel against the plain-Rust one, at context
    /// lengths on and off the vector width.
    #[test]
    fn decode_attention_is_the_same_at_every_level() {
        let shape = DecoderHeads {
            heads: 4,
            kv_heads: 2,
            head_dim: 64,
        };
        let cap = 70;
        let keys = values(2 * cap * 64, 7);
        let vals = values(2 * cap * 64, 8);
        for (start, tokens) in [(0, 1), (0, 17), (31, 3), (40, 30)] {
            let queries: Vec<f32> = values(tokens * 4 * 64, 9).iter().map(|v| v * 3.0).collect();
            let seq = || SequenceAttention {
                queries: &queries,
                keys: &keys,
                values: &vals,
                capacity: cap,
                start,
            };
            let rule = AttentionRule::default();
            let plain = causal_attention_with(F32Kernels::Reference, shape, rule, &[seq()]);
            for kernels in F32Kernels::all() {
                let got = causal_attention_with(kernels, shape, rule, &[seq()]);
                for (g, p) in got.iter().zip(&plain) {
                    assert!(
                        (g - p).abs() <= 1e-5,
                        "{} start {start} tokens {tokens}: {g} vs {p}",
                        kernels.name()
                    );
                }
            }
        }
    }

    fn causal_attention_matches_at(hd: usize, rule: AttentionRule) {
        let shape = DecoderHeads {
            heads: 6,
            kv_heads: 2,
            head_dim: hd,
        };
        let width = 6 * hd;
        for (cap, start, tokens) in [(12, 3, 5), (300, 20, 200)] {
            let keys = values(2 * cap * hd, 2);
            let vals = values(2 * cap * hd, 3);
            let queries = values(tokens * width, 4);
            let other_q = values(width, 5);
            let a = SequenceAttention {
                queries: &queries,
                keys: &keys,
                values: &vals,
                capacity: cap,
                start,
            };
            let b = SequenceAttention {
                queries: &other_q,
                keys: &keys,
                values: &vals,
                capacity: cap,
                start: 0,
            };
            let both = causal_attention(shape, rule, &[a, b]);
            let alone = causal_attention(
                shape,
                rule,
                &[SequenceAttention {
                    queries: &queries,
                    keys: &keys,
                    values: &vals,
                    capacity: cap,
                    start,
                }],
            );
            assert_eq!(&both[..tokens * width], &alone[..]);
            // Any team's split of the items gives the same bits.
            for size in 1..=3 {
                let team = Team::new(size).unwrap();
                let seqs = [
                    SequenceAttention {
                        queries: &queries,
                        keys: &keys,
                        values: &vals,
                        capacity: cap,
                        start,
                    },
                    SequenceAttention {
                        queries: &other_q,
                        keys: &keys,
                        values: &vals,
                        capacity: cap,
                        start: 0,
                    },
                ];
                assert_eq!(
                    causal_attention_on(&team, shape, rule, &seqs),
                    both,
                    "team of {size}"
                );
            }
            // The one-token sequence at position 0 sees only its own value.
            for h in 0..6 {
                let g = h / 3;
                let v0 = &vals[g * cap * hd..g * cap * hd + hd];
                let got = &both[tokens * width + h * hd..tokens * width + (h + 1) * hd];
                for (x, y) in got.iter().zip(v0) {
                    assert!((x - y).abs() < 1e-6);
                }
            }
            for i in 0..tokens {
                for h in 0..6 {
                    let g = h / 3;
                    let q = &queries[i * width + h * hd..i * width + (h + 1) * hd];
                    let len = start + i + 1;
                    let first = rule.window.map_or(0, |w| len.saturating_sub(w));
                    let scale = rule.scale.map_or(1.0 / (hd as f64).sqrt(), f64::from);
                    let s: Vec<f64> = (first..len)
                        .map(|j| {
                            let k = &keys[(g * cap + j) * hd..(g * cap + j + 1) * hd];
                            let dot = q
                                .iter()
                                .zip(k)
                                .map(|(a, b)| f64::from(*a) * f64::from(*b))
                                .sum::<f64>();
                            match rule.softcap {
                                Some(c) => f64::from(c) * (dot * scale / f64::from(c)).tanh(),
                                None => dot * scale,
                            }
                        })
                        .collect();
                    let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let e: Vec<f64> = s.iter().map(|v| (v - m).exp()).collect();
                    let z: f64 = e.iter().sum();
                    for d in 0..hd {
                        let want: f64 = (first..len)
                            .map(|j| e[j - first] / z * f64::from(vals[(g * cap + j) * hd + d]))
                            .sum();
                        let got = f64::from(both[i * width + h * hd + d]);
                        assert!((got - want).abs() < 1e-5, "{got} vs {want}");
                    }
                }
            }
        }
    }
}
