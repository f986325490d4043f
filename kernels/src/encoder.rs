//! f32 kernels for the CPU encoder (`sluice-models`' `encoder/packed.rs`) on
//! x86-64 with AVX2 + FMA or AVX-512:
//!
//! - [`PackedLinear`]: `y = x W^T + b`, a blocked matrix product (6 x 2
//!   vector register tiles: 6 x 16 with AVX2, 6 x 32 with AVX-512; the
//!   weights packed at load into panels two vectors wide, the activations
//!   packed per 72 x 256 block so both stay in cache), rows split
//!   across the rayon pool. candle's f32 matmul reached 55-63 GFLOP/s on these
//!   cores for the encoder's shapes, MKL about 125-157; this is what closes
//!   that gap.
//! - [`attention`]: softmax attention per sequence and head over the
//!   sequence's own tokens (no padding), one block of 4 queries at a time, so
//!   no `[heads, len, len]` score tensor is ever materialized.
//! - [`gelu`]: the erf GELU of BERT, vectorized.
//!
//! The kernels' bodies are written once (`f32_kernels.rs`, over the vector
//! operations of `simd.rs`) and compiled per level in `x86_avx2.rs` and
//! `x86_avx512.rs` (the only files with unsafe code); here are the packing,
//! the dispatch and each kernel's plain-Rust reference of the same
//! arithmetic, which runs on other CPUs and which the tests hold every level
//! to.

use rayon::prelude::*;

pub use crate::layout::{Activation, Heads, Span};
use crate::layout::{LinearPanels, bf16_pair};
pub use crate::scalar::gelu_scalar;
use crate::x86_amx::AmxBf16;
use crate::x86_avx2::Avx2;
use crate::x86_avx512::{Avx512, Avx512Bf16};

/// Which f32 kernels run: one of the SIMD levels (its token the proof that
/// the CPU has it), or the plain-Rust references.
#[derive(Clone, Copy, Debug)]
pub enum F32Kernels {
    Reference,
    Avx2(Avx2),
    Avx512(Avx512),
}

impl F32Kernels {
    /// The highest level this process runs (see [`crate::cpu`]).
    pub fn current() -> F32Kernels {
        if let Some(t) = Avx512::get() {
            return F32Kernels::Avx512(t);
        }
        if let Some(t) = Avx2::get() {
            return F32Kernels::Avx2(t);
        }
        F32Kernels::Reference
    }

    /// Every level this process may run, the references first (for tests
    /// that hold each to the references).
    pub fn all() -> Vec<F32Kernels> {
        let mut all = vec![F32Kernels::Reference];
        all.extend(Avx2::get().map(F32Kernels::Avx2));
        all.extend(Avx512::get().map(F32Kernels::Avx512));
        all
    }

    pub fn name(self) -> &'static str {
        match self {
            F32Kernels::Reference => "reference",
            F32Kernels::Avx2(_) => "avx2",
            F32Kernels::Avx512(_) => "avx512",
        }
    }

    /// f32 lanes of the level's vectors (1 for the references).
    pub fn lanes(self) -> usize {
        match self {
            F32Kernels::Reference => 1,
            F32Kernels::Avx2(_) => 8,
            F32Kernels::Avx512(_) => 16,
        }
    }

    /// The FMA peak loop at this level (`iters * 12 * lanes * 2` FLOPs);
    /// None for the references.
    pub fn fma_peak(self, iters: usize) -> Option<f32> {
        match self {
            F32Kernels::Reference => None,
            F32Kernels::Avx2(t) => Some(t.fma_peak(iters)),
            F32Kernels::Avx512(t) => Some(t.fma_peak(iters)),
        }
    }

    /// Columns of a weight panel: two of the level's vectors.
    fn panel_width(self) -> usize {
        match self {
            F32Kernels::Reference | F32Kernels::Avx2(_) => 16,
            F32Kernels::Avx512(_) => 32,
        }
    }
}

/// Which kernel runs the bf16 linear layers: AVX512_BF16's `vdpbf16ps`, or
/// AMX tiles where the CPU has them (and the layer's inputs are a multiple
/// of 32).
#[derive(Clone, Copy, Debug)]
pub enum Bf16Kernels {
    Avx512(Avx512Bf16),
    Amx(AmxBf16),
}

impl Bf16Kernels {
    /// The fastest this process runs; `None` without AVX512_BF16.
    pub fn current() -> Option<Bf16Kernels> {
        AmxBf16::get()
            .map(Bf16Kernels::Amx)
            .or_else(|| Avx512Bf16::get().map(Bf16Kernels::Avx512))
    }

