//! The AVX2 + FMA kernels of x86-64 (with `x86_avx512.rs`, the crate's only
//! unsafe code). Each kernel is a `#[target_feature(enable = "avx2,fma")]`
//! function: the f32 ones instantiate `f32_kernels`' generic bodies over
//! this file's [`Simd`] implementation, the quantized ones are written here.
//! The rest of the crate reaches them only through [`Avx2`], a token that
//! exists only once the CPU said it has those features and the kernel level
//! (`crate::cpu`) allows them, so every call is safe by construction.
#![allow(unsafe_code)]

use std::arch::x86_64::*;

use crate::cpu::{self, KernelLevel};
use crate::encoder::{Heads, PackedLinear};
use crate::quantized::{PackedMatrix, QuantizedRows};
use crate::simd::Simd;

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
        unsafe { encoder::linear(self, w, x, out) }
    }

    /// One sequence's attention (see `encoder::attention`).
    pub fn attend(self, qkv: &[f32], len: usize, shape: Heads, out: &mut [f32]) {
        // SAFETY: as in `linear`.
        unsafe { encoder::attend(self, qkv, len, shape, out) }
    }

    /// GELU in place.
    pub fn gelu(self, x: &mut [f32]) {
        // SAFETY: as in `linear`.
        unsafe { encoder::gelu(self, x) }
    }

    /// The FMA peak loop (`f32_kernels::fma_peak`).
    pub fn fma_peak(self, iters: usize) -> f32 {
        // SAFETY: as in `linear`.
        unsafe { encoder::fma_peak(self, iters) }
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

/// The encoder's f32 kernels: `f32_kernels`' bodies compiled for AVX2 + FMA.
mod encoder {
    use super::Avx2;
    use crate::encoder::{Heads, PackedLinear};
    use crate::f32_kernels;

    #[target_feature(enable = "avx2,fma")]
    pub fn linear(s: Avx2, w: &PackedLinear, x: &[f32], out: &mut [f32]) {
        f32_kernels::linear(s, w, x, out)
    }

    #[target_feature(enable = "avx2,fma")]
    pub fn attend(s: Avx2, qkv: &[f32], len: usize, shape: Heads, out: &mut [f32]) {
        f32_kernels::attend(s, qkv, len, shape, out)
    }

    #[target_feature(enable = "avx2,fma")]
    pub fn gelu(s: Avx2, x: &mut [f32]) {
        f32_kernels::gelu(s, x)
    }

    #[target_feature(enable = "avx2,fma")]
    pub fn fma_peak(s: Avx2, iters: usize) -> f32 {
        f32_kernels::fma_peak(s, iters)
    }
}

/// The [`Simd`] operations in AVX2 + FMA, 8 lanes. Each is inlined into the
/// `#[target_feature(enable = "avx2,fma")]` functions above.
///
/// Vectors are read from and written to `[f32; 8]` arrays, never through
/// raw pointers: std's `_mm256_loadu_ps` copies through a range-checked
/// `copy_nonoverlapping` in debug-assertion builds (the tests and
/// benchmarks build those), which spilled every load to the stack.
impl Simd for Avx2 {
    const LANES: usize = 8;
    type F = __m256;

    // SAFETY (every `unsafe` block below): an `Avx2` exists only where the
    // CPU has AVX2 and FMA (`Avx2::get`), and `[f32; 8]` and `__m256` have
    // the same size with every bit pattern valid for both.

    #[inline(always)]
    fn splat(self, v: f32) -> __m256 {
        unsafe { _mm256_set1_ps(v) }
    }
    #[inline(always)]
    fn load(self, x: &[f32]) -> __m256 {
        let lanes: [f32; 8] = x[..8].as_chunks::<8>().0[0];
        unsafe { std::mem::transmute::<[f32; 8], __m256>(lanes) }
    }
    #[inline(always)]
    fn store(self, x: &mut [f32], v: __m256) {
        x[..8].as_chunks_mut::<8>().0[0] = unsafe { std::mem::transmute::<__m256, [f32; 8]>(v) };
    }
    #[inline(always)]
    fn add(self, a: __m256, b: __m256) -> __m256 {
        unsafe { _mm256_add_ps(a, b) }
    }
    #[inline(always)]
    fn sub(self, a: __m256, b: __m256) -> __m256 {
        unsafe { _mm256_sub_ps(a, b) }
    }
    #[inline(always)]
    fn mul(self, a: __m256, b: __m256) -> __m256 {
        unsafe { _mm256_mul_ps(a, b) }
    }
    #[inline(always)]
    fn div(self, a: __m256, b: __m256) -> __m256 {
        unsafe { _mm256_div_ps(a, b) }
    }
    #[inline(always)]
    fn max(self, a: __m256, b: __m256) -> __m256 {
        unsafe { _mm256_max_ps(a, b) }
    }
    #[inline(always)]
    fn min(self, a: __m256, b: __m256) -> __m256 {
        unsafe { _mm256_min_ps(a, b) }
    }
    #[inline(always)]
    fn mul_add(self, a: __m256, b: __m256, c: __m256) -> __m256 {
        unsafe { _mm256_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    fn neg_mul_add(self, a: __m256, b: __m256, c: __m256) -> __m256 {
        unsafe { _mm256_fnmadd_ps(a, b, c) }
    }
    #[inline(always)]
    fn abs(self, a: __m256) -> __m256 {
        unsafe { _mm256_andnot_ps(_mm256_set1_ps(-0.0), a) }
    }
    #[inline(always)]
    fn neg(self, a: __m256) -> __m256 {
        unsafe { _mm256_xor_ps(a, _mm256_set1_ps(-0.0)) }
    }
    #[inline(always)]
    fn with_sign_of(self, magnitude: __m256, sign: __m256) -> __m256 {
        unsafe { _mm256_or_ps(magnitude, _mm256_and_ps(sign, _mm256_set1_ps(-0.0))) }
    }
    #[inline(always)]
    fn round(self, a: __m256) -> __m256 {
        unsafe { _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(a) }
    }
    #[inline(always)]
    fn pow2(self, n: __m256) -> __m256 {
        unsafe {
            let biased = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127));
            _mm256_castsi256_ps(_mm256_slli_epi32::<23>(biased))
        }
    }
    #[inline(always)]
    fn zero_where_below(self, x: __m256, bound: __m256, y: __m256) -> __m256 {
        unsafe { _mm256_andnot_ps(_mm256_cmp_ps::<_CMP_LT_OQ>(x, bound), y) }
    }
    #[inline(always)]
    fn sum(self, v: __m256) -> f32 {
        unsafe {
            let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
            let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
            let s = _mm_add_ss(s, _mm_shuffle_ps::<1>(s, s));
            _mm_cvtss_f32(s)
        }
    }
    #[inline(always)]
    fn max_lane(self, v: __m256) -> f32 {
        unsafe {
            let s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
            let s = _mm_max_ps(s, _mm_movehl_ps(s, s));
            let s = _mm_max_ss(s, _mm_shuffle_ps::<1>(s, s));
            _mm_cvtss_f32(s)
        }
    }
}

/// The quantized matrix products.
mod quantized {
    use std::arch::x86_64::*;

    use super::Avx2;
    use crate::quantized::{Packed, PackedMatrix, QuantizedRows};
    use crate::simd::Simd;

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

    /// The lanes' sum: the `Simd` one (this module's callers are AVX2 code,
    /// which is what an `Avx2` proves).
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    fn hsum(v: __m256) -> f32 {
        Avx2(()).sum(v)
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
