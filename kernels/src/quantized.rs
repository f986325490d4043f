//! Batched quantized matrix products on x86-64 with AVX2 + FMA, for the
//! generation step: `y[t] = W x[t]` for every token `t` of a step, with `W`
//! kept in its GGUF quantization (Q4_1 or Q8_0) and each weight block read
//! once per step for all the step's tokens, not once per token as candle's
//! per-row vector products do. That is what lets a step over 8 sequences cost
//! little more than a step over one.
//!
//! The arithmetic is llama.cpp's: activations are quantized per block of 32
//! to i8 with an f32 scale (and, for Q4_1, the scaled sum of the block), and
//! each block's integer dot product is scaled into an f32 accumulator. Weight
//! scales are converted from f16 to f32 once, at load.
//!
//! The SIMD bodies are written once (`quantized_kernels.rs`) and compiled
//! per level ([`Int8Kernels`]): AVX2 (one block per vector, `maddubs`),
//! AVX-512BW (two blocks per vector, `maddubs`) and AVX-512 VNNI (two blocks,
//! `vpdpbusd`), the highest the process runs chosen at run time.
//! [`reference_matmul`] is the same arithmetic in plain Rust; the tests hold
//! every level the machine has to it.

use std::ops::Range;
use std::sync::Mutex;

use rayon::prelude::*;

use crate::ggml_blocks;
pub use crate::ggml_blocks::StoredBlocks;
use crate::layout::{BLOCK, Packed};
pub use crate::layout::{BlockType, PackedMatrix, QuantizedRows};
use crate::team::{Columns, Team, parts_mut, share, take};

use crate::x86_avx2::Avx2;
use crate::x86_avx512::{Avx512Bw, Avx512Vnni};

/// The 8-bit block products at one instruction-set level.
#[derive(Clone, Copy, Debug)]
pub enum Int8Kernels {
    Reference,
    Avx2(Avx2),
    Avx512Bw(Avx512Bw),
    Avx512Vnni(Avx512Vnni),
}

impl Int8Kernels {
    /// The highest level this process runs (see [`crate::cpu`]).
    pub fn current() -> Int8Kernels {
        *Int8Kernels::all().last().unwrap_or(&Int8Kernels::Reference)
    }

    /// Every level this process may run, lowest first, the references
    /// first of all (for tests that hold each to them).
    pub fn all() -> Vec<Int8Kernels> {
        let mut all = vec![Int8Kernels::Reference];
        all.extend(Avx2::get().map(Int8Kernels::Avx2));
        all.extend(Avx512Bw::get().map(Int8Kernels::Avx512Bw));
        all.extend(Avx512Vnni::get().map(Int8Kernels::Avx512Vnni));
        all
    }

    pub fn name(self) -> &'static str {
        match self {
            Int8Kernels::Reference => "reference",
            Int8Kernels::Avx2(_) => "avx2",
            Int8Kernels::Avx512Bw(_) => "avx512bw",
            Int8Kernels::Avx512Vnni(_) => "avx512vnni",
        }
    }

    /// Rows `first..first + rows` of `W x` into their columns of `out`
    /// (`[tokens, W's rows]`). The AVX-512 levels take two blocks at a
    /// time: a matrix whose rows hold an odd number of blocks runs at AVX2.
    fn rows(
        self,
        w: &PackedMatrix,
        x: &QuantizedRows,
        first: usize,
        rows: usize,
        out: &mut Columns,
    ) {
        let even = w.blocks.is_multiple_of(2);
        match self {
            Int8Kernels::Avx512Vnni(t) if even => t.quantized_rows(w, x, first, rows, out),
            Int8Kernels::Avx512Bw(t) if even => t.quantized_rows(w, x, first, rows, out),
            Int8Kernels::Avx2(t) => t.quantized_rows(w, x, first, rows, out),
            // An AVX-512 token exists only at a level that includes AVX2.
            Int8Kernels::Avx512Vnni(_) | Int8Kernels::Avx512Bw(_) => match Avx2::get() {
                Some(t) => t.quantized_rows(w, x, first, rows, out),
                None => reference_rows(w, x, first, rows, out),
            },
            Int8Kernels::Reference => reference_rows(w, x, first, rows, out),
        }
    }
}

/// (token, block) pairs from which [`PackedMatrix::matmul_on`] quantizes
/// its input on the team rather than on the caller alone.
const QUANTIZE_ON_TEAM_BLOCKS: usize = 64;

