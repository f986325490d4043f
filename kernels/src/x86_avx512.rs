//! The AVX-512 kernels of x86-64: `f32_kernels`' generic bodies compiled
//! for 16-lane vectors (AVX-512F), over this file's [`Simd`] implementation,
//! and `quantized_kernels`' bodies compiled for two quantization blocks per
//! 512-bit vector over its [`Int8Simd`] implementations (AVX-512BW's
//! `maddubs`, or AVX-512 VNNI's `vpdpbusd` where the CPU has it). Nothing
//! here is a hand-written kernel: only the vector operations are, one or two
//! intrinsics each, so a machine without AVX-512 runs the same kernel source
//! at the AVX2 level.
//!
//! Reached only through tokens that exist only once the CPU said it has the
//! features and the kernel level (`crate::cpu`) allows AVX-512: [`Avx512`]
//! (AVX-512F with AVX2 and FMA), [`Avx512Bw`] (and AVX-512BW),
//! [`Avx512Vnni`] (and AVX-512 VNNI).
#![allow(unsafe_code)]

use std::arch::x86_64::*;

use crate::cpu::{self, KernelLevel};
use crate::f32_kernels;
use crate::layout::{Heads, LinearPanels};
use crate::layout::{PackedMatrix, QuantizedRows};
use crate::quantized_kernels;
use crate::scalar::Gate;
use crate::simd::{Int8Simd, Simd};
use crate::team::Columns;

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
    pub fn linear(self, w: &LinearPanels, x: &[f32], out: &mut [f32]) {
        // SAFETY: an `Avx512` exists only where the CPU has AVX-512F, AVX2 and FMA.
        unsafe { linear(self, w, x, out) }
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
        unsafe { linear_few(self, w, panels, x, out) }
    }

    /// One sequence's attention (see `encoder::attention`).
    pub fn attend(self, qkv: &[f32], len: usize, shape: Heads, first: usize, out: &mut [f32]) {
        // SAFETY: as in `linear`.
        unsafe { attend(self, qkv, len, shape, first, out) }
    }

    /// GELU in place.
    pub fn gelu(self, x: &mut [f32]) {
        // SAFETY: as in `linear`.
        unsafe { gelu(self, x) }
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
        unsafe { layer_norm(self, x, residual, weight, bias, eps) }
    }

    /// A gated MLP's `act(gate) * up` of one row (see `decoder::gated`).
    pub fn gated(self, act: Gate, gate: &[f32], up: &[f32], out: &mut [f32]) {
        // SAFETY: as in `linear`.
        unsafe { gated(self, act, gate, up, out) }
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
        unsafe { decode_attend(self, q, keys, values, scores, out) }
    }

    /// The FMA peak loop (`f32_kernels::fma_peak`).
    pub fn fma_peak(self, iters: usize) -> f32 {
        // SAFETY: as in `linear`.
        unsafe { fma_peak(self, iters) }
    }
}

#[target_feature(enable = "avx512f,avx2,fma")]
fn linear(s: Avx512, w: &LinearPanels, x: &[f32], out: &mut [f32]) {
    f32_kernels::linear::<_, 12>(s, w, x, out)
}

#[target_feature(enable = "avx512f,avx2,fma")]
fn linear_few(
    s: Avx512,
    w: &LinearPanels,
    panels: std::ops::Range<usize>,
    x: &[f32],
    out: &mut [f32],
) {
    f32_kernels::linear_panels::<_, 4>(s, w, panels, x, out)
}

#[target_feature(enable = "avx512f,avx2,fma")]
fn attend(s: Avx512, qkv: &[f32], len: usize, shape: Heads, first: usize, out: &mut [f32]) {
    f32_kernels::attend(s, qkv, len, shape, first, out)
}

#[target_feature(enable = "avx512f,avx2,fma")]
fn gelu(s: Avx512, x: &mut [f32]) {
    f32_kernels::gelu(s, x)
}

#[target_feature(enable = "avx512f,avx2,fma")]
fn layer_norm(
    s: Avx512,
    x: &mut [f32],
    residual: Option<&[f32]>,
    weight: &[f32],
    bias: &[f32],
    eps: f32,
) {
    f32_kernels::layer_norm(s, x, residual, weight, bias, eps)
}