    /// Every one this process runs (for tests).
    pub fn all() -> Vec<Bf16Kernels> {
        let mut all: Vec<Bf16Kernels> = Avx512Bf16::get()
            .map(Bf16Kernels::Avx512)
            .into_iter()
            .collect();
        all.extend(AmxBf16::get().map(Bf16Kernels::Amx));
        all
    }

    pub fn name(self) -> &'static str {
        match self {
            Bf16Kernels::Avx512(_) => "avx512-bf16",
            Bf16Kernels::Amx(_) => "amx-bf16",
        }
    }

    /// The kernel for a layer of `inputs` inputs: the tiles need a multiple
    /// of [`AmxBf16::INPUT_STEP`], `vdpbf16ps` an even number.
    fn for_inputs(self, inputs: usize) -> Option<Bf16Kernels> {
        match self {
            Bf16Kernels::Amx(_) if inputs.is_multiple_of(AmxBf16::INPUT_STEP) => Some(self),
            Bf16Kernels::Amx(t) => Bf16Kernels::Avx512(t.avx512()).for_inputs(inputs),
            Bf16Kernels::Avx512(_) => inputs.is_multiple_of(2).then_some(self),
        }
    }
}

/// Whether the SIMD kernels run in this process (see [`crate::cpu`]).
pub fn available() -> bool {
    !matches!(F32Kernels::current(), F32Kernels::Reference)
}

/// Whether the bf16 linear layers are this process's faster choice, by a
/// rule on what the CPU is, never a timing (a timing under load decided
/// differently from one start to the next, and with it the vectors), with
/// the reason; `None` where the process runs no bf16 layers. The rule
/// follows what `bench/embed` measured (bench/README.md): on AMX tiles bf16
/// (3.8x f32 on a Xeon); `vdpbf16ps` on an AMD core bf16 (1.4-1.9x on Zen 4,
/// whose 512-bit FMAs issue as two halves); `vdpbf16ps` on another vendor's
/// core f32 (0.7x on a Xeon with two 512-bit FMA units).
pub fn bf16_by_rule() -> Option<(bool, &'static str)> {
    Some(match Bf16Kernels::current()? {
        Bf16Kernels::Amx(_) => (true, "the CPU runs the bf16 layers on AMX tiles"),
        Bf16Kernels::Avx512(_) if crate::cpu::is_amd() => (
            true,
            "an AMD core with AVX512_BF16: vdpbf16ps outruns its f32 FMAs",
        ),
        Bf16Kernels::Avx512(_) => (
            false,
            "AVX512_BF16 without AMX on a core that is not AMD's: vdpbf16ps is no faster than f32 there",
        ),
    })
}

/// `x = layer_norm(x + residual) * weight + bias` for each row of `x`
/// (`[rows, weight.len()]`; `residual` the same shape), rows in parallel in
/// chunks of 64, at this process's level.
pub fn layer_norm(x: &mut [f32], residual: Option<&[f32]>, weight: &[f32], bias: &[f32], eps: f32) {
    layer_norm_with(F32Kernels::current(), x, residual, weight, bias, eps)
}

/// [`layer_norm`] at the level `kernels` (plain Rust for the references,
/// here rather than beside the model so that it builds at `opt-level = 3`
/// in every profile).
pub fn layer_norm_with(
    kernels: F32Kernels,
    x: &mut [f32],
    residual: Option<&[f32]>,
    weight: &[f32],
    bias: &[f32],
    eps: f32,
) {
    let h = weight.len();
    assert_eq!(bias.len(), h);
    assert!(residual.is_none_or(|r| r.len() == x.len()));
    const ROWS: usize = 64;
    let norm_rows = |x: &mut [f32], residual: Option<&[f32]>| match kernels {
        F32Kernels::Avx512(t) => t.layer_norm(x, residual, weight, bias, eps),
        F32Kernels::Avx2(t) => t.layer_norm(x, residual, weight, bias, eps),
        F32Kernels::Reference => {
            for (r, row) in x.chunks_exact_mut(h).enumerate() {
                if let Some(res) = residual {
                    for (v, s) in row.iter_mut().zip(&res[r * h..(r + 1) * h]) {
                        *v += s;
                    }
                }
                let mean = lane_sum(row.iter().copied()) / h as f32;
                let var = lane_sum(row.iter().map(|v| (v - mean) * (v - mean))) / h as f32;
                let inv = 1.0 / (var + eps).sqrt();
                for ((v, w), b) in row.iter_mut().zip(weight).zip(bias) {
                    *v = (*v - mean) * inv * w + b;
                }
            }
        }
    };
    match residual {
        Some(res) => x
            .par_chunks_mut(ROWS * h)
            .zip(res.par_chunks(ROWS * h))
            .for_each(|(x, res)| norm_rows(x, Some(res))),
        None => x.par_chunks_mut(ROWS * h).for_each(|x| norm_rows(x, None)),
    }
}

