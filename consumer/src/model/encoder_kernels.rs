//! f32 kernels for the CPU encoder (`bert.rs`) on x86-64 with AVX2 + FMA:
//!
//! - [`PackedLinear`]: `y = x W^T + b`, a blocked matrix product (6 x 16
//!   register tiles, the weights packed at load into 16-column panels, the
//!   activations packed per 72 x 256 block so both stay in cache), rows split
//!   across the rayon pool. candle's f32 matmul reached 55-63 GFLOP/s on these
//!   cores for the encoder's shapes, MKL about 125-157; this is what closes
//!   that gap.
//! - [`attention`]: softmax attention per sequence and head over the
//!   sequence's own tokens (no padding), one block of 4 queries at a time, so
//!   no `[heads, len, len]` score tensor is ever materialized.
//! - [`gelu`]: the erf GELU of BERT, vectorized.
//!
//! Like `qmatmul.rs`, this module has `unsafe`: calls into
//! `#[target_feature]` functions after the CPU was checked at run time, and
//! the transmutes between `[f32; 8]` and `__m256` (no raw pointers). Each kernel has a plain-Rust
//! reference of the same arithmetic, which runs on other CPUs and which the
//! tests hold the SIMD code to.
#![allow(unsafe_code)]

use rayon::prelude::*;

/// Rows of a register tile.
const MR: usize = 6;
/// Columns of a register tile (two AVX vectors).
const NR: usize = 16;
/// Depth of a packed block: an `MR x KC` slice of activations and a
/// `KC x NR` slice of weights together fit the 32 KiB L1 cache.
const KC: usize = 256;
/// Rows of a packed activation block (kept in L2 across all weight panels).
const MC: usize = 72;

/// Whether this CPU runs the SIMD kernels.
pub fn available() -> bool {
    super::qmatmul::available()
}

/// A linear layer's weights `[outputs, inputs]` (PyTorch's layout) and bias,
/// packed for [`PackedLinear::forward`]: panels of 16 outputs, each stored
/// input-major (`inputs x 16`), the last panel padded with zeros.
pub struct PackedLinear {
    inputs: usize,
    outputs: usize,
    panels: Vec<f32>,
    bias: Vec<f32>,
}

impl PackedLinear {
    pub fn new(
        weight: &[f32],
        outputs: usize,
        inputs: usize,
        bias: Option<&[f32]>,
    ) -> PackedLinear {
        assert_eq!(weight.len(), outputs * inputs, "weight shape");
        let count = outputs.div_ceil(NR);
        let mut panels = vec![0f32; count * inputs * NR];
        for (o, row) in weight.chunks_exact(inputs).enumerate() {
            let (panel, lane) = (o / NR, o % NR);
            for (k, w) in row.iter().enumerate() {
                panels[(panel * inputs + k) * NR + lane] = *w;
            }
        }
        let mut padded_bias = vec![0f32; count * NR];
        if let Some(bias) = bias {
            assert_eq!(bias.len(), outputs, "bias shape");
            padded_bias[..outputs].copy_from_slice(bias);
        }
        PackedLinear {
            inputs,
            outputs,
            panels,
            bias: padded_bias,
        }
    }

    pub fn inputs(&self) -> usize {
        self.inputs
    }

    pub fn outputs(&self) -> usize {
        self.outputs
    }

    fn weight(&self, output: usize, input: usize) -> f32 {
        self.panels[((output / NR) * self.inputs + input) * NR + output % NR]
    }

    /// `x` is `[rows, inputs]` row-major; returns `[rows, outputs]`.
    pub fn forward(&self, x: &[f32], rows: usize) -> Vec<f32> {
        assert_eq!(x.len(), rows * self.inputs, "input shape");
        let mut out = vec![0f32; rows * self.outputs];
        if rows == 0 {
            return out;
        }
        let simd = available();
        let threads = rayon::current_num_threads().max(1);
        let per_task = rows.div_ceil(threads).next_multiple_of(MR);
        out.par_chunks_mut(per_task * self.outputs)
            .zip(x.par_chunks(per_task * self.inputs))
            .for_each(|(out, x)| {
                if simd {
                    #[cfg(target_arch = "x86_64")]
                    // SAFETY: `available()` checked that the CPU has AVX2 and FMA.
                    unsafe {
                        avx2::linear(self, x, out)
                    };
                } else {
                    self.reference_rows(x, out);
                }
            });
        out
    }