#[target_feature(enable = "avx512f,avx2,fma")]
fn gated(s: Avx512, act: Gate, gate: &[f32], up: &[f32], out: &mut [f32]) {
    f32_kernels::gated(s, act, gate, up, out)
}

#[target_feature(enable = "avx512f,avx2,fma")]
fn decode_attend(
    s: Avx512,
    q: &[f32],
    keys: &[f32],
    values: &[f32],
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    f32_kernels::decode_attend(s, q, keys, values, scores, out)
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

/// Proof that this process runs the AVX-512BW 8-bit products.
#[derive(Clone, Copy, Debug)]
pub struct Avx512Bw(());

/// Proof that this process runs the AVX-512 VNNI 8-bit products.
#[derive(Clone, Copy, Debug)]
pub struct Avx512Vnni(());

impl Avx512Bw {
    /// Some when the AVX-512 level runs and the CPU has AVX-512BW.
    pub fn get() -> Option<Avx512Bw> {
        Avx512::get()
            .filter(|_| std::is_x86_feature_detected!("avx512bw"))
            .map(|_| Avx512Bw(()))
    }

    /// Rows `first..first + rows` of `W x` into their columns of `out`
    /// (`[tokens, W's rows]`);
    /// `W`'s blocks per row must be even.
    pub fn quantized_rows(
        self,
        w: &PackedMatrix,
        x: &QuantizedRows,
        first: usize,
        rows: usize,
        out: &mut Columns,
    ) {
        // SAFETY: an `Avx512Bw` exists only where the CPU has AVX-512F and
        // BW, AVX2 and FMA.
        unsafe { quantized_rows_bw(self, w, x, first, rows, out) }
    }
}

impl Avx512Vnni {
    /// Some when the AVX-512 level runs and the CPU has AVX-512BW and VNNI.
    pub fn get() -> Option<Avx512Vnni> {
        Avx512Bw::get()
            .filter(|_| std::is_x86_feature_detected!("avx512vnni"))
            .map(|_| Avx512Vnni(()))
    }

    /// As [`Avx512Bw::quantized_rows`].
    pub fn quantized_rows(
        self,
        w: &PackedMatrix,
        x: &QuantizedRows,
        first: usize,
        rows: usize,
        out: &mut Columns,
    ) {
        // SAFETY: an `Avx512Vnni` exists only where the CPU has AVX-512F,
        // BW and VNNI, AVX2 and FMA.
        unsafe { quantized_rows_vnni(self, w, x, first, rows, out) }
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx2,fma")]
fn quantized_rows_bw(
    s: Avx512Bw,
    w: &PackedMatrix,
    x: &QuantizedRows,
    first: usize,
    rows: usize,
    out: &mut Columns,
) {
    quantized_kernels::rows(s, w, x, first, rows, out)
}

#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma")]
fn quantized_rows_vnni(
    s: Avx512Vnni,
    w: &PackedMatrix,
    x: &QuantizedRows,
    first: usize,
    rows: usize,
    out: &mut Columns,
) {
    quantized_kernels::rows(s, w, x, first, rows, out)
}

/// The [`Int8Simd`] operations both AVX-512 tokens share (all but `dot`),
/// two blocks per vector: block `b` in bytes 0..32 (i32 lanes 0..8), block
/// `b + 1` in bytes 32..64 (lanes 8..16). Inlined into the
/// `#[target_feature]` functions above, which enable AVX-512F and BW.
/// Safety of every `unsafe` block: the token proves the features; the loads
/// read exactly the two block arrays they are given.
mod two_blocks {
    use std::arch::x86_64::*;

    #[inline(always)]
    pub fn load_q8(blocks: &[[i8; 32]]) -> __m512i {
        let pair: &[[i8; 32]; 2] = &blocks.as_chunks::<2>().0[0];
        unsafe { _mm512_loadu_si512(pair.as_ptr().cast()) }
    }

    #[inline(always)]
    pub fn unpack_q4(blocks: &[[u8; 16]]) -> __m512i {
        let pair: &[[u8; 16]; 2] = &blocks.as_chunks::<2>().0[0];
        unsafe {
            let packed = _mm256_loadu_si256(pair.as_ptr().cast());
            let nibble = _mm256_set1_epi8(0x0F);
            let low = _mm256_and_si256(packed, nibble);
            let high = _mm256_and_si256(_mm256_srli_epi16::<4>(packed), nibble);
            // [b low, b+1 low, b high, b+1 high] -> [b low, b high, b+1
            // low, b+1 high] (128-bit lanes 0, 2, 1, 3).
            let v = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(low), high);
            _mm512_shuffle_i64x2::<0b11_01_10_00>(v, v)
        }
    }

    #[inline(always)]
    pub fn abs_and_sign(w: __m512i, x: __m512i) -> (__m512i, __m512i) {
        unsafe {
            let negative = _mm512_movepi8_mask(w);
            let signed = _mm512_mask_sub_epi8(x, negative, _mm512_setzero_si512(), x);
            (_mm512_abs_epi8(w), signed)
        }
    }

    /// maddubs: u8 x i8 pairs summed to i16 (no saturation: |products| <=
    /// 2 x 127 x 127 < 2^15), then pairs of i16 summed to i32.
    #[inline(always)]
    pub fn dot_maddubs(unsigned: __m512i, signed: __m512i) -> __m512i {
        unsafe { _mm512_madd_epi16(_mm512_maddubs_epi16(unsigned, signed), _mm512_set1_epi16(1)) }
    }

    /// vpdpbusd: four u8 x i8 products summed into each i32 lane at once
    /// (AVX-512 VNNI); the same sums as [`dot_maddubs`].
    #[inline(always)]
    pub fn dot_vnni(unsigned: __m512i, signed: __m512i) -> __m512i {
        unsafe { _mm512_dpbusd_epi32(_mm512_setzero_si512(), unsigned, signed) }
    }

    /// `[d[0]; 8]` then `[d[1]; 8]`: one 8-byte load and one permute.
    #[inline(always)]
    pub fn block_scales(d: &[f32]) -> __m512 {
        let pair: &[f32; 2] = &d.as_chunks::<2>().0[0];
        unsafe {
            let both = _mm_castpd_ps(_mm_load_sd(pair.as_ptr().cast()));
            let lanes = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
            _mm512_permutexvar_ps(lanes, _mm512_castps128_ps512(both))
        }
    }

    #[inline(always)]
    pub fn scaled_add(acc: __m512, dot: __m512i, scale: __m512) -> __m512 {
        unsafe { _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), scale, acc) }
    }
}

