//! The batched Q4_1 / Q8_0 products, written once over [`Int8Simd`] and
//! instantiated per instruction set by the per-architecture files inside
//! their `#[target_feature]` functions (`x86_avx2.rs`: one block per 256-bit
//! vector, `maddubs`; `x86_avx512.rs`: two blocks per 512-bit vector,
//! `maddubs` with AVX-512BW or `vpdpbusd` with AVX-512 VNNI). Every function
//! here is `#[inline(always)]`, so it compiles inside that caller, to that
//! instruction set.
//!
//! The arithmetic is llama.cpp's (see `quantized.rs`): per block, the
//! integer dot product of the weights' and the activations' 8-bit values,
//! scaled by both blocks' scales into an f32 accumulator; Q4_1 adds its
//! minimum times the activations' scaled sum. A token's result depends only
//! on its own row: the tile shapes change which tokens share a pass over
//! the weights, never the order of a sum.

use crate::layout::{Packed, PackedMatrix, QuantizedRows};
use crate::simd::Int8Simd;
use crate::team::Columns;

/// Rows `first..first + rows` of `W x` into `out` (`[tokens, W's rows]`,
/// these rows' columns): for Q8_0, and for Q4_1 in decode batches (at most
/// 16 tokens), tiles of 2 rows x 8 tokens where the level has the registers
/// for them ([`Int8Simd::WIDE_TILES`]); then 2 rows
/// x 4 tokens (each weight block unpacked once for 8 or 4 tokens), then the
/// remaining tokens 4 rows at a time. `W`'s blocks per row must be a multiple of
/// `S::BLOCKS`.
#[inline(always)]
pub(crate) fn rows<S: Int8Simd>(
    s: S,
    w: &PackedMatrix,
    x: &QuantizedRows,
    first: usize,
    rows: usize,
    out: &mut Columns,
) {
    assert!(w.blocks.is_multiple_of(S::BLOCKS));
    let tokens = x.tokens;
    let mut t = 0;
    // Measured on a Xeon (AVX-512 VNNI, 3 interleaved runs): 2 x 8 tiles
    // gave Q8_0 +7% at 8 sequences and +10% at 16, but Q4_1 prompts -10%;
    // Q4_1 at 8 sequences +3% (378-394 -> 397-406 tokens/s), 16 the same.
    if S::WIDE_TILES && (matches!(w.weights, Packed::Q8_0 { .. }) || tokens <= 16) {
        while t + 8 <= tokens {
            token_tiles::<S, 8>(s, w, x, first, rows, t, out);
            t += 8;
        }
    }
    while t + 4 <= tokens {
        token_tiles::<S, 4>(s, w, x, first, rows, t, out);
        t += 4;
    }
    while t < tokens {
        let mut r = 0;
        while r + 4 <= rows {
            let sums = tile::<S, 4, 1>(s, w, x, first + r, t);
            for (i, row) in sums.iter().enumerate() {
                out.set(t, first + r + i, row[0]);
            }
            r += 4;
        }
        while r < rows {
            out.set(t, first + r, tile::<S, 1, 1>(s, w, x, first + r, t)[0][0]);
            r += 1;
        }
        t += 1;
    }
}

/// Tokens `t..t + T` of rows `first..first + rows`: 2 rows at a time, then
/// the last odd row alone.
#[inline(always)]
fn token_tiles<S: Int8Simd, const T: usize>(
    s: S,
    w: &PackedMatrix,
    x: &QuantizedRows,
    first: usize,
    rows: usize,
    t: usize,
    out: &mut Columns,
) {
    let mut r = 0;
    while r + 2 <= rows {
        let sums = tile::<S, 2, T>(s, w, x, first + r, t);
        for (i, row) in sums.iter().enumerate() {
            for (j, v) in row.iter().enumerate() {
                out.set(t + j, first + r + i, *v);
            }
        }
        r += 2;
    }
    while r < rows {
        let sums = tile::<S, 1, T>(s, w, x, first + r, t);
        for (j, v) in sums[0].iter().enumerate() {
            out.set(t + j, first + r, *v);
        }
        r += 1;
    }
}

