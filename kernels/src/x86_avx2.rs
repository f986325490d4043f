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
use crate::layout::{Heads, LinearPanels};
use crate::layout::{PackedMatrix, QuantizedRows};
use crate::scalar::Gate;
use crate::simd::{Int8Simd, Simd};
use crate::team::Columns;

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
    pub fn linear(self, w: &LinearPanels, x: &[f32], out: &mut [f32]) {
        // SAFETY: an `Avx2` exists only where the CPU has AVX2 and FMA.
        unsafe { encoder::linear(self, w, x, out) }
    }

    /// `out = x W^T + b` for a few rows of `x` and the outputs of weight
    /// panels `panels` (see `PackedLinear::forward_into`).
    pub fn linear_few(
        self,
        w: &LinearPanels,
        panels: std::ops::Range<usize>,
        x: &[f32],
        out: &mut [f32],
    ) {
        // SAFETY: as in `linear`.
        unsafe { encoder::linear_few(self, w, panels, x, out) }
    }

    /// One sequence's attention (see `encoder::attention`).
    pub fn attend(self, qkv: &[f32], len: usize, shape: Heads, first: usize, out: &mut [f32]) {
        // SAFETY: as in `linear`.
        unsafe { encoder::attend(self, qkv, len, shape, first, out) }
    }

    /// GELU in place.
    pub fn gelu(self, x: &mut [f32]) {
        // SAFETY: as in `linear`.
        unsafe { encoder::gelu(self, x) }
    }

    /// The layer norm of `x`'s rows (see `encoder::layer_norm`).
    pub fn layer_norm(
        self,
        x: &mut [f32],
        residual: Option<&[f32]>,
        weight: &[f32],
        bias: &[f32],
        eps: f32,
    ) {
        // SAFETY: as in `linear`.
        unsafe { encoder::layer_norm(self, x, residual, weight, bias, eps) }
    }

    /// A gated MLP's `act(gate) * up` of one row (see `decoder::gated`).
    pub fn gated(self, act: Gate, gate: &[f32], up: &[f32], out: &mut [f32]) {
        // SAFETY: as in `linear`.
        unsafe { encoder::gated(self, act, gate, up, out) }
    }

    /// One query head of a decode step (see `decoder::causal_attention`).
    pub fn decode_attend(
        self,
        q: &[f32],
        keys: &[f32],
        values: &[f32],
        scores: &mut Vec<f32>,
        out: &mut [f32],
    ) {
        // SAFETY: as in `linear`.
        unsafe { encoder::decode_attend(self, q, keys, values, scores, out) }
    }

    /// The FMA peak loop (`f32_kernels::fma_peak`).
    pub fn fma_peak(self, iters: usize) -> f32 {
        // SAFETY: as in `linear`.
        unsafe { encoder::fma_peak(self, iters) }
    }

    /// Rows `first..first + rows` of `W x` into their columns of `out`
    /// (`[tokens, W's rows]`).
    pub fn quantized_rows(
        self,
        w: &PackedMatrix,
        x: &QuantizedRows,
        first: usize,
        rows: usize,
        out: &mut Columns,
    ) {
        // SAFETY: as in `linear`.
        unsafe { quantized::rows(self, w, x, first, rows, out) }
    }
}

/// The encoder's f32 kernels: `f32_kernels`' bodies compiled for AVX2 + FMA.
mod encoder {
    use super::Avx2;
    use crate::f32_kernels;
    use crate::layout::{Heads, LinearPanels};
    use crate::scalar::Gate;

    #[target_feature(enable = "avx2,fma")]
    pub fn linear(s: Avx2, w: &LinearPanels, x: &[f32], out: &mut [f32]) {
        f32_kernels::linear::<_, 6>(s, w, x, out)
    }

    #[target_feature(enable = "avx2,fma")]
    pub fn linear_few(
        s: Avx2,
        w: &LinearPanels,
        panels: std::ops::Range<usize>,
        x: &[f32],
        out: &mut [f32],
    ) {
        f32_kernels::linear_panels::<_, 4>(s, w, panels, x, out)
    }