macro_rules! two_block_int8 {
    ($token:ty, $dot:path) => {
        impl Int8Simd for $token {
            const BLOCKS: usize = 2;
            const WIDE_TILES: bool = true;
            type I = __m512i;
            type F = __m512;

            #[inline(always)]
            fn zero(self) -> __m512 {
                // SAFETY: the token proves AVX-512F.
                unsafe { _mm512_setzero_ps() }
            }
            #[inline(always)]
            fn load_q8(self, blocks: &[[i8; 32]]) -> __m512i {
                two_blocks::load_q8(blocks)
            }
            #[inline(always)]
            fn unpack_q4(self, blocks: &[[u8; 16]]) -> __m512i {
                two_blocks::unpack_q4(blocks)
            }
            #[inline(always)]
            fn abs_and_sign(self, w: __m512i, x: __m512i) -> (__m512i, __m512i) {
                two_blocks::abs_and_sign(w, x)
            }
            #[inline(always)]
            fn dot(self, unsigned: __m512i, signed: __m512i) -> __m512i {
                $dot(unsigned, signed)
            }
            #[inline(always)]
            fn block_scales(self, d: &[f32]) -> __m512 {
                two_blocks::block_scales(d)
            }
            #[inline(always)]
            fn mul(self, a: __m512, b: __m512) -> __m512 {
                // SAFETY: the token proves AVX-512F.
                unsafe { _mm512_mul_ps(a, b) }
            }
            #[inline(always)]
            fn scaled_add(self, acc: __m512, dot: __m512i, scale: __m512) -> __m512 {
                two_blocks::scaled_add(acc, dot, scale)
            }
            #[inline(always)]
            fn sum(self, a: __m512) -> f32 {
                // SAFETY: the token proves AVX-512F.
                unsafe { _mm512_reduce_add_ps(a) }
            }
        }
    };
}

two_block_int8!(Avx512Bw, two_blocks::dot_maddubs);
two_block_int8!(Avx512Vnni, two_blocks::dot_vnni);