/// `R` rows from `row` times `T` tokens from `token`.
#[inline(always)]
fn tile<S: Int8Simd, const R: usize, const T: usize>(
    s: S,
    w: &PackedMatrix,
    x: &QuantizedRows,
    row: usize,
    token: usize,
) -> [[f32; T]; R] {
    let nb = w.blocks;
    let x_range = |j: usize| (token + j) * nb..(token + j + 1) * nb;
    let w_range = |i: usize| (row + i) * nb..(row + i + 1) * nb;
    let x_q: [&[[i8; 32]]; T] = std::array::from_fn(|j| &x.qs[x_range(j)]);
    let x_d: [&[f32]; T] = std::array::from_fn(|j| &x.d[x_range(j)]);
    let mut acc = [[s.zero(); T]; R];
    let mut b = 0;
    match &w.weights {
        Packed::Q4_1 { d, qs, .. } => {
            let w_q: [&[[u8; 16]]; R] = std::array::from_fn(|i| &qs[w_range(i)]);
            let w_d: [&[f32]; R] = std::array::from_fn(|i| &d[w_range(i)]);
            while b < nb {
                // Nibbles are unsigned 0..=15: the weights are the unsigned
                // operand as they are.
                // Loops, not `array::from_fn`: a closure does not inherit
                // the caller's target features, so its intrinsics would be
                // calls instead of instructions.
                let mut wv = [s.unpack_q4(&w_q[0][b..]); R];
                let mut ws = [s.block_scales(&w_d[0][b..]); R];
                for i in 1..R {
                    wv[i] = s.unpack_q4(&w_q[i][b..]);
                    ws[i] = s.block_scales(&w_d[i][b..]);
                }
                for j in 0..T {
                    let xv = s.load_q8(&x_q[j][b..]);
                    let xs = s.block_scales(&x_d[j][b..]);
                    for i in 0..R {
                        let dot = s.dot(wv[i], xv);
                        acc[i][j] = s.scaled_add(acc[i][j], dot, s.mul(ws[i], xs));
                    }
                }
                b += S::BLOCKS;
            }
        }
        Packed::Q8_0 { d, qs } => {
            let w_q: [&[[i8; 32]]; R] = std::array::from_fn(|i| &qs[w_range(i)]);
            let w_d: [&[f32]; R] = std::array::from_fn(|i| &d[w_range(i)]);
            while b < nb {
                let mut wv = [s.load_q8(&w_q[0][b..]); R];
                let mut ws = [s.block_scales(&w_d[0][b..]); R];
                for i in 1..R {
                    wv[i] = s.load_q8(&w_q[i][b..]);
                    ws[i] = s.block_scales(&w_d[i][b..]);
                }
                for j in 0..T {
                    let xv = s.load_q8(&x_q[j][b..]);
                    let xs = s.block_scales(&x_d[j][b..]);
                    for i in 0..R {
                        let (unsigned, signed) = s.abs_and_sign(wv[i], xv);
                        let dot = s.dot(unsigned, signed);
                        acc[i][j] = s.scaled_add(acc[i][j], dot, s.mul(ws[i], xs));
                    }
                }
                b += S::BLOCKS;
            }
        }
    }
    let mut sums = [[0f32; T]; R];
    for i in 0..R {
        for j in 0..T {
            sums[i][j] = s.sum(acc[i][j]);
        }
    }
    if let Packed::Q4_1 { m, .. } = &w.weights {
        // The `m * x` part of each block: m_w . s_x over the blocks.
        for (i, row_sums) in sums.iter_mut().enumerate() {
            let w_m = &m[w_range(i)];
            for (j, v) in row_sums.iter_mut().enumerate() {
                *v += dot(w_m, &x.s[x_range(j)]);
            }
        }
    }
    sums
}

/// `a . b` in eight independent partial sums, so that the compiler makes
/// it vector code for the caller's instruction set (one running sum would
/// wait on each addition's latency).
#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.as_chunks::<8>(), b.as_chunks::<8>());
    for (x, y) in ca.0.iter().zip(cb.0) {
        for k in 0..8 {
            acc[k] += x[k] * y[k];
        }
    }
    let mut sum = 0f32;
    for (x, y) in ca.1.iter().zip(cb.1) {
        sum += x * y;
    }
    for v in acc {
        sum += v;
    }
    sum
}