    /// The product in plain Rust (each output summed over inputs in order,
    /// after the bias).
    pub fn reference(&self, x: &[f32], rows: usize) -> Vec<f32> {
        assert_eq!(x.len(), rows * self.inputs, "input shape");
        let mut out = vec![0f32; rows * self.outputs];
        self.reference_rows(x, &mut out);
        out
    }

    fn reference_rows(&self, x: &[f32], out: &mut [f32]) {
        for (x, y) in x
            .chunks_exact(self.inputs)
            .zip(out.chunks_exact_mut(self.outputs))
        {
            for (o, y) in y.iter_mut().enumerate() {
                let mut acc = self.bias[o];
                for (k, v) in x.iter().enumerate() {
                    acc = v.mul_add(self.weight(o, k), acc);
                }
                *y = acc;
            }
        }
    }
}

/// Where one sequence's tokens are in a packed batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    pub start: usize,
    pub len: usize,
}

/// The shape of multi-head attention over rows of `[q | k | v]`.
#[derive(Clone, Copy, Debug)]
pub struct Heads {
    pub heads: usize,
    pub head_dim: usize,
}

impl Heads {
    fn hidden(&self) -> usize {
        self.heads * self.head_dim
    }
}

/// Scaled dot-product attention within each span. `qkv` is `[tokens, 3 *
/// hidden]` (each row the token's queries, keys and values, head-major);
/// returns the context `[tokens, hidden]`. Spans must not overlap and must
/// cover the tokens in order.
pub fn attention(qkv: &[f32], spans: &[Span], shape: Heads) -> Vec<f32> {
    let hidden = shape.hidden();
    let tokens: usize = spans.iter().map(|s| s.len).sum();
    assert_eq!(qkv.len(), tokens * 3 * hidden, "qkv shape");
    let mut out = vec![0f32; tokens * hidden];
    let simd = available() && shape.head_dim.is_multiple_of(32);
    // One task per sequence: its rows of the output are contiguous.
    let mut tasks = Vec::with_capacity(spans.len());
    let mut rest = out.as_mut_slice();
    let mut next = 0;
    for span in spans {
        assert_eq!(span.start, next, "spans must cover the tokens in order");
        next += span.len;
        let (mine, tail) = rest.split_at_mut(span.len * hidden);
        tasks.push((*span, mine));
        rest = tail;
    }
    tasks.into_par_iter().for_each(|(span, out)| {
        let rows = &qkv[span.start * 3 * hidden..(span.start + span.len) * 3 * hidden];
        if simd {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `available()` checked that the CPU has AVX2 and FMA.
            unsafe {
                avx2::attend(rows, span.len, shape, out)
            };
        } else {
            reference_attend(rows, span.len, shape, out);
        }
    });
    out
}

/// One sequence's attention in plain Rust.
fn reference_attend(qkv: &[f32], len: usize, shape: Heads, out: &mut [f32]) {
    let (hidden, hd) = (shape.hidden(), shape.head_dim);
    let scale = 1.0 / (hd as f32).sqrt();
    let at = |t: usize, part: usize, h: usize| {
        let base = t * 3 * hidden + part * hidden + h * hd;
        &qkv[base..base + hd]
    };
    let mut scores = vec![0f32; len];
    for h in 0..shape.heads {
        for i in 0..len {
            let q = at(i, 0, h);
            for (j, s) in scores.iter_mut().enumerate() {
                *s = q.iter().zip(at(j, 1, h)).map(|(a, b)| a * b).sum::<f32>() * scale;
            }
            let max = scores.iter().fold(f32::NEG_INFINITY, |m, s| m.max(*s));
            let mut sum = 0f32;
            for s in scores.iter_mut() {
                *s = (*s - max).exp();
                sum += *s;
            }
            let ctx = &mut out[i * hidden + h * hd..i * hidden + (h + 1) * hd];
            ctx.fill(0.0);
            for (j, p) in scores.iter().enumerate() {
                for (c, v) in ctx.iter_mut().zip(at(j, 2, h)) {
                    *c += p / sum * v;
                }
            }
        }
    }
}