/// Proof that this process runs the bf16 linear layers (AVX-512F and
/// AVX512_BF16).
#[derive(Clone, Copy, Debug)]
pub struct Avx512Bf16(());

impl Avx512Bf16 {
    /// Some when the AVX-512 level runs and the CPU has AVX512_BF16.
    pub fn get() -> Option<Avx512Bf16> {
        Avx512::get()
            .filter(|_| std::is_x86_feature_detected!("avx512bf16"))
            .map(|_| Avx512Bf16(()))
    }

    /// The AVX-512 level's token: bf16 runs only at that level.
    pub fn avx512(self) -> Avx512 {
        Avx512(())
    }

    /// `out = x W^T + b` for `x`'s rows, `W` packed as bf16 pairs
    /// (`PackedLinear::new_bf16`).
    pub fn linear(self, w: &LinearPanels, x: &[f32], out: &mut [f32]) {
        // SAFETY: an `Avx512Bf16` exists only where the CPU has AVX-512F,
        // AVX512_BF16, AVX2 and FMA.
        unsafe { bf16_linear::linear(w, x, out) }
    }

    /// `x` (even length) as bf16 pairs into `out` (half its length),
    /// rounded to nearest even, the even input in each u32's low half.
    pub(crate) fn to_pairs(self, x: &[f32], out: &mut [u32]) {
        assert_eq!(x.len(), 2 * out.len());
        // SAFETY: as in `linear`.
        unsafe { bf16_linear::to_pairs(x, out) }
    }
}

/// The bf16 linear layer: weights and activations rounded to bf16, products
/// summed in f32 by `vdpbf16ps` (two products per lane per instruction).
/// The blocking is `f32_kernels::linear`'s: `MR`-row panels of the input,
/// `KC` inputs at a time, 32-output weight panels; a weight panel holds, per
/// pair of inputs `(2p, 2p + 1)` and output lane, the two bf16 weights in one
/// u32 (the even input in the low half), which is what `vdpbf16ps` pairs.
mod bf16_linear {
    use std::arch::x86_64::*;

    use crate::layout::{KC, LinearPanels, MC, MR, bf16_pair as pair};

    const NR: usize = 32;

    #[inline(always)]
    fn load_pairs(x: &[u32]) -> __m512bh {
        let lanes: [u32; 16] = x[..16].as_chunks::<16>().0[0];
        // SAFETY: `[u32; 16]` and `__m512bh` have the same size, every bit
        // pattern valid for both.
        unsafe { std::mem::transmute::<[u32; 16], __m512bh>(lanes) }
    }