/// A sum in 8 interleaved lanes (vectorizable, and more accurate than one
/// running sum).
fn lane_sum(values: impl Iterator<Item = f32>) -> f32 {
    let mut lanes = [0f32; 8];
    for (i, v) in values.enumerate() {
        lanes[i % 8] += v;
    }
    lanes.iter().sum()
}

/// The bias (zeros without one), padded with zeros to the panels' width.
fn padded_bias(bias: Option<&[f32]>, outputs: usize, padded: usize) -> Vec<f32> {
    let mut out = vec![0f32; padded];
    if let Some(bias) = bias {
        assert_eq!(bias.len(), outputs, "bias shape");
        out[..outputs].copy_from_slice(bias);
    }
    out
}

/// The most rows a product shares among threads by output panels rather
/// than by rows (where the rows fill fewer tiles than there are threads):
/// its tiles are 4 rows high.
const FEW_ROWS: usize = 64;
/// The fewest weight panels a thread takes in a few-row product (less is
/// not worth the hand-off).
const MIN_PANELS_PER_TASK: usize = 4;

/// A linear layer: its packed weights ([`LinearPanels`]) and the kernel
/// level they were packed for, which runs them.
pub struct PackedLinear {
    pub(crate) layout: LinearPanels,
    kernels: F32Kernels,
    bf16: Option<Bf16Kernels>,
}

impl PackedLinear {
    /// Packed for this process's kernel level.
    pub fn new(
        weight: &[f32],
        outputs: usize,
        inputs: usize,
        bias: Option<&[f32]>,
    ) -> PackedLinear {
        PackedLinear::new_for(F32Kernels::current(), weight, outputs, inputs, bias)
    }

    /// Packed for `kernels`.
    pub fn new_for(
        kernels: F32Kernels,
        weight: &[f32],
        outputs: usize,
        inputs: usize,
        bias: Option<&[f32]>,
    ) -> PackedLinear {
        assert_eq!(weight.len(), outputs * inputs, "weight shape");
        let nr = kernels.panel_width();
        let count = outputs.div_ceil(nr);
        let mut panels = vec![0f32; count * inputs * nr];
        for (o, row) in weight.chunks_exact(inputs).enumerate() {
            let (panel, lane) = (o / nr, o % nr);
            for (k, w) in row.iter().enumerate() {
                panels[(panel * inputs + k) * nr + lane] = *w;
            }
        }
        let padded_bias = padded_bias(bias, outputs, count * nr);
        PackedLinear {
            layout: LinearPanels {
                inputs,
                outputs,
                nr,
                panels,
                bf16_panels: Vec::new(),
                bias: padded_bias,
            },
            kernels,
            bf16: None,
        }
    }

    /// The layer with bf16 weights (and bf16 activations, f32 sums), on the
    /// fastest bf16 kernel this process runs ([`Bf16Kernels::current`]);
    /// `None` where it runs none or `inputs` is odd. Half the weight bytes;
    /// each output is off by about 2^-8 of `sum |w x|`.
    pub fn new_bf16(
        weight: &[f32],
        outputs: usize,
        inputs: usize,
        bias: Option<&[f32]>,
    ) -> Option<PackedLinear> {
        PackedLinear::new_bf16_for(Bf16Kernels::current()?, weight, outputs, inputs, bias)
    }

    /// [`PackedLinear::new_bf16`] on `kernels` (AMX falls back to
    /// `vdpbf16ps` when `inputs` is not a multiple of 32). Both read the
    /// same packing: 32-output panels, per pair of inputs `(2p, 2p + 1)` and
    /// output one u32 holding the two bf16 weights (the even input low).
    pub fn new_bf16_for(
        kernels: Bf16Kernels,
        weight: &[f32],
        outputs: usize,
        inputs: usize,
        bias: Option<&[f32]>,
    ) -> Option<PackedLinear> {
        let kernels = kernels.for_inputs(inputs)?;
        assert_eq!(weight.len(), outputs * inputs, "weight shape");
        let nr = 32;
        let count = outputs.div_ceil(nr);
        let mut bf16_panels = vec![0u32; count * inputs / 2 * nr];
        for (o, row) in weight.chunks_exact(inputs).enumerate() {
            let (panel, lane) = (o / nr, o % nr);
            for (kp, two) in row.chunks_exact(2).enumerate() {
                bf16_panels[(panel * inputs / 2 + kp) * nr + lane] = bf16_pair(two[0], two[1]);
            }
        }
        let padded_bias = padded_bias(bias, outputs, count * nr);
        Some(PackedLinear {
            layout: LinearPanels {
                inputs,
                outputs,
                nr,
                panels: Vec::new(),
                bf16_panels,
                bias: padded_bias,
            },
            kernels: F32Kernels::current(),
            bf16: Some(kernels),
        })
    }

