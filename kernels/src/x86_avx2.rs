//! The AVX2 + FMA kernels of x86-64: the one file of the crate with unsafe
//! code. Each kernel is a `#[target_feature(enable = "avx2,fma")]` function;
//! the rest of the crate reaches them only through [`Avx2`], a token that
//! exists only once the CPU said it has those features and the kernel level
//! (`crate::cpu`) allows them, so every call is safe by construction.
#![allow(unsafe_code)]

use crate::cpu::{self, KernelLevel};
use crate::encoder::{Heads, PackedLinear};
use crate::quantized::{PackedMatrix, QuantizedRows};

/// Proof that this process runs the AVX2 + FMA kernels.
#[derive(Clone, Copy, Debug)]
pub struct Avx2(());

impl Avx2 {
    /// Some when the CPU has AVX2 and FMA and `SLUICE_CPU_KERNELS` did not
    /// lower the level.
    pub fn get() -> Option<Avx2> {
        (cpu::level() >= KernelLevel::Avx2).then_some(Avx2(()))
    }

    /// `out = x W^T + b` for `x`'s rows (see `PackedLinear::forward`).
    pub fn linear(self, w: &PackedLinear, x: &[f32], out: &mut [f32]) {
        // SAFETY: an `Avx2` exists only where the CPU has AVX2 and FMA.
        unsafe { encoder::linear(w, x, out) }
    }

    /// One sequence's attention (see `encoder::attention`).
    pub fn attend(self, qkv: &[f32], len: usize, shape: Heads, out: &mut [f32]) {
        // SAFETY: as in `linear`.
        unsafe { encoder::attend(qkv, len, shape, out) }
    }

    /// GELU in place.
    pub fn gelu(self, x: &mut [f32]) {
        // SAFETY: as in `linear`.
        unsafe { encoder::gelu(x) }
    }

    /// Rows `first..first + rows` of `W x` into `out` (`[rows, tokens]`).
    pub fn quantized_rows(
        self,
        w: &PackedMatrix,
        x: &QuantizedRows,
        first: usize,
        rows: usize,
        out: &mut [f32],
    ) {
        // SAFETY: as in `linear`.
        unsafe { quantized::rows(w, x, first, rows, out) }
    }
}

/// The encoder's f32 kernels.
mod encoder {
    use std::arch::x86_64::*;

    use crate::encoder::{ERF_A, ERF_P, Heads, KC, MC, MR, NR, PackedLinear};

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
            *v = crate::encoder::gelu_scalar(*v);
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

/// The quantized matrix products.
mod quantized {
    use std::arch::x86_64::*;

    use crate::quantized::{Packed, PackedMatrix, QuantizedRows};

    /// Rows `first..first + rows` of `W x` into `out` (`[rows, tokens]`):
    /// tiles of 2 rows x 4 tokens (each weight block unpacked once for 4
    /// tokens), then the remaining tokens 4 rows at a time.
    ///
    /// # Safety
    /// The CPU must support AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn rows(
        w: &PackedMatrix,
        x: &QuantizedRows,
        first: usize,
        rows: usize,
        out: &mut [f32],
    ) {
        let tokens = x.tokens;
        let mut t = 0;
        while t + 4 <= tokens {
            let mut r = 0;
            while r + 2 <= rows {
                let sums = tile::<2, 4>(w, x, first + r, t);
                for (i, row) in sums.iter().enumerate() {
                    for (j, v) in row.iter().enumerate() {
                        out[(r + i) * tokens + t + j] = *v;
                    }
                }
                r += 2;
            }
            while r < rows {
                let sums = tile::<1, 4>(w, x, first + r, t);
                for (j, v) in sums[0].iter().enumerate() {
                    out[r * tokens + t + j] = *v;
                }
                r += 1;
            }
            t += 4;
        }
        while t < tokens {
            let mut r = 0;
            while r + 4 <= rows {
                let sums = tile::<4, 1>(w, x, first + r, t);
                for (i, row) in sums.iter().enumerate() {
                    out[(r + i) * tokens + t] = row[0];
                }
                r += 4;
            }
            while r < rows {
                out[r * tokens + t] = tile::<1, 1>(w, x, first + r, t)[0][0];
                r += 1;
            }
            t += 1;
        }
    }