    #[target_feature(enable = "avx512f,avx512bf16,avx2,fma")]
    pub fn linear(w: &LinearPanels, x: &[f32], out: &mut [f32]) {
        let (inputs, outputs) = (w.inputs, w.outputs);
        let rows = x.len() / inputs;
        assert_eq!(w.nr, NR);
        assert!(inputs.is_multiple_of(2) && KC.is_multiple_of(2));
        assert_eq!(w.bf16_panels.len(), outputs.div_ceil(NR) * inputs / 2 * NR);
        assert_eq!(out.len(), rows * outputs);
        let panels = outputs.div_ceil(NR);
        let mut packed = vec![0u32; MC * KC / 2];
        let mut k0 = 0;
        while k0 < inputs {
            let kc = KC.min(inputs - k0);
            let first = k0 == 0;
            let mut i0 = 0;
            while i0 < rows {
                let mc = MC.min(rows - i0);
                let row_panels = mc.div_ceil(MR);
                // Rows i0.. in MR-row panels, pair-major: [pair][row]. A
                // row's bf16 values in order are its pairs (the even input
                // in the low half), converted 32 at a time.
                let mut pairs = [0u32; KC / 2];
                for p in 0..row_panels {
                    let panel = &mut packed[p * kc / 2 * MR..(p + 1) * kc / 2 * MR];
                    for r in 0..MR {
                        let row = i0 + p * MR + r;
                        if row < rows {
                            let src = &x[row * inputs + k0..row * inputs + k0 + kc];
                            to_pairs(src, &mut pairs[..kc / 2]);
                        } else {
                            pairs.fill(0);
                        }
                        for (kp, v) in pairs[..kc / 2].iter().enumerate() {
                            panel[kp * MR + r] = *v;
                        }
                    }
                }
                for panel in 0..panels {
                    let base = (panel * inputs / 2 + k0 / 2) * NR;
                    let b = &w.bf16_panels[base..base + kc / 2 * NR];
                    let bias = &w.bias[panel * NR..(panel + 1) * NR];
                    let cols = NR.min(outputs - panel * NR);
                    for p in 0..row_panels {
                        let r0 = i0 + p * MR;
                        let tile_rows = MR.min(rows - r0);
                        let a = &packed[p * kc / 2 * MR..(p + 1) * kc / 2 * MR];
                        let at = r0 * outputs + panel * NR;
                        if tile_rows == MR && cols == NR {
                            let c = &mut out[at..at + (MR - 1) * outputs + NR];
                            tile(a, b, c, outputs, first, bias);
                        } else {
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

    /// `x` (even length) as bf16 pairs, rounded to nearest even: 32 values
    /// per `vcvtne2ps2bf16`, the rest one pair at a time.
    #[target_feature(enable = "avx512f,avx512bf16,avx2,fma")]
    #[inline]
    pub(super) fn to_pairs(x: &[f32], out: &mut [u32]) {
        let (blocks, rest) = x.as_chunks::<32>();
        let (out_blocks, out_rest) = out.as_chunks_mut::<16>();
        for (src, dst) in blocks.iter().zip(out_blocks.iter_mut()) {
            // SAFETY: same-size reinterpretations of f32 and u32 arrays.
            unsafe {
                let lo = std::mem::transmute::<[f32; 16], __m512>(src[..16].as_chunks::<16>().0[0]);
                let hi = std::mem::transmute::<[f32; 16], __m512>(src[16..].as_chunks::<16>().0[0]);
                // The second operand fills the low half.
                *dst = std::mem::transmute::<__m512bh, [u32; 16]>(_mm512_cvtne2ps_pbh(hi, lo));
            }
        }
        for (two, dst) in rest.chunks_exact(2).zip(out_rest.iter_mut()) {
            *dst = pair(two[0], two[1]);
        }
    }

    /// One `MR x 32` tile: `c (+)= a b`, from the bias when `first`.
    #[target_feature(enable = "avx512f,avx512bf16,avx2,fma")]
    #[inline]
    fn tile(a: &[u32], b: &[u32], c: &mut [f32], ldc: usize, first: bool, bias: &[f32]) {
        let (a_steps, _) = a.as_chunks::<MR>();
        let (b_steps, _) = b.as_chunks::<NR>();
        assert_eq!(a_steps.len(), b_steps.len());
        let mut acc = [[_mm512_setzero_ps(); 2]; MR];
        for (ak, bk) in a_steps.iter().zip(b_steps) {
            let (b0, b1) = (load_pairs(bk), load_pairs(&bk[16..]));
            for r in 0..MR {
                // SAFETY: same-size reinterpretation of a broadcast pair.
                let v = unsafe {
                    std::mem::transmute::<__m512i, __m512bh>(_mm512_set1_epi32(ak[r] as i32))
                };
                acc[r][0] = _mm512_dpbf16_ps(acc[r][0], v, b0);
                acc[r][1] = _mm512_dpbf16_ps(acc[r][1], v, b1);
            }
        }
        for (r, acc) in acc.iter().enumerate() {
            let row = &mut c[r * ldc..r * ldc + NR];
            let start: [f32; NR] = if first {
                bias[..NR].as_chunks::<NR>().0[0]
            } else {
                row[..NR].as_chunks::<NR>().0[0]
            };
            let (lo, hi) = start.split_at(16);
            // SAFETY: `[f32; 16]` and `__m512` have the same size.
            let (lo, hi) = unsafe {
                (
                    std::mem::transmute::<[f32; 16], __m512>(lo.as_chunks::<16>().0[0]),
                    std::mem::transmute::<[f32; 16], __m512>(hi.as_chunks::<16>().0[0]),
                )
            };
            let (lo, hi) = (_mm512_add_ps(lo, acc[0]), _mm512_add_ps(hi, acc[1]));
            // SAFETY: as above.
            let (lo, hi) = unsafe {
                (
                    std::mem::transmute::<__m512, [f32; 16]>(lo),
                    std::mem::transmute::<__m512, [f32; 16]>(hi),
                )
            };
            row[..16].copy_from_slice(&lo);
            row[16..NR].copy_from_slice(&hi);
        }
    }
}