    /// Whether the weights are bf16.
    pub fn is_bf16(&self) -> bool {
        self.bf16.is_some()
    }

    /// The kernel the bf16 weights run on (`None` for f32 weights).
    pub fn bf16_kernels(&self) -> Option<Bf16Kernels> {
        self.bf16
    }

    pub fn inputs(&self) -> usize {
        self.layout.inputs
    }

    pub fn outputs(&self) -> usize {
        self.layout.outputs
    }

    fn weight(&self, output: usize, input: usize) -> f32 {
        let nr = self.layout.nr;
        if self.bf16.is_some() {
            let pair = self.layout.bf16_panels
                [((output / nr) * self.layout.inputs / 2 + input / 2) * nr + output % nr];
            let bits = if input.is_multiple_of(2) {
                pair & 0xFFFF
            } else {
                pair >> 16
            };
            return half::bf16::from_bits(bits as u16).to_f32();
        }
        self.layout.panels[((output / nr) * self.layout.inputs + input) * nr + output % nr]
    }

    /// Output `output`'s weights (`inputs` of them, as stored; bf16 ones
    /// widened): a tied embedding's row read back from its projection.
    pub fn weight_row(&self, output: usize) -> Vec<f32> {
        assert!(
            output < self.layout.outputs,
            "output {output} of {}",
            self.layout.outputs
        );
        (0..self.layout.inputs)
            .map(|k| self.weight(output, k))
            .collect()
    }

    /// `x` is `[rows, inputs]` row-major; returns `[rows, outputs]`.
    pub fn forward(&self, x: &[f32], rows: usize) -> Vec<f32> {
        let mut out = Vec::new();
        self.forward_into(x, rows, &mut out, Activation::None);
        out
    }

    /// [`PackedLinear::forward`] into `out` (resized to `[rows, outputs]`;
    /// every value is overwritten, so a buffer reused across layers of the
    /// same shape is neither zeroed nor faulted in again), then
    /// `activation` on every output (on the tiles, each 32-row block while
    /// it is still in L2).
    pub fn forward_into(&self, x: &[f32], rows: usize, out: &mut Vec<f32>, activation: Activation) {
        assert_eq!(x.len(), rows * self.layout.inputs, "input shape");
        out.resize(rows * self.layout.outputs, 0.0);
        if rows == 0 {
            return;
        }
        let threads = rayon::current_num_threads().max(1);
        // Fewer row tiles than threads (a decoder step's few tokens): shared
        // by output panels instead.
        let few = rows <= FEW_ROWS && rows.div_ceil(12) < threads;
        if few && self.bf16.is_none() && self.few_rows(x, rows, out, threads) {
            if activation == Activation::Gelu {
                gelu_rows(self.kernels, out);
            }
            return;
        }
        // Whole tiles at every level (6 rows at AVX2, 12 at AVX-512, 32 on
        // AMX).
        let tile_rows = match self.bf16 {
            Some(Bf16Kernels::Amx(_)) => 32,
            _ => 12,
        };
        let per_task = rows.div_ceil(threads).next_multiple_of(tile_rows);
        out.par_chunks_mut(per_task * self.layout.outputs)
            .zip(x.par_chunks(per_task * self.layout.inputs))
            .for_each(|(out, x)| {
                match (self.bf16, self.kernels) {
                    (Some(Bf16Kernels::Amx(t)), _) => {
                        return t.linear(&self.layout, x, out, activation);
                    }
                    (Some(Bf16Kernels::Avx512(t)), _) => t.linear(&self.layout, x, out),
                    (None, F32Kernels::Avx512(t)) => t.linear(&self.layout, x, out),
                    (None, F32Kernels::Avx2(t)) => t.linear(&self.layout, x, out),
                    (None, F32Kernels::Reference) => self.reference_rows(x, out),
                }
                if activation == Activation::Gelu {
                    gelu_rows(self.kernels, out);
                }
            });
    }