/// Whether the SIMD kernels run in this process: the CPU has AVX2 and FMA
/// and `SLUICE_CPU_KERNELS` did not lower the level (see [`crate::cpu`]).
pub fn available() -> bool {
    Avx2::get().is_some()
}

impl PackedMatrix {
    /// A `[rows, cols]` matrix of GGUF blocks (`data`, row-major, as GGUF
    /// stores them) in the products' packing, every weight as stored;
    /// `None` when the rows are not whole blocks or the data is not `rows x
    /// cols` of them.
    pub fn from_stored(
        kind: StoredBlocks,
        rows: usize,
        cols: usize,
        data: &[u8],
    ) -> Option<PackedMatrix> {
        if !cols.is_multiple_of(kind.block_values()) {
            return None;
        }
        Some(PackedMatrix {
            rows,
            cols,
            blocks: cols / BLOCK,
            weights: ggml_blocks::unpack(kind, rows * cols, data)?,
        })
    }

    /// The matrix requantized to Q8_0: its weights dequantized, then each
    /// block of 32 quantized as ggml's `quantize_row_q8_0` does (scale
    /// `amax / 127` kept in f16, values rounded half away from zero).
    pub fn to_q8_0(&self) -> PackedMatrix {
        let dense = ggml_blocks::dequantize(&self.weights);
        let (mut d, mut qs) = (Vec::new(), Vec::new());
        for block in dense.chunks_exact(BLOCK) {
            let (q, scale, _) = quantize_block(block);
            d.push(scale);
            qs.push(q);
        }
        PackedMatrix {
            rows: self.rows,
            cols: self.cols,
            blocks: self.blocks,
            weights: Packed::Q8_0 { d, qs },
        }
    }

