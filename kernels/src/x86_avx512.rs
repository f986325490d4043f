//! The AVX-512 (F) kernels of x86-64: `f32_kernels`' generic bodies compiled
//! for 16-lane vectors, over this file's [`Simd`] implementation. Nothing
//! here is a hand-written kernel: only the vector operations are, one
//! intrinsic each, so a machine without AVX-512 runs the same kernel source
//! at the AVX2 level. The quantized products run their AVX2 code at this
//! level (an AVX-512 CPU has AVX2).
//!
//! Reached only through [`Avx512`], a token that exists only once the CPU
//! said it has AVX-512F (with AVX2 and FMA) and the kernel level
//! (`crate::cpu`) allows it.
#![allow(unsafe_code)]

use std::arch::x86_64::*;

use crate::cpu::{self, KernelLevel};
use crate::encoder::{Heads, PackedLinear};
use crate::f32_kernels;
use crate::simd::Simd;

/// Proof that this process runs the AVX-512 kernels.
#[derive(Clone, Copy, Debug)]
pub struct Avx512(());

impl Avx512 {
    /// Some when the CPU has AVX-512F, AVX2 and FMA and `SLUICE_CPU_KERNELS`
    /// did not lower the level.
    pub fn get() -> Option<Avx512> {
        (cpu::level() >= KernelLevel::Avx512).then_some(Avx512(()))
    }

    /// `out = x W^T + b` for `x`'s rows (see `PackedLinear::forward`).
    pub fn linear(self, w: &PackedLinear, x: &[f32], out: &mut [f32]) {
        // SAFETY: an `Avx512` exists only where the CPU has AVX-512F, AVX2 and FMA.
        unsafe { linear(self, w, x, out) }
    }

    /// One sequence's attention (see `encoder::attention`).
    pub fn attend(self, qkv: &[f32], len: usize, shape: Heads, out: &mut [f32]) {
        // SAFETY: as in `linear`.
        unsafe { attend(self, qkv, len, shape, out) }
    }

    /// GELU in place.
    pub fn gelu(self, x: &mut [f32]) {
        // SAFETY: as in `linear`.
        unsafe { gelu(self, x) }
    }

    /// The FMA peak loop (`f32_kernels::fma_peak`).
    pub fn fma_peak(self, iters: usize) -> f32 {
        // SAFETY: as in `linear`.
        unsafe { fma_peak(self, iters) }
    }
}

#[target_feature(enable = "avx512f,avx2,fma")]
fn linear(s: Avx512, w: &PackedLinear, x: &[f32], out: &mut [f32]) {
    f32_kernels::linear(s, w, x, out)
}

#[target_feature(enable = "avx512f,avx2,fma")]
fn attend(s: Avx512, qkv: &[f32], len: usize, shape: Heads, out: &mut [f32]) {
    f32_kernels::attend(s, qkv, len, shape, out)
}

#[target_feature(enable = "avx512f,avx2,fma")]
fn gelu(s: Avx512, x: &mut [f32]) {
    f32_kernels::gelu(s, x)
}

#[target_feature(enable = "avx512f,avx2,fma")]
fn fma_peak(s: Avx512, iters: usize) -> f32 {
    f32_kernels::fma_peak(s, iters)
}

/// Sign bit of each lane, for the bitwise operations (AVX-512F has them
/// on integers only; the f32 forms need AVX-512DQ).
#[inline(always)]
fn sign_bits() -> __m512i {
    // SAFETY: an `Avx512` exists (every caller holds one).
    unsafe { _mm512_set1_epi32(i32::MIN) }
}

/// The [`Simd`] operations in AVX-512F, 16 lanes. Each is inlined into the
/// `#[target_feature(enable = "avx512f,avx2,fma")]` functions above.
impl Simd for Avx512 {
    const LANES: usize = 16;
    type F = __m512;

    // SAFETY (every `unsafe` block below): an `Avx512` exists only where the
    // CPU has AVX-512F (`Avx512::get`), and `[f32; 16]` and `__m512` have the
    // same size with every bit pattern valid for both.

    #[inline(always)]
    fn splat(self, v: f32) -> __m512 {
        unsafe { _mm512_set1_ps(v) }
    }
    #[inline(always)]
    fn load(self, x: &[f32]) -> __m512 {
        let lanes: [f32; 16] = x[..16].as_chunks::<16>().0[0];
        unsafe { std::mem::transmute::<[f32; 16], __m512>(lanes) }
    }
    #[inline(always)]
    fn store(self, x: &mut [f32], v: __m512) {
        x[..16].as_chunks_mut::<16>().0[0] = unsafe { std::mem::transmute::<__m512, [f32; 16]>(v) };
    }
    #[inline(always)]
    fn add(self, a: __m512, b: __m512) -> __m512 {
        unsafe { _mm512_add_ps(a, b) }
    }
    #[inline(always)]
    fn sub(self, a: __m512, b: __m512) -> __m512 {
        unsafe { _mm512_sub_ps(a, b) }
    }
    #[inline(always)]
    fn mul(self, a: __m512, b: __m512) -> __m512 {
        unsafe { _mm512_mul_ps(a, b) }
    }
    #[inline(always)]
    fn div(self, a: __m512, b: __m512) -> __m512 {
        unsafe { _mm512_div_ps(a, b) }
    }
    #[inline(always)]
    fn max(self, a: __m512, b: __m512) -> __m512 {
        unsafe { _mm512_max_ps(a, b) }
    }
    #[inline(always)]
    fn min(self, a: __m512, b: __m512) -> __m512 {
        unsafe { _mm512_min_ps(a, b) }
    }
    #[inline(always)]
    fn mul_add(self, a: __m512, b: __m512, c: __m512) -> __m512 {
        unsafe { _mm512_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    fn neg_mul_add(self, a: __m512, b: __m512, c: __m512) -> __m512 {
        unsafe { _mm512_fnmadd_ps(a, b, c) }
    }
    #[inline(always)]
    fn abs(self, a: __m512) -> __m512 {
        unsafe { _mm512_castsi512_ps(_mm512_andnot_si512(sign_bits(), _mm512_castps_si512(a))) }
    }
    #[inline(always)]
    fn neg(self, a: __m512) -> __m512 {
        unsafe { _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(a), sign_bits())) }
    }
    #[inline(always)]
    fn with_sign_of(self, magnitude: __m512, sign: __m512) -> __m512 {
        unsafe {
            let sign = _mm512_and_si512(_mm512_castps_si512(sign), sign_bits());
            _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(magnitude), sign))
        }
    }
    #[inline(always)]
    fn round(self, a: __m512) -> __m512 {
        // Scale 0 (whole numbers), round to nearest even, no exceptions.
        unsafe { _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(a) }
    }
    #[inline(always)]
    fn pow2(self, n: __m512) -> __m512 {
        unsafe {
            let biased = _mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127));
            _mm512_castsi512_ps(_mm512_slli_epi32::<23>(biased))
        }
    }
    #[inline(always)]
    fn zero_where_below(self, x: __m512, bound: __m512, y: __m512) -> __m512 {
        // As AVX2's andnot of `x < bound`: a NaN `x` keeps `y`.
        unsafe {
            let below = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, bound);
            _mm512_maskz_mov_ps(!below, y)
        }
    }
    #[inline(always)]
    fn sum(self, v: __m512) -> f32 {
        unsafe { _mm512_reduce_add_ps(v) }
    }
    #[inline(always)]
    fn max_lane(self, v: __m512) -> f32 {
        unsafe { _mm512_reduce_max_ps(v) }
    }
}