    /// A product of a few rows (a decoder step's) shared among the threads
    /// by output panels, each thread's outputs written where they go (one
    /// row) or gathered from its own buffer; `false` (nothing done) at the
    /// plain-Rust level, which splits by rows.
    fn few_rows(&self, x: &[f32], rows: usize, out: &mut [f32], threads: usize) -> bool {
        let run = |panels: std::ops::Range<usize>, out: &mut [f32]| match self.kernels {
            F32Kernels::Avx512(t) => t.linear_few(&self.layout, panels, x, out),
            F32Kernels::Avx2(t) => t.linear_few(&self.layout, panels, x, out),
            F32Kernels::Reference => unreachable!("checked below"),
        };
        if matches!(self.kernels, F32Kernels::Reference) {
            return false;
        }
        let (nr, outputs) = (self.layout.nr, self.layout.outputs);
        let count = outputs.div_ceil(nr);
        let per_part = count.div_ceil(threads).max(MIN_PANELS_PER_TASK);
        let parts: Vec<std::ops::Range<usize>> = (0..count)
            .step_by(per_part)
            .map(|p| p..(p + per_part).min(count))
            .collect();
        let width =
            |panels: &std::ops::Range<usize>| outputs.min(panels.end * nr) - panels.start * nr;
        if rows == 1 {
            let mut rest = &mut out[..];
            let mut tasks = Vec::with_capacity(parts.len());
            for panels in parts {
                let (mine, tail) = rest.split_at_mut(width(&panels));
                tasks.push((panels, mine));
                rest = tail;
            }
            tasks
                .into_par_iter()
                .for_each(|(panels, out)| run(panels, out));
        } else {
            let computed: Vec<Vec<f32>> = parts
                .par_iter()
                .map(|panels| {
                    let mut part = vec![0f32; rows * width(panels)];
                    run(panels.clone(), &mut part);
                    part
                })
                .collect();
            for (panels, part) in parts.iter().zip(computed) {
                let (first, w) = (panels.start * nr, width(panels));
                for (dst, src) in out.chunks_exact_mut(outputs).zip(part.chunks_exact(w)) {
                    dst[first..first + w].copy_from_slice(src);
                }
            }
        }
        true
    }

    /// The product in plain Rust (each output summed over inputs in order,
    /// after the bias).
    pub fn reference(&self, x: &[f32], rows: usize) -> Vec<f32> {
        assert_eq!(x.len(), rows * self.layout.inputs, "input shape");
        let mut out = vec![0f32; rows * self.layout.outputs];
        self.reference_rows(x, &mut out);
        out
    }

    fn reference_rows(&self, x: &[f32], out: &mut [f32]) {
        for (x, y) in x
            .chunks_exact(self.layout.inputs)
            .zip(out.chunks_exact_mut(self.layout.outputs))
        {
            for (o, y) in y.iter_mut().enumerate() {
                let mut acc = self.layout.bias[o];
                for (k, v) in x.iter().enumerate() {
                    acc = v.mul_add(self.weight(o, k), acc);
                }
                *y = acc;
            }
        }
    }
}

/// Scaled dot-product attention within each span. `qkv` is `[tokens, 3 *
/// hidden]` (each row the token's queries, keys and values, head-major);
/// returns the context `[tokens, hidden]`. Spans must not overlap and must
/// cover the tokens in order.
pub fn attention(qkv: &[f32], spans: &[Span], shape: Heads) -> Vec<f32> {
    attention_with(F32Kernels::current(), qkv, spans, shape)
}

/// [`attention`] into `out` (resized to `[tokens, hidden]`, every value
/// overwritten: see [`PackedLinear::forward_into`]).
pub fn attention_into(qkv: &[f32], spans: &[Span], shape: Heads, out: &mut Vec<f32>) {
    attention_into_with(F32Kernels::current(), qkv, spans, shape, out)
}

/// [`attention`] at the level `kernels` (the references when `head_dim` is
/// not a multiple of 32).
pub fn attention_with(kernels: F32Kernels, qkv: &[f32], spans: &[Span], shape: Heads) -> Vec<f32> {
    let mut out = Vec::new();
    attention_into_with(kernels, qkv, spans, shape, &mut out);
    out
}

