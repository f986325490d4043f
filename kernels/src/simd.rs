//! The f32 vector operations the encoder kernels are written over, once:
//! `f32_kernels.rs` holds the kernel bodies, generic over [`Simd`]; each
//! per-architecture file implements [`Simd`] for its token (`x86_avx2.rs`:
//! 8 lanes, `x86_avx512.rs`: 16 lanes) and instantiates the bodies inside
//! `#[target_feature]` functions, so one source compiles to each instruction
//! set and the level is chosen at run time (`crate::cpu`).
//!
//! Every method is `#[inline(always)]` in its implementations: inlined into
//! a `#[target_feature]` caller, the intrinsics compile to that instruction
//! set. A value of an implementing type is the proof that the CPU has the
//! features, which is what makes these methods safe to call.

/// An f32 SIMD instruction set, as a zero-sized token made only by detection.
pub(crate) trait Simd: Copy + Send + Sync + 'static {
    /// f32 lanes per vector.
    const LANES: usize;
    /// A vector of [`Simd::LANES`] f32.
    type F: Copy;

    fn splat(self, v: f32) -> Self::F;
    /// The first `LANES` values of `x` (panics when `x` is shorter).
    fn load(self, x: &[f32]) -> Self::F;
    /// Into the first `LANES` values of `x` (panics when `x` is shorter).
    fn store(self, x: &mut [f32], v: Self::F);
    fn add(self, a: Self::F, b: Self::F) -> Self::F;
    fn sub(self, a: Self::F, b: Self::F) -> Self::F;
    fn mul(self, a: Self::F, b: Self::F) -> Self::F;
    fn div(self, a: Self::F, b: Self::F) -> Self::F;
    fn max(self, a: Self::F, b: Self::F) -> Self::F;
    fn min(self, a: Self::F, b: Self::F) -> Self::F;
    /// `a * b + c`, fused (one rounding).
    fn mul_add(self, a: Self::F, b: Self::F, c: Self::F) -> Self::F;
    /// `c - a * b`, fused.
    fn neg_mul_add(self, a: Self::F, b: Self::F, c: Self::F) -> Self::F;
    /// `|a|` (the sign bit cleared).
    fn abs(self, a: Self::F) -> Self::F;
    /// `-a` (the sign bit flipped).
    fn neg(self, a: Self::F) -> Self::F;
    /// `magnitude` (sign bit clear) with the sign bit of `sign`.
    fn with_sign_of(self, magnitude: Self::F, sign: Self::F) -> Self::F;
    /// To the nearest integer, ties to even.
    fn round(self, a: Self::F) -> Self::F;
    /// `2^n` for integer-valued `n` in -126..=127, built in the exponent bits.
    fn pow2(self, n: Self::F) -> Self::F;
    /// `y` where `x >= bound`, `0` where `x < bound`.
    fn zero_where_below(self, x: Self::F, bound: Self::F, y: Self::F) -> Self::F;
    /// The sum of the lanes.
    fn sum(self, a: Self::F) -> f32;
    /// The largest lane.
    fn max_lane(self, a: Self::F) -> f32;

    fn zero(self) -> Self::F {
        self.splat(0.0)
    }
}

/// The 8-bit integer block products the quantized kernels are written over
/// (`quantized_kernels.rs`): a vector holds [`Int8Simd::BLOCKS`] quantization
/// blocks of 32 values, and a product of two such vectors leaves each
/// block's dot product spread over that block's i32 lanes, to be scaled by
/// the block's scale and summed in f32.
pub(crate) trait Int8Simd: Copy + Send + Sync + 'static {
    /// Blocks of 32 values per vector (1 for 256-bit, 2 for 512-bit).
    const BLOCKS: usize;
    /// Whether 2 x 8 tiles fit the registers (16 accumulators: AVX-512's 32
    /// vector registers, not AVX2's 16).
    const WIDE_TILES: bool;
    /// A vector of bytes, or of i32 lanes.
    type I: Copy;
    /// A vector of f32 lanes.
    type F: Copy;

    fn zero(self) -> Self::F;
    /// `BLOCKS` signed 8-bit blocks, the first `BLOCKS` of `blocks`.
    fn load_q8(self, blocks: &[[i8; 32]]) -> Self::I;
    /// `BLOCKS` Q4 blocks (16 bytes each, value `i` in the low nibble of
    /// byte `i` for `i < 16`, in the high nibble of byte `i - 16` after),
    /// unpacked to one byte per value in 0..=15.
    fn unpack_q4(self, blocks: &[[u8; 16]]) -> Self::I;
    /// `(|w|, x with w's signs)`: the unsigned-times-signed operands whose
    /// product is `w * x` byte by byte.
    fn abs_and_sign(self, w: Self::I, x: Self::I) -> (Self::I, Self::I);
    /// Unsigned bytes times signed bytes, summed in i32 lanes, each lane
    /// within one block (no saturation for operands up to 127 in size).
    fn dot(self, unsigned: Self::I, signed: Self::I) -> Self::I;
    /// The first `BLOCKS` of `d`, each over its block's lanes.
    fn block_scales(self, d: &[f32]) -> Self::F;
    fn mul(self, a: Self::F, b: Self::F) -> Self::F;
    /// `acc + f32(dot) * scale`.
    fn scaled_add(self, acc: Self::F, dot: Self::I, scale: Self::F) -> Self::F;
    /// The sum of the lanes.
    fn sum(self, a: Self::F) -> f32;
}