    /// The matrices' rows one after another, as one matrix (so that one
    /// product, one quantization of the input and one parallel region serve
    /// them all: Q, K and V; gate and up). `None` unless all have the same
    /// inputs and block type.
    pub fn stack(parts: &[&PackedMatrix]) -> Option<PackedMatrix> {
        let first = parts.first()?;
        let (cols, blocks) = (first.cols, first.blocks);
        if parts.iter().any(|p| p.cols != cols) {
            return None;
        }
        let weights = match &first.weights {
            Packed::Q4_1 { .. } => {
                let (mut d, mut m, mut qs) = (Vec::new(), Vec::new(), Vec::new());
                for p in parts {
                    let Packed::Q4_1 {
                        d: pd,
                        m: pm,
                        qs: pq,
                    } = &p.weights
                    else {
                        return None;
                    };
                    d.extend_from_slice(pd);
                    m.extend_from_slice(pm);
                    qs.extend_from_slice(pq);
                }
                Packed::Q4_1 { d, m, qs }
            }
            Packed::Q8_0 { .. } => {
                let (mut d, mut qs) = (Vec::new(), Vec::new());
                for p in parts {
                    let Packed::Q8_0 { d: pd, qs: pq } = &p.weights else {
                        return None;
                    };
                    d.extend_from_slice(pd);
                    qs.extend_from_slice(pq);
                }
                Packed::Q8_0 { d, qs }
            }
        };
        Some(PackedMatrix {
            rows: parts.iter().map(|p| p.rows).sum(),
            cols,
            blocks,
            weights,
        })
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    /// The block type the weights are held in.
    pub fn block_type(&self) -> BlockType {
        match self.weights {
            Packed::Q4_1 { .. } => BlockType::Q4_1,
            Packed::Q8_0 { .. } => BlockType::Q8_0,
        }
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// `x` is `[tokens, cols]` row-major; returns `[tokens, rows]`, at
    /// the highest level this process runs ([`Int8Kernels::current`]; the
    /// plain-Rust arithmetic on a CPU without AVX2 + FMA).
    pub fn matmul(&self, x: &[f32], tokens: usize) -> Vec<f32> {
        self.matmul_with(Int8Kernels::current(), x, tokens)
    }

    /// [`PackedMatrix::matmul`] at the given level.
    pub fn matmul_with(&self, kernels: Int8Kernels, x: &[f32], tokens: usize) -> Vec<f32> {
        // A task per thread: more tasks cost more in hand-offs than they gain.
        let parts = rayon::current_num_threads().max(1);
        let xq = quantize_rows(x, tokens, self.cols);
        self.product_in_parts(kernels, &xq, parts, |part| {
            (0..parts).into_par_iter().for_each(part)
        })
    }

    /// [`PackedMatrix::matmul`] with the rows shared among `team`'s members
    /// (the generation step's products: no sleeping threads to wake).
    pub fn matmul_on(&self, team: &Team, x: &[f32], tokens: usize) -> Vec<f32> {
        // The input's quantization shared too, where it is more than a
        // hand-off's worth (a one-token decode's is not).
        let xq = if tokens * self.blocks >= QUANTIZE_ON_TEAM_BLOCKS {
            quantize_rows_in_parts(x, tokens, self.cols, team.size(), |part| team.run(part))
        } else {
            quantize_rows(x, tokens, self.cols)
        };
        self.product_in_parts(Int8Kernels::current(), &xq, team.size(), |part| {
            team.run(part)
        })
    }

    /// The product with quantized activations, in `parts` contiguous shares
    /// of the weight rows (the output's columns), each written in place by
    /// `run_parts`, which calls the part's closure once for each of
    /// `0..parts`, in any order, on any threads.
    fn product_in_parts(
        &self,
        kernels: Int8Kernels,
        xq: &QuantizedRows,
        parts: usize,
        run_parts: impl FnOnce(&(dyn Fn(usize) + Sync)),
    ) -> Vec<f32> {
        let tokens = xq.tokens;
        let mut y = vec![0f32; tokens * self.rows];
        if tokens == 0 {
            return y;
        }
        let shares: Vec<Range<usize>> = (0..parts)
            .map(|part| share(self.rows, parts, part, 4))
            .collect();
        let outs: Vec<Mutex<Columns>> = Columns::split(&mut y, self.rows, &shares)
            .into_iter()
            .map(Mutex::new)
            .collect();
        run_parts(&|part| {
            let mut out = take(&outs[part]);
            let rows = &shares[part];
            kernels.rows(self, xq, rows.start, rows.len(), &mut out);
        });
        drop(outs);
        y
    }
}

/// Matrices over the same inputs run as one product (Q, K and V; gate and
/// up): the input quantized once, each run of parts in one packing as one
/// product, the outputs side by side (`[tokens, all parts' rows]`). A
/// GGUF's mixed types (Q4_K_M's Q4_K beside Q6_K) stack as two runs.
pub struct StackedMatrix {
    /// Consecutive parts of one block type, stacked.
    runs: Vec<PackedMatrix>,
    rows: usize,
    cols: usize,
}

impl StackedMatrix {
    /// `None` unless every part has the same inputs.
    pub fn new(parts: Vec<PackedMatrix>) -> Option<StackedMatrix> {
        let cols = parts.first()?.cols;
        if parts.iter().any(|p| p.cols != cols) {
            return None;
        }
        let rows = parts.iter().map(|p| p.rows).sum();
        let mut runs: Vec<Vec<PackedMatrix>> = Vec::new();
        for part in parts {
            match runs.last_mut() {
                Some(run) if run[0].block_type() == part.block_type() => run.push(part),
                _ => runs.push(vec![part]),
            }
        }
        let runs = runs
            .into_iter()
            .map(|mut run| {
                if run.len() == 1 {
                    run.pop()
                } else {
                    PackedMatrix::stack(&run.iter().collect::<Vec<_>>())
                }
            })
            .collect::<Option<Vec<_>>>()?;
        Some(StackedMatrix { runs, rows, cols })
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// The block types of the runs, in order.
    pub fn block_types(&self) -> Vec<BlockType> {
        self.runs.iter().map(PackedMatrix::block_type).collect()
    }

    /// The stack with its 4-bit runs requantized to Q8_0 (its 8-bit ones
    /// kept), as one run.
    pub fn to_q8_0(&self) -> Option<StackedMatrix> {
        StackedMatrix::new(
            self.runs
                .iter()
                .map(|r| match r.block_type() {
                    BlockType::Q4_1 => r.to_q8_0(),
                    BlockType::Q8_0 => r.clone(),
                })
                .collect(),
        )
    }

    /// `[tokens, rows]` for `x` (`[tokens, cols]`), the rows shared among
    /// `team`'s members.
    pub fn matmul_on(&self, team: &Team, x: &[f32], tokens: usize) -> Vec<f32> {
        if let [one] = self.runs.as_slice() {
            return one.matmul_on(team, x, tokens);
        }
        let xq = if tokens * (self.cols / BLOCK) >= QUANTIZE_ON_TEAM_BLOCKS {
            quantize_rows_in_parts(x, tokens, self.cols, team.size(), |part| team.run(part))
        } else {
            quantize_rows(x, tokens, self.cols)
        };
        let mut y = vec![0f32; tokens * self.rows];
        let mut at = 0;
        for run in &self.runs {
            let part =
                run.product_in_parts(Int8Kernels::current(), &xq, team.size(), |p| team.run(p));
            for (dst, src) in y
                .chunks_exact_mut(self.rows)
                .zip(part.chunks_exact(run.rows))
            {
                dst[at..at + run.rows].copy_from_slice(src);
            }
            at += run.rows;
        }
        y
    }
}

/// `1.5 * 2^23`: `(v + ROUND) - ROUND` is `v` rounded to the nearest
/// integer, ties to even, for `|v| < 2^22`, in plain f32 arithmetic the
/// compiler vectorizes (`round` is a library call per value).
const ROUND: f32 = 12_582_912.0;

/// `v.round()` (ties away from zero, as candle's and ggml's reference
/// quantizations round) for `|v| < 2^22`, without a library call: rounded
/// to even, then a tie moved away from zero. Ties to even instead changed
/// a greedy answer of the test model (a near-tie of two tokens' logits).
#[inline(always)]
fn round_half_away(v: f32) -> f32 {
    let even = (v + ROUND) - ROUND;
    if (v - even).abs() == 0.5 {
        v + 0.5f32.copysign(v)
    } else {
        even
    }
}

/// Quantizes each row of `x` (`[tokens, cols]`) per block of 32.
pub fn quantize_rows(x: &[f32], tokens: usize, cols: usize) -> QuantizedRows {
    quantize_rows_in_parts(x, tokens, cols, 1, |part| part(0))
}

/// [`quantize_rows`] in `parts` contiguous shares of the (token, block)
/// pairs, each part run once by `run_parts`.
fn quantize_rows_in_parts(
    x: &[f32],
    tokens: usize,
    cols: usize,
    parts: usize,
    run_parts: impl FnOnce(&(dyn Fn(usize) + Sync)),
) -> QuantizedRows {
    let blocks = cols / BLOCK;
    let n = tokens * blocks;
    let (mut qs, mut d, mut s) = (vec![[0i8; 32]; n], vec![0f32; n], vec![0f32; n]);
    let shares: Vec<Range<usize>> = (0..parts).map(|p| share(n, parts, p, 1)).collect();
    let lens = || shares.iter().map(|r| r.len());
    let (qs_parts, d_parts, s_parts) = (
        parts_mut(&mut qs, lens()),
        parts_mut(&mut d, lens()),
        parts_mut(&mut s, lens()),
    );
    run_parts(&|part| {
        let (mut q, mut dd, mut ss) = (
            take(&qs_parts[part]),
            take(&d_parts[part]),
            take(&s_parts[part]),
        );
        for (k, at) in shares[part].clone().enumerate() {
            let (t, b) = (at / blocks, at % blocks);
            let block = &x[t * cols + b * BLOCK..t * cols + (b + 1) * BLOCK];
            (q[k], dd[k], ss[k]) = quantize_block(block);
        }
    });
    drop((qs_parts, d_parts, s_parts));
    QuantizedRows {
        tokens,
        blocks,
        qs,
        d,
        s,
    }
}

/// One block of 32: its 8-bit values, scale and scaled sum.
#[inline]
fn quantize_block(block: &[f32]) -> ([i8; 32], f32, f32) {
    let amax = block.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
    let mut q = [0i8; 32];
    let mut sum = 0i32;
    for (dst, v) in q.iter_mut().zip(block) {
        // |v * inv| <= 127: exact integers after the rounding.
        let rounded = round_half_away(v * inv);
        *dst = rounded as i32 as i8;
        sum += rounded as i32;
    }
    // Scales rounded to f16 as ggml stores them (Q8_0's `d`, Q8_1's `d` and
    // `s = f16(sum) * d` in f16), so that the products equal llama.cpp's
    // and candle's up to the order of f32 sums.
    let d16 = half::f16::from_f32(d);
    (
        q,
        d16.to_f32(),
        (half::f16::from_f32(sum as f32) * d16).to_f32(),
    )
}

/// The kernels' arithmetic in plain Rust: `[tokens, rows]` for `x`.
pub fn reference_matmul(w: &PackedMatrix, x: &[f32], tokens: usize) -> Vec<f32> {
    let xq = quantize_rows(x, tokens, w.cols);
    let mut y = vec![0f32; tokens * w.rows];
    if tokens > 0 {
        let all = 0..w.rows;
        let mut out = Columns::split(&mut y, w.rows, std::slice::from_ref(&all));
        reference_rows(w, &xq, 0, w.rows, &mut out[0]);
    }
    y
}

/// Rows `first..first + rows` of `W x`, into their columns of `out`.
fn reference_rows(
    w: &PackedMatrix,
    x: &QuantizedRows,
    first: usize,
    rows: usize,
    out: &mut Columns,
) {
    let tokens = x.tokens;
    for r in 0..rows {
        for t in 0..tokens {
            let mut acc = 0f32;
            for b in 0..w.blocks {
                let wi = (first + r) * w.blocks + b;
                let xi = t * x.blocks + b;
                let xq = &x.qs[xi];
                acc += match &w.weights {
                    Packed::Q4_1 { d, m, qs } => {
                        let q = &qs[wi];
                        let mut dot = 0i32;
                        for j in 0..16 {
                            dot += i32::from(q[j] & 0x0F) * i32::from(xq[j]);
                            dot += i32::from(q[j] >> 4) * i32::from(xq[j + 16]);
                        }
                        d[wi] * x.d[xi] * dot as f32 + m[wi] * x.s[xi]
                    }
                    Packed::Q8_0 { d, qs } => {
                        let q = &qs[wi];
                        let dot: i32 = q
                            .iter()
                            .zip(xq)
                            .map(|(a, b)| i32::from(*a) * i32::from(*b))
                            .sum();
                        d[wi] * x.d[xi] * dot as f32
                    }
                };
            }
            out.set(t, first + r, acc);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use candle_core::quantized::{GgmlDType, QTensor};
    use candle_core::{Device, Tensor};

    use super::*;
    use crate::test_values::values;

    fn pack(q: &QTensor) -> Option<PackedMatrix> {
        let (rows, cols) = q.shape().dims2().unwrap();
        let kind = match q.dtype() {
            GgmlDType::Q4_1 => StoredBlocks::Q4_1,
            GgmlDType::Q8_0 => StoredBlocks::Q8_0,
            _ => return None,
        };
        PackedMatrix::from_stored(kind, rows, cols, &q.data().unwrap())
    }

    /// The SIMD kernels at every level the machine has equal the plain-Rust
    /// arithmetic, for both weight types, every tile shape (token counts
    /// 1..=13 cover the 8- and 4-token tiles and the remainders; 70 rows cover the
    /// 2- and 4-row tiles, their remainders and a partial parallel chunk),
    /// rows of an odd (96 columns: 3 blocks, which the AVX-512 levels hand
    /// to AVX2) and an even number of blocks (128 columns), and they
    /// approximate the dense product within the activation quantization's
    /// error.
    #[test]
    fn kernels_match_the_reference_and_the_dense_product() {
        let rows = 70;
        for cols in [96, 128] {
            let dense = values(rows * cols, 1);
            let w_tensor = Tensor::from_vec(dense.clone(), (rows, cols), &Device::Cpu).unwrap();
            for dtype in [GgmlDType::Q4_1, GgmlDType::Q8_0] {
                let q = QTensor::quantize(&w_tensor, dtype).unwrap();
                let w = pack(&q).unwrap();
                let dequantized = q.dequantize(&Device::Cpu).unwrap();
                let w_dense: Vec<f32> = dequantized.flatten_all().unwrap().to_vec1().unwrap();
                for tokens in 1..=13 {
                    let x = values(tokens * cols, 7 + tokens as u64);
                    let reference = reference_matmul(&w, &x, tokens);
                    let xt = Tensor::from_vec(x.clone(), (tokens, cols), &Device::Cpu).unwrap();
                    let exact: Vec<f32> = xt
                        .matmul(&dequantized.t().unwrap())
                        .unwrap()
                        .flatten_all()
                        .unwrap()
                        .to_vec1()
                        .unwrap();
                    for kernels in Int8Kernels::all() {
                        let what =
                            format!("{} {dtype:?} {cols} cols, tokens {tokens}", kernels.name());
                        let fast = w.matmul_with(kernels, &x, tokens);
                        for (a, b) in fast.iter().zip(&reference) {
                            assert!(
                                (a - b).abs() <= 1e-4 * (1.0 + b.abs()),
                                "{what}: {a} vs {b}"
                            );
                        }
                        // Each activation is off by at most half a step (d /
                        // 2, d = the block's amax / 127) plus the f16
                        // rounding of d over up to 127 steps (127 d 2^-11):
                        // 0.562 d = amax / 226, times |w|, summed over the row.
                        for t in 0..tokens {
                            let xr = &x[t * cols..(t + 1) * cols];
                            for r in 0..rows {
                                let bound: f32 = (0..cols)
                                    .map(|c| {
                                        let block = &xr[c / BLOCK * BLOCK..(c / BLOCK + 1) * BLOCK];
                                        let amax = block.iter().fold(0f32, |m, v| m.max(v.abs()));
                                        w_dense[r * cols + c].abs() * amax / 226.0
                                    })
                                    .sum::<f32>()
                                    + 1e-4;
                                let (a, b) = (fast[t * rows + r], exact[t * rows + r]);
                                assert!(
                                    (a - b).abs() <= bound,
                                    "{what} row {r}: {a} vs dense {b} (bound {bound})"
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    /// At every level a token's outputs are the same bits whichever tokens
    /// share its product (the tiles change which tokens share a pass over
    /// the weights, never a sum's order: the batch invariance of the
    /// generation step rests on it), and the two AVX-512 forms (maddubs,
    /// vpdpbusd) give the same bits.
    #[test]
    fn a_tokens_outputs_do_not_depend_on_the_other_tokens() {
        let (rows, cols, tokens) = (70, 128, 9);
        let w_tensor =
            Tensor::from_vec(values(rows * cols, 3), (rows, cols), &Device::Cpu).unwrap();
        let x = values(tokens * cols, 4);
        for dtype in [GgmlDType::Q4_1, GgmlDType::Q8_0] {
            let w = pack(&QTensor::quantize(&w_tensor, dtype).unwrap()).unwrap();
            let mut avx512 = Vec::new();
            for kernels in Int8Kernels::all() {
                let together = w.matmul_with(kernels, &x, tokens);
                let team = Team::new(3).unwrap();
                if matches!(kernels, Int8Kernels::Reference) {
                    // `matmul_on` runs the current level; it shares rows, never sums.
                    let current = w.matmul_with(Int8Kernels::current(), &x, tokens);
                    assert_eq!(
                        w.matmul_on(&team, &x, tokens),
                        current,
                        "{dtype:?} on a team"
                    );
                }
                for t in 0..tokens {
                    let alone = w.matmul_with(kernels, &x[t * cols..(t + 1) * cols], 1);
                    assert_eq!(
                        &together[t * rows..(t + 1) * rows],
                        &alone[..],
                        "{} {dtype:?} token {t}",
                        kernels.name()
                    );
                }
                if matches!(
                    kernels,
                    Int8Kernels::Avx512Bw(_) | Int8Kernels::Avx512Vnni(_)
                ) {
                    avx512.push(together);
                }
            }
            if let [bw, vnni] = &avx512[..] {
                assert_eq!(bw, vnni, "{dtype:?}: maddubs and vpdpbusd differ");
            }
        }
    }

    /// Against candle's own quantized matmul on the same blocks: the same
    /// numbers up to the order of f32 sums.
    #[test]
    fn kernels_agree_with_candles_quantized_matmul() {
        let (rows, cols) = (64, 576);
        let w_tensor =
            Tensor::from_vec(values(rows * cols, 5), (rows, cols), &Device::Cpu).unwrap();
        for dtype in [GgmlDType::Q4_1, GgmlDType::Q8_0] {
            let q = QTensor::quantize(&w_tensor, dtype).unwrap();
            let w = pack(&q).unwrap();
            let candle = candle_core::quantized::QMatMul::from_qtensor(q).unwrap();
            for (tokens, kernels) in [1, 5]
                .into_iter()
                .flat_map(|t| Int8Kernels::all().into_iter().map(move |k| (t, k)))
            {
                let x = values(tokens * cols, 11);
                let ours = w.matmul_with(kernels, &x, tokens);
                let xt = Tensor::from_vec(x, (tokens, cols), &Device::Cpu).unwrap();
                let theirs: Vec<f32> = candle_core::Module::forward(&candle, &xt)
                    .unwrap()
                    .flatten_all()
                    .unwrap()
                    .to_vec1()
                    .unwrap();
                let scale = theirs.iter().fold(0f32, |m, v| m.max(v.abs()));
                let worst = ours
                    .iter()
                    .zip(&theirs)
                    .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
                let what = format!("{} {dtype:?} tokens {tokens}", kernels.name());
                eprintln!("{what}: worst {worst} of {scale}");
                assert!(worst <= 1e-5 * scale, "{what}: {worst} of {scale}");
            }
        }
    }

    /// A stacked matrix's product is its parts' products side by side,
    /// exactly; parts of other types or widths are not stacked.
    #[test]
    fn a_stack_multiplies_as_its_parts() {
        let cols = 64;
        for dtype in [GgmlDType::Q4_1, GgmlDType::Q8_0] {
            let part = |rows: usize, seed: u64| {
                let t = Tensor::from_vec(values(rows * cols, seed), (rows, cols), &Device::Cpu)
                    .unwrap();
                pack(&QTensor::quantize(&t, dtype).unwrap()).unwrap()
            };
            let (a, b, c) = (part(12, 1), part(4, 2), part(8, 3));
            let stacked = PackedMatrix::stack(&[&a, &b, &c]).unwrap();
            assert_eq!((stacked.rows(), stacked.cols()), (24, cols));
            let x = values(3 * cols, 9);
            let all = stacked.matmul(&x, 3);
            let parts = [a.matmul(&x, 3), b.matmul(&x, 3), c.matmul(&x, 3)];
            for t in 0..3 {
                let joined: Vec<f32> = parts
                    .iter()
                    .zip([12, 4, 8])
                    .flat_map(|(p, rows)| p[t * rows..(t + 1) * rows].to_vec())
                    .collect();
                assert_eq!(&all[t * 24..(t + 1) * 24], &joined[..]);
            }
        }
        let t = Tensor::from_vec(values(4 * cols, 1), (4, cols), &Device::Cpu).unwrap();
        let q4 = pack(&QTensor::quantize(&t, GgmlDType::Q4_1).unwrap()).unwrap();
        let q8 = pack(&QTensor::quantize(&t, GgmlDType::Q8_0).unwrap()).unwrap();
        assert!(PackedMatrix::stack(&[&q4, &q8]).is_none());
        let t2 = Tensor::from_vec(values(4 * 32, 1), (4, 32), &Device::Cpu).unwrap();
        let narrow = pack(&QTensor::quantize(&t2, GgmlDType::Q4_1).unwrap()).unwrap();
        assert!(PackedMatrix::stack(&[&q4, &narrow]).is_none());
    }

    /// Shared among a team's members, the quantization is the same bits.
    #[test]
    fn quantizing_in_parts_is_quantizing_at_once() {
        let (tokens, cols) = (7, 96);
        let x = values(tokens * cols, 12);
        let whole = quantize_rows(&x, tokens, cols);
        let team = Team::new(3).unwrap();
        let parts = quantize_rows_in_parts(&x, tokens, cols, 3, |part| team.run(part));
        assert_eq!((parts.tokens, parts.blocks), (tokens, 3));
        assert_eq!(parts.qs, whole.qs);
        assert_eq!(parts.d, whole.d);
        assert_eq!(parts.s, whole.s);
    }

    #[test]
    fn activations_round_half_away_from_zero_like_f32_round() {
        let mut v = -130.0f32;
        while v <= 130.0 {
            for x in [v, v + 0.5, v - 0.5, v + 0.499_99, v + 0.500_01] {
                assert_eq!(round_half_away(x), x.round(), "{x}");
            }
            v += 0.25;
        }
        for x in [0.5f32, -0.5, 1.5, -1.5, 2.5, -2.5, 126.5, -126.5, 0.0, -0.0] {
            assert_eq!(round_half_away(x), x.round(), "{x}");
        }
    }

    #[test]
    fn data_that_is_not_whole_blocks_is_refused() {
        assert!(PackedMatrix::from_stored(StoredBlocks::Q8_0, 2, 40, &[0; 2 * 34]).is_none());
        assert!(PackedMatrix::from_stored(StoredBlocks::Q8_0, 2, 32, &[0; 34]).is_none());
        assert!(PackedMatrix::from_stored(StoredBlocks::Q4_1, 2, 32, &[0; 2 * 20]).is_some());
        assert!(PackedMatrix::from_stored(StoredBlocks::Q4K, 2, 128, &[0; 144]).is_none());
    }
}