fn attention_into_with(
    kernels: F32Kernels,
    qkv: &[f32],
    spans: &[Span],
    shape: Heads,
    out: &mut Vec<f32>,
) {
    let hidden = shape.hidden();
    let tokens: usize = spans.iter().map(|s| s.len).sum();
    assert_eq!(qkv.len(), tokens * 3 * hidden, "qkv shape");
    out.resize(tokens * hidden, 0.0);
    let kernels = if shape.head_dim.is_multiple_of(32) {
        kernels
    } else {
        F32Kernels::Reference
    };
    // One task per sequence, or, when there are fewer sequences than
    // threads to keep busy, per run of a long sequence's queries (each task
    // then reads all of the sequence's keys and values): every task's rows
    // of the output are contiguous.
    let threads = rayon::current_num_threads().max(1);
    let pieces = |len: usize| match spans.len() >= 2 * threads {
        true => 1,
        false => (2 * threads).div_ceil(spans.len()).min(len / 64).max(1),
    };
    let mut tasks = Vec::with_capacity(spans.len());
    let mut rest = out.as_mut_slice();
    let mut next = 0;
    for span in spans {
        assert_eq!(span.start, next, "spans must cover the tokens in order");
        next += span.len;
        let per_piece = span.len.div_ceil(pieces(span.len)).next_multiple_of(4);
        let mut first = 0;
        while first < span.len {
            let rows = per_piece.min(span.len - first);
            let (mine, tail) = rest.split_at_mut(rows * hidden);
            tasks.push((*span, first, mine));
            rest = tail;
            first += rows;
        }
    }
    tasks.into_par_iter().for_each(|(span, first, out)| {
        let rows = &qkv[span.start * 3 * hidden..(span.start + span.len) * 3 * hidden];
        match kernels {
            F32Kernels::Avx512(t) => t.attend(rows, span.len, shape, first, out),
            F32Kernels::Avx2(t) => t.attend(rows, span.len, shape, first, out),
            F32Kernels::Reference => reference_attend(rows, span.len, shape, first, out),
        }
    });
}