    /// `R` rows from `row` times `T` tokens from `token`.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    fn tile<const R: usize, const T: usize>(
        w: &PackedMatrix,
        x: &QuantizedRows,
        row: usize,
        token: usize,
    ) -> [[f32; T]; R] {
        let nb = w.blocks;
        let x_q: [&[[i8; 32]]; T] =
            std::array::from_fn(|j| &x.qs[(token + j) * nb..(token + j + 1) * nb]);
        let x_d: [&[f32]; T] =
            std::array::from_fn(|j| &x.d[(token + j) * nb..(token + j + 1) * nb]);
        let w_range = |i: usize| (row + i) * nb..(row + i + 1) * nb;
        let acc = match &w.weights {
            Packed::Q4_1 { d, qs, .. } => q4_1::<R, T>(
                nb,
                std::array::from_fn(|i| &qs[w_range(i)]),
                std::array::from_fn(|i| &d[w_range(i)]),
                x_q,
                x_d,
            ),
            Packed::Q8_0 { d, qs } => q8_0::<R, T>(
                nb,
                std::array::from_fn(|i| &qs[w_range(i)]),
                std::array::from_fn(|i| &d[w_range(i)]),
                x_q,
                x_d,
            ),
        };
        let mut sums = [[0f32; T]; R];
        for i in 0..R {
            for j in 0..T {
                sums[i][j] = hsum(acc[i][j]);
            }
        }
        if let Packed::Q4_1 { m, .. } = &w.weights {
            // The `m * x` part of each block: m_w . s_x over the blocks.
            for (i, row_sums) in sums.iter_mut().enumerate() {
                let w_m = &m[w_range(i)];
                for (j, v) in row_sums.iter_mut().enumerate() {
                    let x_s = &x.s[(token + j) * nb..(token + j + 1) * nb];
                    *v += w_m.iter().zip(x_s).map(|(a, b)| a * b).sum::<f32>();
                }
            }
        }
        sums
    }

    /// Q4_1 blocks: the nibbles unpacked once per block for all `T` tokens
    /// (u8 0..=15 times i8, as `maddubs` takes them).
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    fn q4_1<const R: usize, const T: usize>(
        nb: usize,
        w_q: [&[[u8; 16]]; R],
        w_d: [&[f32]; R],
        x_q: [&[[i8; 32]]; T],
        x_d: [&[f32]; T],
    ) -> [[__m256; T]; R] {
        let ones = _mm256_set1_epi16(1);
        let low = _mm256_set1_epi8(0x0F);
        let mut acc = [[_mm256_setzero_ps(); T]; R];
        for b in 0..nb {
            let mut wv = [_mm256_setzero_si256(); R];
            for i in 0..R {
                let packed = load16(&w_q[i][b]);
                wv[i] = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(packed, 4), packed), low);
            }
            for j in 0..T {
                let xv = load32(&x_q[j][b]);
                let dx = x_d[j][b];
                for i in 0..R {
                    let dot = _mm256_madd_epi16(_mm256_maddubs_epi16(wv[i], xv), ones);
                    let scale = _mm256_set1_ps(w_d[i][b] * dx);
                    acc[i][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), scale, acc[i][j]);
                }
            }
        }
        acc
    }

    /// Q8_0 blocks: |w| times x with w's signs, the u8 x i8 product
    /// `maddubs` takes.
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    fn q8_0<const R: usize, const T: usize>(
        nb: usize,
        w_q: [&[[i8; 32]]; R],
        w_d: [&[f32]; R],
        x_q: [&[[i8; 32]]; T],
        x_d: [&[f32]; T],
    ) -> [[__m256; T]; R] {
        let ones = _mm256_set1_epi16(1);
        let mut acc = [[_mm256_setzero_ps(); T]; R];
        for b in 0..nb {
            let mut wv = [_mm256_setzero_si256(); R];
            for i in 0..R {
                wv[i] = load32(&w_q[i][b]);
            }
            for j in 0..T {
                let xv = load32(&x_q[j][b]);
                let dx = x_d[j][b];
                for i in 0..R {
                    let pairs = _mm256_maddubs_epi16(
                        _mm256_sign_epi8(wv[i], wv[i]),
                        _mm256_sign_epi8(xv, wv[i]),
                    );
                    let dot = _mm256_madd_epi16(pairs, ones);
                    let scale = _mm256_set1_ps(w_d[i][b] * dx);
                    acc[i][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), scale, acc[i][j]);
                }
            }
        }
        acc
    }

    #[target_feature(enable = "avx2,fma")]
    #[inline]
    fn hsum(v: __m256) -> f32 {
        let sum4 = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let sum2 = _mm_add_ps(sum4, _mm_movehl_ps(sum4, sum4));
        let sum1 = _mm_add_ss(sum2, _mm_movehdup_ps(sum2));
        _mm_cvtss_f32(sum1)
    }

    #[target_feature(enable = "avx2,fma")]
    #[inline]
    fn load32(q: &[i8; 32]) -> __m256i {
        // SAFETY: `q` is 32 readable bytes; the load is unaligned.
        unsafe { _mm256_loadu_si256(q.as_ptr().cast()) }
    }

    #[target_feature(enable = "avx2,fma")]
    #[inline]
    fn load16(q: &[u8; 16]) -> __m128i {
        // SAFETY: `q` is 16 readable bytes; the load is unaligned.
        unsafe { _mm_loadu_si128(q.as_ptr().cast()) }
    }
}