    #[target_feature(enable = "avx2,fma")]
    pub fn attend(s: Avx2, qkv: &[f32], len: usize, shape: Heads, first: usize, out: &mut [f32]) {
        f32_kernels::attend(s, qkv, len, shape, first, out)
    }

    #[target_feature(enable = "avx2,fma")]
    pub fn gelu(s: Avx2, x: &mut [f32]) {
        f32_kernels::gelu(s, x)
    }

    #[target_feature(enable = "avx2,fma")]
    pub fn layer_norm(
        s: Avx2,
        x: &mut [f32],
        residual: Option<&[f32]>,
        weight: &[f32],
        bias: &[f32],
        eps: f32,
    ) {
        f32_kernels::layer_norm(s, x, residual, weight, bias, eps)
    }

    #[target_feature(enable = "avx2,fma")]
    pub fn gated(s: Avx2, act: Gate, gate: &[f32], up: &[f32], out: &mut [f32]) {
        f32_kernels::gated(s, act, gate, up, out)
    }

    #[target_feature(enable = "avx2,fma")]
    pub fn decode_attend(
        s: Avx2,
        q: &[f32],
        keys: &[f32],
        values: &[f32],
        scores: &mut Vec<f32>,
        out: &mut [f32],
    ) {
        f32_kernels::decode_attend(s, q, keys, values, scores, out)
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

/// The quantized products: `quantized_kernels`' generic bodies compiled
/// for AVX2 + FMA, one block per 256-bit vector.
mod quantized {
    use super::Avx2;
    use crate::layout::{PackedMatrix, QuantizedRows};
    use crate::quantized_kernels;
    use crate::team::Columns;

    #[target_feature(enable = "avx2,fma")]
    pub fn rows(
        s: Avx2,
        w: &PackedMatrix,
        x: &QuantizedRows,
        first: usize,
        rows: usize,
        out: &mut Columns,
    ) {
        quantized_kernels::rows(s, w, x, first, rows, out)
    }
}

/// The [`Int8Simd`] operations in AVX2, one block per vector. Each is
/// inlined into the `#[target_feature(enable = "avx2,fma")]` function
/// above. Safety of every `unsafe` block: as in the [`Simd`] impl; the
/// loads read exactly the block arrays they are given.
impl Int8Simd for Avx2 {
    const BLOCKS: usize = 1;
    const WIDE_TILES: bool = false;
    type I = __m256i;
    type F = __m256;

    #[inline(always)]
    fn zero(self) -> __m256 {
        unsafe { _mm256_setzero_ps() }
    }
    #[inline(always)]
    fn load_q8(self, blocks: &[[i8; 32]]) -> __m256i {
        let block: &[i8; 32] = &blocks[0];
        unsafe { _mm256_loadu_si256(block.as_ptr().cast()) }
    }
    #[inline(always)]
    fn unpack_q4(self, blocks: &[[u8; 16]]) -> __m256i {
        let block: &[u8; 16] = &blocks[0];
        unsafe {
            let packed = _mm_loadu_si128(block.as_ptr().cast());
            let both = _mm256_set_m128i(_mm_srli_epi16::<4>(packed), packed);
            _mm256_and_si256(both, _mm256_set1_epi8(0x0F))
        }
    }
    #[inline(always)]
    fn abs_and_sign(self, w: __m256i, x: __m256i) -> (__m256i, __m256i) {
        unsafe { (_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w)) }
    }
    #[inline(always)]
    fn dot(self, unsigned: __m256i, signed: __m256i) -> __m256i {
        unsafe { _mm256_madd_epi16(_mm256_maddubs_epi16(unsigned, signed), _mm256_set1_epi16(1)) }
    }
    #[inline(always)]
    fn block_scales(self, d: &[f32]) -> __m256 {
        unsafe { _mm256_set1_ps(d[0]) }
    }
    #[inline(always)]
    fn mul(self, a: __m256, b: __m256) -> __m256 {
        unsafe { _mm256_mul_ps(a, b) }
    }
    #[inline(always)]
    fn scaled_add(self, acc: __m256, dot: __m256i, scale: __m256) -> __m256 {
        unsafe { _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), scale, acc) }
    }
    #[inline(always)]
    fn sum(self, a: __m256) -> f32 {
        Simd::sum(self, a)
    }
}