/// One sequence's attention in plain Rust: the contexts of its queries
/// `first..` into `out`'s rows.
fn reference_attend(qkv: &[f32], len: usize, shape: Heads, first: usize, out: &mut [f32]) {
    let (hidden, hd) = (shape.hidden(), shape.head_dim);
    let scale = 1.0 / (hd as f32).sqrt();
    let at = |t: usize, part: usize, h: usize| {
        let base = t * 3 * hidden + part * hidden + h * hd;
        &qkv[base..base + hd]
    };
    let mut scores = vec![0f32; len];
    for h in 0..shape.heads {
        for (row, i) in (first..first + out.len() / hidden).enumerate() {
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
            let ctx = &mut out[row * hidden + h * hd..row * hidden + (h + 1) * hd];
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
    gelu_with(F32Kernels::current(), x)
}

/// [`gelu`] at the level `kernels`.
pub fn gelu_with(kernels: F32Kernels, x: &mut [f32]) {
    x.par_chunks_mut(16 * 1024)
        .for_each(|chunk| gelu_rows(kernels, chunk));
}

/// [`gelu`] at the level `kernels` on this thread.
pub(crate) fn gelu_rows(kernels: F32Kernels, x: &mut [f32]) {
    match kernels {
        F32Kernels::Avx512(t) => t.gelu(x),
        F32Kernels::Avx2(t) => t.gelu(x),
        F32Kernels::Reference => x.iter_mut().for_each(|v| *v = gelu_scalar(*v)),
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
        // Rows and outputs that are not multiples of the tile (6 or 12 rows),
        // inputs that span more than one depth block, and the encoder's shapes.
        for (rows, outputs, inputs) in [
            (1, 1, 1),
            (7, 17, 300),
            (13, 40, 513),
            (100, 384, 384),
            (61, 1536, 384),
            // More rows per thread than one packed block (MC) holds.
            (203, 40, 300),
            // A decoder step's few rows, shared by output panels.
            (1, 384, 384),
            (1, 1000, 40),
            (3, 1000, 300),
            (8, 130, 64),
        ] {
            let w = values(outputs * inputs, 1);
            let b = values(outputs, 2);
            let x = values(rows * inputs, 3);
            let linear = PackedLinear::new(&w, outputs, inputs, Some(&b));
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
            let e = relative_error(&plain, &exact);
            assert!(e < 1e-5, "{rows}x{outputs}x{inputs}: plain {e:e}");
            // Every level this machine runs, each packed its own way.
            for kernels in F32Kernels::all() {
                let linear = PackedLinear::new_for(kernels, &w, outputs, inputs, Some(&b));
                let e = relative_error(&linear.forward(&x, rows), &exact);
                let name = kernels.name();
                assert!(e < 1e-5, "{rows}x{outputs}x{inputs}: {name} {e:e}");
            }
        }
    }

    #[test]
    fn a_few_rows_give_the_same_bits_as_the_same_rows_among_many() {
        // Split by output panels or by rows, each output sums its inputs in
        // the same order: a token's result does not depend on its batch.
        let (outputs, inputs) = (1000, 300);
        let w = values(outputs * inputs, 5);
        let b = values(outputs, 6);
        let x = values(40 * inputs, 7);
        for kernels in F32Kernels::all() {
            let linear = PackedLinear::new_for(kernels, &w, outputs, inputs, Some(&b));
            let many = linear.forward(&x, 40);
            for rows in [1, 2, 5, 8] {
                let few = linear.forward(&x[..rows * inputs], rows);
                assert!(
                    few == many[..rows * outputs],
                    "{} {rows} rows",
                    kernels.name()
                );
            }
        }
    }

    /// The bf16 layer (where this CPU runs it): each output within 2^-7 of
    /// `sum |w x|` of the f64 product (each operand rounded to bf16 is off
    /// by at most 2^-9 of itself, so each product by about 2^-8), for the
    /// edge shapes and the encoder's; and its plain-Rust reference reads
    /// the same bf16 weights.
    /// The rule behind `--embed-weights auto`: an answer exactly where the
    /// process runs bf16, bf16 on tiles and on AMD cores, the same on every
    /// call (no timing in it).
    #[test]
    fn the_bf16_rule_is_decided_by_what_the_cpu_is() {
        let rule = bf16_by_rule();
        assert_eq!(rule.is_some(), Bf16Kernels::current().is_some());
        if let Some((bf16, why)) = rule {
            eprintln!("bf16 rule: {bf16} ({why})");
            let expected =
                matches!(Bf16Kernels::current(), Some(Bf16Kernels::Amx(_))) || crate::cpu::is_amd();
            assert_eq!(bf16, expected);
        }
        for _ in 0..3 {
            assert_eq!(bf16_by_rule(), rule);
        }
    }

    #[test]
    fn bf16_linear_is_within_bf16_rounding_of_the_product() {
        if Bf16Kernels::current().is_none() {
            eprintln!("no AVX512_BF16 at this level: new_bf16 must refuse");
            assert!(PackedLinear::new_bf16(&[0.0; 4], 2, 2, None).is_none());
            return;
        }
        assert!(
            PackedLinear::new_bf16(&[0.0; 3], 1, 3, None).is_none(),
            "odd inputs"
        );
        for kernels in Bf16Kernels::all() {
            eprintln!("bf16 kernels: {}", kernels.name());
            for (rows, outputs, inputs) in [
                (1, 1, 2),
                (7, 17, 300),
                (13, 40, 514),
                (100, 384, 384),
                (61, 1536, 384),
                // More rows per thread than one packed block (MC) holds.
                (203, 40, 300),
                // The tiles' edges: one input step, rows and outputs short
                // of a tile and of a 32-row block, and the FFN's depth.
                (1, 1, 32),
                (45, 40, 64),
                (33, 17, 96),
                (67, 384, 1536),
            ] {
                let w = values(outputs * inputs, 1);
                let b = values(outputs, 2);
                let x = values(rows * inputs, 3);
                let linear =
                    PackedLinear::new_bf16_for(kernels, &w, outputs, inputs, Some(&b)).unwrap();
                assert!(linear.is_bf16());
                let ran = linear.bf16_kernels().unwrap().name();
                if inputs.is_multiple_of(32) {
                    assert_eq!(ran, kernels.name(), "{inputs} inputs");
                } else {
                    assert_eq!(ran, "avx512-bf16", "{inputs} inputs");
                }
                let fast = linear.forward(&x, rows);
                let plain = linear.reference(&x, rows);
                for r in 0..rows {
                    for o in 0..outputs {
                        let (mut acc, mut size) = (f64::from(b[o]), f64::from(b[o].abs()));
                        for k in 0..inputs {
                            let p = f64::from(x[r * inputs + k]) * f64::from(w[o * inputs + k]);
                            acc += p;
                            size += p.abs();
                        }
                        let bound = size / 128.0;
                        for (what, got) in [
                            ("kernel", fast[r * outputs + o]),
                            ("reference", plain[r * outputs + o]),
                        ] {
                            assert!(
                                (f64::from(got) - acc).abs() <= bound,
                                "{ran} {rows}x{outputs}x{inputs} [{r},{o}] {what}: {got} vs {acc} (bound {bound})"
                            );
                        }
                    }
                }
            }
        }
    }

    /// `forward_into` overwrites a reused (dirty, longer) buffer whole, and
    /// its GELU, fused into the tiles' blocks or run after the product,
    /// equals the product followed by [`gelu`], on every kernel.
    #[test]
    fn forward_into_reuses_buffers_and_fuses_gelu() {
        let (rows, outputs, inputs) = (45, 96, 64);
        let w = values(outputs * inputs, 5);
        let b = values(outputs, 6);
        let x: Vec<f32> = values(rows * inputs, 7).iter().map(|v| v * 4.0).collect();
        let mut layers: Vec<(String, PackedLinear)> = F32Kernels::all()
            .into_iter()
            .map(|k| {
                (
                    k.name().to_string(),
                    PackedLinear::new_for(k, &w, outputs, inputs, Some(&b)),
                )
            })
            .collect();
        for k in Bf16Kernels::all() {
            let layer = PackedLinear::new_bf16_for(k, &w, outputs, inputs, Some(&b)).unwrap();
            layers.push((k.name().to_string(), layer));
        }
        for (name, layer) in &layers {
            let plain = layer.forward(&x, rows);
            let mut expected = plain.clone();
            gelu_with(layer.kernels, &mut expected);
            let mut out = vec![f32::NAN; rows * outputs + 100];
            layer.forward_into(&x, rows, &mut out, Activation::None);
            assert_eq!(out, plain, "{name}: reused buffer");
            out.fill(f32::NAN);
            layer.forward_into(&x, rows, &mut out, Activation::Gelu);
            assert_eq!(out, expected, "{name}: gelu");
        }
    }

    /// Every level's layer norm against the plain-Rust one, with and
    /// without a residual, rows on and off the vector width.
    #[test]
    fn layer_norm_is_the_same_at_every_level() {
        for h in [384, 40] {
            let rows = 70;
            let x: Vec<f32> = values(rows * h, 12).iter().map(|v| v * 5.0 + 1.0).collect();
            let res = values(rows * h, 13);
            let w = values(h, 14);
            let b = values(h, 15);
            for residual in [None, Some(res.as_slice())] {
                let mut plain = x.clone();
                layer_norm_with(F32Kernels::Reference, &mut plain, residual, &w, &b, 1e-12);
                for kernels in F32Kernels::all() {
                    let mut got = x.clone();
                    layer_norm_with(kernels, &mut got, residual, &w, &b, 1e-12);
                    let e = relative_error(&got, &plain);
                    assert!(e < 1e-5, "{} h {h}: {e:e}", kernels.name());
                }
            }
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
        let mut plain = vec![0f32; start * 96];
        for span in &spans {
            reference_attend(
                &qkv[span.start * 288..(span.start + span.len) * 288],
                span.len,
                shape,
                0,
                &mut plain[span.start * 96..(span.start + span.len) * 96],
            );
        }
        for kernels in F32Kernels::all() {
            let fast = attention_with(kernels, &qkv, &spans, shape);
            let e = relative_error(&fast, &plain);
            assert!(e < 1e-5, "{}: attention differs by {e:e}", kernels.name());
            // A sequence of one token attends only to itself: its context is
            // its own values.
            assert_eq!(&fast[..96], &qkv[192..288], "{}", kernels.name());
        }
    }

    #[test]
    fn one_long_sequence_is_shared_among_threads_by_its_queries() {
        // Fewer sequences than threads: the long one's queries are split
        // into runs (not multiples of 4 long), each attending to every key.
        let shape = Heads {
            heads: 2,
            head_dim: 32,
        };
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(3)
            .build()
            .unwrap();
        for len in [257usize, 130, 64] {
            let qkv: Vec<f32> = values(len * 3 * 64, 9).iter().map(|v| v * 3.0).collect();
            let mut plain = vec![0f32; len * 64];
            reference_attend(&qkv, len, shape, 0, &mut plain);
            let spans = [Span { start: 0, len }];
            for kernels in F32Kernels::all() {
                let fast = pool.install(|| attention_with(kernels, &qkv, &spans, shape));
                let e = relative_error(&fast, &plain);
                assert!(e < 1e-5, "{} len {len}: differs by {e:e}", kernels.name());
            }
        }
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
        for kernels in F32Kernels::all() {
            let mut fast = x.clone();
            gelu_with(kernels, &mut fast);
            for ((x, f), e) in x.iter().zip(&fast).zip(&expected) {
                assert!(
                    (f - e).abs() <= 1e-6 * (1.0 + e.abs()),
                    "{}: gelu({x}) = {f}, expected {e}",
                    kernels.name()
                );
            }
        }
        for (x, e) in x.iter().zip(&expected) {
            assert!(
                (gelu_scalar(*x) - e).abs() <= 1e-6 * (1.0 + e.abs()),
                "scalar gelu({x})"
            );
        }
    }
}