/// `x * Phi(x)` (BERT's "gelu"), in place.
pub fn gelu(x: &mut [f32]) {
    let simd = available();
    x.par_chunks_mut(16 * 1024).for_each(|chunk| {
        if simd {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `available()` checked that the CPU has AVX2 and FMA.
            unsafe {
                avx2::gelu(chunk)
            };
        } else {
            chunk.iter_mut().for_each(|v| *v = gelu_scalar(*v));
        }
    });
}

/// Coefficients of erf's rational approximation (Abramowitz and Stegun
/// 7.1.26, absolute error below 1.5e-7).
const ERF_P: f32 = 0.327_591_1;
const ERF_A: [f32; 5] = [
    0.254_829_6,
    -0.284_496_74,
    1.421_413_7,
    -1.453_152_1,
    1.061_405_4,
];

/// The erf GELU with the approximation the SIMD kernel uses.
pub fn gelu_scalar(x: f32) -> f32 {
    let z = (x * std::f32::consts::FRAC_1_SQRT_2).abs();
    let t = 1.0 / (1.0 + ERF_P * z);
    let poly = ERF_A.iter().rev().fold(0f32, |acc, a| acc * t + a) * t;
    let erf = 1.0 - poly * (-z * z).exp();
    0.5 * x * (1.0 + erf.copysign(x))
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use super::{ERF_A, ERF_P, Heads, KC, MC, MR, NR, PackedLinear};

    // Vectors are read from and written to `[f32; 8]` arrays, never through
    // raw pointers: std's `_mm256_loadu_ps` copies through a range-checked
    // `copy_nonoverlapping` in debug-assertion builds (the tests and
    // benchmarks build those), which spilled every load to the stack.

    #[target_feature(enable = "avx2,fma")]
    #[inline]
    fn load(x: &[f32; 8]) -> __m256 {
        // SAFETY: `[f32; 8]` and `__m256` have the same size, and every bit
        // pattern is valid for both.
        unsafe { std::mem::transmute::<[f32; 8], __m256>(*x) }
    }

    #[target_feature(enable = "avx2,fma")]
    #[inline]
    fn store(x: &mut [f32; 8], v: __m256) {
        // SAFETY: as in `load`.
        *x = unsafe { std::mem::transmute::<__m256, [f32; 8]>(v) };
    }

    /// The 8 values of `x` from `at`.
    #[inline]
    fn eight(x: &[f32], at: usize) -> &[f32; 8] {
        &x[at..at + 8].as_chunks::<8>().0[0]
    }

    #[inline]
    fn eight_mut(x: &mut [f32], at: usize) -> &mut [f32; 8] {
        &mut x[at..at + 8].as_chunks_mut::<8>().0[0]
    }

    /// `out = x W^T + b` for the rows of `x` (`[rows, inputs]`).
    ///
    /// # Safety
    /// The CPU must support AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn linear(w: &PackedLinear, x: &[f32], out: &mut [f32]) {
        let (inputs, outputs) = (w.inputs, w.outputs);
        let rows = x.len() / inputs;
        assert_eq!(x.len(), rows * inputs);
        assert_eq!(out.len(), rows * outputs);
        let panels = outputs.div_ceil(NR);
        let mut packed = vec![0f32; MC * KC];
        let mut k0 = 0;
        while k0 < inputs {
            let kc = KC.min(inputs - k0);
            let first = k0 == 0;
            let mut i0 = 0;
            while i0 < rows {
                let mc = MC.min(rows - i0);
                let row_panels = mc.div_ceil(MR);
                pack_rows(x, inputs, i0, rows, k0, kc, row_panels, &mut packed);
                for panel in 0..panels {
                    let b = &w.panels[(panel * inputs + k0) * NR..(panel * inputs + k0 + kc) * NR];
                    let bias = &w.bias[panel * NR..(panel + 1) * NR];
                    let cols = NR.min(outputs - panel * NR);
                    for p in 0..row_panels {
                        let r0 = i0 + p * MR;
                        let tile_rows = MR.min(rows - r0);
                        let a = &packed[p * kc * MR..(p + 1) * kc * MR];
                        let at = r0 * outputs + panel * NR;
                        if tile_rows == MR && cols == NR {
                            let c = &mut out[at..at + (MR - 1) * outputs + NR];
                            tile(a, b, c, outputs, first, bias);
                        } else {
                            // An edge tile: run the full tile on a copy.
                            let mut c = [0f32; MR * NR];
                            for r in 0..tile_rows {
                                let src = &out[at + r * outputs..at + r * outputs + cols];
                                c[r * NR..r * NR + cols].copy_from_slice(src);
                            }
                            tile(a, b, &mut c, NR, first, bias);
                            for r in 0..tile_rows {
                                let dst = &mut out[at + r * outputs..at + r * outputs + cols];
                                dst.copy_from_slice(&c[r * NR..r * NR + cols]);
                            }
                        }
                    }
                }
                i0 += mc;
            }
            k0 += kc;
        }
    }

    /// Packs rows `i0..` (up to `row_panels * MR`, zeros past `rows`) and
    /// columns `k0..k0 + kc` of `x` into `MR`-row panels, column-major within
    /// each panel.
    #[allow(clippy::too_many_arguments)]
    fn pack_rows(
        x: &[f32],
        inputs: usize,
        i0: usize,
        rows: usize,
        k0: usize,
        kc: usize,
        row_panels: usize,
        packed: &mut [f32],
    ) {
        for p in 0..row_panels {
            let (panel, _) = packed[p * kc * MR..(p + 1) * kc * MR].as_chunks_mut::<MR>();
            for r in 0..MR {
                let row = i0 + p * MR + r;
                if row < rows {
                    let src = &x[row * inputs + k0..row * inputs + k0 + kc];
                    for (step, v) in panel.iter_mut().zip(src) {
                        step[r] = *v;
                    }
                } else {
                    panel.iter_mut().for_each(|step| step[r] = 0.0);
                }
            }
        }
    }

    /// One `MR x NR` tile: `c (+)= a b`, starting from the bias when `first`.
    /// `a` is `kc x MR`, `b` is `kc x NR`, `c` has rows `ldc` apart.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    fn tile(a: &[f32], b: &[f32], c: &mut [f32], ldc: usize, first: bool, bias: &[f32]) {
        let (a_steps, _) = a.as_chunks::<MR>();
        let (b_steps, _) = b.as_chunks::<NR>();
        assert_eq!(a_steps.len(), b_steps.len());
        // Twelve named accumulators: the loop keeps each in a register.
        let z = _mm256_setzero_ps();
        let (mut c00, mut c01, mut c10, mut c11, mut c20, mut c21) = (z, z, z, z, z, z);
        let (mut c30, mut c31, mut c40, mut c41, mut c50, mut c51) = (z, z, z, z, z, z);
        for (ak, bk) in a_steps.iter().zip(b_steps) {
            let (b0, b1) = (load(eight(bk, 0)), load(eight(bk, 8)));
            macro_rules! row {
                ($r:expr, $lo:ident, $hi:ident) => {
                    let v = _mm256_set1_ps(ak[$r]);
                    $lo = _mm256_fmadd_ps(v, b0, $lo);
                    $hi = _mm256_fmadd_ps(v, b1, $hi);
                };
            }
            row!(0, c00, c01);
            row!(1, c10, c11);
            row!(2, c20, c21);
            row!(3, c30, c31);
            row!(4, c40, c41);
            row!(5, c50, c51);
        }
        let acc = [
            [c00, c01],
            [c10, c11],
            [c20, c21],
            [c30, c31],
            [c40, c41],
            [c50, c51],
        ];
        for (r, acc) in acc.iter().enumerate() {
            let row = &mut c[r * ldc..r * ldc + NR];
            let (lo, hi) = if first {
                (load(eight(bias, 0)), load(eight(bias, 8)))
            } else {
                (load(eight(row, 0)), load(eight(row, 8)))
            };
            store(eight_mut(row, 0), _mm256_add_ps(lo, acc[0]));
            store(eight_mut(row, 8), _mm256_add_ps(hi, acc[1]));
        }
    }

    /// One sequence's attention over its `len` rows of `qkv`, into `out`
    /// (`[len, hidden]`). `head_dim` must be a multiple of 32.
    ///
    /// # Safety
    /// The CPU must support AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn attend(qkv: &[f32], len: usize, shape: Heads, out: &mut [f32]) {
        let (hidden, hd) = (shape.hidden(), shape.head_dim);
        assert!(hd.is_multiple_of(32));
        assert_eq!(qkv.len(), len * 3 * hidden);
        assert_eq!(out.len(), len * hidden);
        // Per head: queries in blocks of 4, stored dimension-major per block
        // (`[block][d][4]`, zeros past the end); keys in blocks of 16, also
        // dimension-major (`[block][d][16]`, zeros past the end, masked out
        // of the softmax); values row-major. All heads are gathered in one
        // pass over `qkv` (which can outgrow L2), then each head's share is
        // contiguous.
        let (lq, lk) = (len.next_multiple_of(4), len.next_multiple_of(16));
        let scale = 1.0 / (hd as f32).sqrt();
        let mut q_heads = vec![0f32; shape.heads * lq * hd];
        let mut k_heads = vec![0f32; shape.heads * lk * hd];
        let mut v_heads = vec![0f32; shape.heads * len * hd];
        let mut scores = vec![0f32; 4 * lk];
        for (t, row) in qkv.chunks_exact(3 * hidden).enumerate() {
            let (q_row, rest) = row.split_at(hidden);
            let (k_row, v_row) = rest.split_at(hidden);
            for h in 0..shape.heads {
                let at = h * lq * hd + (t / 4) * 4 * hd + t % 4;
                for (d, src) in q_row[h * hd..(h + 1) * hd].iter().enumerate() {
                    q_heads[at + d * 4] = src * scale;
                }
                let at = h * lk * hd + (t / 16) * 16 * hd + t % 16;
                for (d, src) in k_row[h * hd..(h + 1) * hd].iter().enumerate() {
                    k_heads[at + d * 16] = *src;
                }
                let at = (h * len + t) * hd;
                v_heads[at..at + hd].copy_from_slice(&v_row[h * hd..(h + 1) * hd]);
            }
        }
        for h in 0..shape.heads {
            let q = &q_heads[h * lq * hd..(h + 1) * lq * hd];
            let k = &k_heads[h * lk * hd..(h + 1) * lk * hd];
            let v = &v_heads[h * len * hd..(h + 1) * len * hd];
            for (block, q_block) in q.chunks_exact(4 * hd).enumerate() {
                let i0 = block * 4;
                query_scores(q_block, k, lk, &mut scores);
                let mut inv_sums = [0f32; 4];
                for (r, row) in scores.chunks_exact_mut(lk).enumerate() {
                    inv_sums[r] = 1.0 / softmax_unnormalized(&mut row[..len]);
                }
                for pair in 0..2 {
                    let r = 2 * pair;
                    let rows_left = len.saturating_sub(i0 + r).min(2);
                    if rows_left == 0 {
                        break;
                    }
                    let probs = (
                        &scores[r * lk..r * lk + len],
                        &scores[(r + 1) * lk..(r + 1) * lk + len],
                    );
                    let at = (i0 + r) * hidden + h * hd;
                    let dst = &mut out[at..at + (rows_left - 1) * hidden + hd];
                    weighted_values(
                        probs,
                        v,
                        hd,
                        [inv_sums[r], inv_sums[r + 1]],
                        dst,
                        hidden,
                        rows_left,
                    );
                }
            }
        }
    }

    /// Scores of one block of 4 queries (`q`, `[d][4]`, already scaled)
    /// against every key (`k`, `[block][d][16]`), into `scores` (`4 x lk`).
    #[target_feature(enable = "avx2,fma")]
    fn query_scores(q: &[f32], k: &[f32], lk: usize, scores: &mut [f32]) {
        let (q_steps, _) = q.as_chunks::<4>();
        let hd = q_steps.len();
        let (k_steps, _) = k.as_chunks::<16>();
        for (block, k_block) in k_steps.chunks_exact(hd).enumerate() {
            let z = _mm256_setzero_ps();
            let (mut s00, mut s01, mut s10, mut s11) = (z, z, z, z);
            let (mut s20, mut s21, mut s30, mut s31) = (z, z, z, z);
            for (qd, kd) in q_steps.iter().zip(k_block) {
                let (k0, k1) = (load(eight(kd, 0)), load(eight(kd, 8)));
                macro_rules! row {
                    ($r:expr, $lo:ident, $hi:ident) => {
                        let v = _mm256_set1_ps(qd[$r]);
                        $lo = _mm256_fmadd_ps(v, k0, $lo);
                        $hi = _mm256_fmadd_ps(v, k1, $hi);
                    };
                }
                row!(0, s00, s01);
                row!(1, s10, s11);
                row!(2, s20, s21);
                row!(3, s30, s31);
            }
            let j = block * 16;
            for (r, (lo, hi)) in [(s00, s01), (s10, s11), (s20, s21), (s30, s31)]
                .into_iter()
                .enumerate()
            {
                store(eight_mut(scores, r * lk + j), lo);
                store(eight_mut(scores, r * lk + j + 8), hi);
            }
        }
    }

    /// `row[j] = exp(row[j] - max)`; returns the sum.
    #[target_feature(enable = "avx2,fma")]
    fn softmax_unnormalized(row: &mut [f32]) -> f32 {
        let (chunks, tail) = row.as_chunks_mut::<8>();
        let mut max_v = _mm256_set1_ps(f32::NEG_INFINITY);
        for chunk in chunks.iter() {
            max_v = _mm256_max_ps(max_v, load(chunk));
        }
        let max = tail.iter().fold(hmax(max_v), |m, s| m.max(*s));
        let max_v = _mm256_set1_ps(max);
        let mut sum_v = _mm256_setzero_ps();
        for chunk in chunks {
            let e = exp(_mm256_sub_ps(load(chunk), max_v));
            store(chunk, e);
            sum_v = _mm256_add_ps(sum_v, e);
        }
        let mut sum = hsum(sum_v);
        for s in tail {
            *s = (*s - max).exp();
            sum += *s;
        }
        sum
    }

    /// `rows` (1 or 2) context rows: `dst[r] = inv_sum[r] * sum_j probs[r][j] v[j]`,
    /// head_dim in chunks of 32; `dst` rows are `ld` apart.
    #[target_feature(enable = "avx2,fma")]
    fn weighted_values(
        probs: (&[f32], &[f32]),
        v: &[f32],
        hd: usize,
        inv_sum: [f32; 2],
        dst: &mut [f32],
        ld: usize,
        rows: usize,
    ) {
        assert!((1..=2).contains(&rows));
        for c in (0..hd).step_by(32) {
            let z = _mm256_setzero_ps();
            let (mut a0, mut a1, mut a2, mut a3) = (z, z, z, z);
            let (mut b0, mut b1, mut b2, mut b3) = (z, z, z, z);
            for ((p, q), row) in probs.0.iter().zip(probs.1).zip(v.chunks_exact(hd)) {
                let (values, _) = row[c..c + 32].as_chunks::<8>();
                let (pa, pb) = (_mm256_set1_ps(*p), _mm256_set1_ps(*q));
                let (v0, v1, v2, v3) = (
                    load(&values[0]),
                    load(&values[1]),
                    load(&values[2]),
                    load(&values[3]),
                );
                a0 = _mm256_fmadd_ps(pa, v0, a0);
                a1 = _mm256_fmadd_ps(pa, v1, a1);
                a2 = _mm256_fmadd_ps(pa, v2, a2);
                a3 = _mm256_fmadd_ps(pa, v3, a3);
                b0 = _mm256_fmadd_ps(pb, v0, b0);
                b1 = _mm256_fmadd_ps(pb, v1, b1);
                b2 = _mm256_fmadd_ps(pb, v2, b2);
                b3 = _mm256_fmadd_ps(pb, v3, b3);
            }
            for (r, acc) in [[a0, a1, a2, a3], [b0, b1, b2, b3]]
                .iter()
                .take(rows)
                .enumerate()
            {
                let s = _mm256_set1_ps(inv_sum[r]);
                for (t, acc) in acc.iter().enumerate() {
                    store(eight_mut(dst, r * ld + c + 8 * t), _mm256_mul_ps(s, *acc));
                }
            }
        }
    }

    /// erf GELU, 8 values at a time (`gelu_scalar` for the tail).
    ///
    /// # Safety
    /// The CPU must support AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn gelu(x: &mut [f32]) {
        let half = _mm256_set1_ps(0.5);
        let one = _mm256_set1_ps(1.0);
        let sign_bit = _mm256_set1_ps(-0.0);
        let (chunks, tail) = x.as_chunks_mut::<8>();
        for chunk in chunks {
            let v = load(chunk);
            let z = _mm256_mul_ps(v, _mm256_set1_ps(std::f32::consts::FRAC_1_SQRT_2));
            let az = _mm256_andnot_ps(sign_bit, z);
            let t = _mm256_div_ps(one, _mm256_fmadd_ps(_mm256_set1_ps(ERF_P), az, one));
            let mut poly = _mm256_set1_ps(ERF_A[4]);
            for a in ERF_A[..4].iter().rev() {
                poly = _mm256_fmadd_ps(poly, t, _mm256_set1_ps(*a));
            }
            poly = _mm256_mul_ps(poly, t);
            let e = exp(_mm256_xor_ps(_mm256_mul_ps(az, az), sign_bit));
            let erf_abs = _mm256_fnmadd_ps(poly, e, one);
            let erf = _mm256_or_ps(erf_abs, _mm256_and_ps(v, sign_bit));
            store(
                chunk,
                _mm256_mul_ps(_mm256_mul_ps(half, v), _mm256_add_ps(one, erf)),
            );
        }
        for v in tail {
            *v = super::gelu_scalar(*v);
        }
    }

    /// `e^x` to about 2 ulp over the f32 range (`0` below -87.3): `x = n ln2
    /// + r`, a degree-6 polynomial in `r`, scaled by `2^n` in the exponent.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    fn exp(x: __m256) -> __m256 {
        let x = _mm256_min_ps(x, _mm256_set1_ps(88.37));
        let too_small = _mm256_cmp_ps::<_CMP_LT_OQ>(x, _mm256_set1_ps(-87.33));
        let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm256_mul_ps(x, _mm256_set1_ps(std::f32::consts::LOG2_E)),
        );
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693_145_75), x);
        let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428_606_8e-6), r);
        let mut p = _mm256_set1_ps(1.0 / 720.0);
        for c in [1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0] {
            p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
        }
        let bits = _mm256_slli_epi32::<23>(_mm256_add_epi32(
            _mm256_cvtps_epi32(n),
            _mm256_set1_epi32(127),
        ));
        let y = _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
        _mm256_andnot_ps(too_small, y)
    }

    #[target_feature(enable = "avx2,fma")]
    #[inline]
    fn hmax(v: __m256) -> f32 {
        let s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let s = _mm_max_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_max_ss(s, _mm_shuffle_ps::<1>(s, s));
        _mm_cvtss_f32(s)
    }

    #[target_feature(enable = "avx2,fma")]
    #[inline]
    fn hsum(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        let s = _mm_add_ss(s, _mm_shuffle_ps::<1>(s, s));
        _mm_cvtss_f32(s)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut state = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (0..n)
            .map(|_| {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    /// The largest difference relative to the largest magnitude.
    fn relative_error(a: &[f32], b: &[f32]) -> f32 {
        assert_eq!(a.len(), b.len());
        let scale = b.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-30);
        a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / scale
    }

    #[test]
    fn linear_matches_the_plain_product_for_every_edge() {
        // Rows and outputs that are not multiples of the tile, inputs that
        // span more than one depth block, and the encoder's shapes.
        for (rows, outputs, inputs) in [
            (1, 1, 1),
            (7, 17, 300),
            (13, 40, 513),
            (100, 384, 384),
            (61, 1536, 384),
        ] {
            let w = values(outputs * inputs, 1);
            let b = values(outputs, 2);
            let x = values(rows * inputs, 3);
            let linear = PackedLinear::new(&w, outputs, inputs, Some(&b));
            let fast = linear.forward(&x, rows);
            let plain = linear.reference(&x, rows);
            // Independent check of the packing: the product from the
            // unpacked weights, in f64.
            let mut exact = vec![0f32; rows * outputs];
            for r in 0..rows {
                for o in 0..outputs {
                    let mut acc = f64::from(b[o]);
                    for k in 0..inputs {
                        acc += f64::from(x[r * inputs + k]) * f64::from(w[o * inputs + k]);
                    }
                    exact[r * outputs + o] = acc as f32;
                }
            }
            let (e1, e2) = (
                relative_error(&fast, &exact),
                relative_error(&plain, &exact),
            );
            assert!(
                e1 < 1e-5 && e2 < 1e-5,
                "{rows}x{outputs}x{inputs}: simd {e1:e}, plain {e2:e}"
            );
        }
    }

    #[test]
    fn attention_matches_the_plain_softmax_per_sequence() {
        let shape = Heads {
            heads: 3,
            head_dim: 32,
        };
        let lens = [1usize, 5, 16, 17, 40];
        let mut spans = Vec::new();
        let mut start = 0;
        for len in lens {
            spans.push(Span { start, len });
            start += len;
        }
        let qkv: Vec<f32> = values(start * 3 * 96, 4).iter().map(|v| v * 3.0).collect();
        let fast = attention(&qkv, &spans, shape);
        let mut plain = vec![0f32; start * 96];
        for span in &spans {
            reference_attend(
                &qkv[span.start * 288..(span.start + span.len) * 288],
                span.len,
                shape,
                &mut plain[span.start * 96..(span.start + span.len) * 96],
            );
        }
        let e = relative_error(&fast, &plain);
        assert!(e < 1e-5, "attention differs by {e:e}");
        // A sequence of one token attends only to itself: its context is its
        // own values.
        assert_eq!(&fast[..96], &qkv[192..288]);
    }

    #[test]
    fn gelu_matches_the_erf_definition() {
        let mut x: Vec<f32> = (-1200..=1200).map(|i| i as f32 / 100.0).collect();
        x.push(-100.0);
        x.push(100.0);
        let expected: Vec<f32> = x
            .iter()
            .map(|v| {
                let t = candle_core::Tensor::new(&[*v], &candle_core::Device::Cpu).unwrap();
                t.gelu_erf().unwrap().to_vec1::<f32>().unwrap()[0]
            })
            .collect();
        let mut fast = x.clone();
        gelu(&mut fast);
        for ((x, f), e) in x.iter().zip(&fast).zip(&expected) {
            assert!(
                (f - e).abs() <= 1e-6 * (1.0 + e.abs()),
                "gelu({x}) = {f}, expected {e}"
            );
            assert!(
                (gelu_scalar(*x) - e).abs() <= 1e-6 * (1.0 + e.abs()),
                "scalar gelu({x})"
            );
        }
    }
}
