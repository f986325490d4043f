//! The encoder's f32 kernels, written once over [`Simd`] and instantiated per
//! instruction set by the per-architecture files (`x86_avx2.rs`,
//! `x86_avx512.rs`) inside their `#[target_feature]` functions. Every
//! function here is `#[inline(always)]` so that it compiles inside that
//! caller, to that instruction set; none is called on its own.
//!
//! The shapes scale with the vector width and the register count: a
//! register tile is `MR` rows by two vectors (6 x 16 with AVX2's 16
//! registers, 12 x 32 with AVX-512's 32), keys are scored in
//! blocks of two vectors, and values are summed 32 head dimensions at a time.

use crate::layout::{Heads, KC, LinearPanels, MC};
use crate::scalar::{self, ERF_A, ERF_P, Gate};
use crate::simd::Simd;

/// The most columns a register tile has at any level (two AVX-512 vectors).
const MAX_NR: usize = 32;

/// `out = x W^T + b` for the rows of `x` (`[rows, inputs]`) in tiles of `MR`
/// rows; `w` must be packed in panels of two of `s`'s vectors. Each output
/// sums its inputs in the same order whatever `MR` is.
#[inline(always)]
pub(crate) fn linear<S: Simd, const MR: usize>(s: S, w: &LinearPanels, x: &[f32], out: &mut [f32]) {
    let panels = w.outputs.div_ceil(2 * S::LANES);
    linear_panels::<S, MR>(s, w, 0..panels, x, out)
}

/// [`linear`] for the outputs of weight panels `panels` only: `out` is
/// `[rows, those outputs]` (the layer's outputs from `panels.start * nr`
/// to `panels.end * nr` or its last).
#[inline(always)]
pub(crate) fn linear_panels<S: Simd, const MR: usize>(
    s: S,
    w: &LinearPanels,
    panels: std::ops::Range<usize>,
    x: &[f32],
    out: &mut [f32],
) {
    let nr = 2 * S::LANES;
    assert_eq!(w.nr, nr, "weights packed for another vector width");
    assert!(nr <= MAX_NR);
    let (inputs, outputs) = (w.inputs, w.outputs);
    assert!(panels.start < panels.end && panels.end <= outputs.div_ceil(nr));
    let first_output = panels.start * nr;
    // The row stride of `out`: the outputs of these panels.
    let ld = outputs.min(panels.end * nr) - first_output;
    let rows = x.len() / inputs;
    assert_eq!(x.len(), rows * inputs);
    assert_eq!(out.len(), rows * ld);
    let mut packed = vec![0f32; MC.min(rows.next_multiple_of(MR)) * KC];
    let mut k0 = 0;
    while k0 < inputs {
        let kc = KC.min(inputs - k0);
        let first = k0 == 0;
        let mut i0 = 0;
        while i0 < rows {
            let mc = MC.min(rows - i0);
            let row_panels = mc.div_ceil(MR);
            pack_rows::<MR>(x, inputs, i0, rows, k0, kc, row_panels, &mut packed);
            for panel in panels.clone() {
                let b = &w.panels[(panel * inputs + k0) * nr..(panel * inputs + k0 + kc) * nr];
                let bias = &w.bias[panel * nr..(panel + 1) * nr];
                let cols = nr.min(outputs - panel * nr);
                for p in 0..row_panels {
                    let r0 = i0 + p * MR;
                    let tile_rows = MR.min(rows - r0);
                    let a = &packed[p * kc * MR..(p + 1) * kc * MR];
                    let at = r0 * ld + panel * nr - first_output;
                    if tile_rows == MR && cols == nr {
                        let c = &mut out[at..at + (MR - 1) * ld + nr];
                        tile::<S, MR>(s, a, b, c, ld, first, bias);
                    } else {
                        // An edge tile: run the full tile on a copy.
                        let mut c = [[0f32; MAX_NR]; MR];
                        let c = c.as_flattened_mut();
                        for r in 0..tile_rows {
                            let src = &out[at + r * ld..at + r * ld + cols];
                            c[r * nr..r * nr + cols].copy_from_slice(src);
                        }
                        tile::<S, MR>(s, a, b, &mut c[..MR * nr], nr, first, bias);
                        for r in 0..tile_rows {
                            let dst = &mut out[at + r * ld..at + r * ld + cols];
                            dst.copy_from_slice(&c[r * nr..r * nr + cols]);
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
#[inline(always)]
fn pack_rows<const MR: usize>(
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

/// One `MR x 2 vectors` tile: `c (+)= a b`, starting from the bias when
/// `first`. `a` is `kc x MR`, `b` is `kc x 2 vectors`, `c` has rows `ldc`
/// apart.
#[inline(always)]
fn tile<S: Simd, const MR: usize>(
    s: S,
    a: &[f32],
    b: &[f32],
    c: &mut [f32],
    ldc: usize,
    first: bool,
    bias: &[f32],
) {
    let lanes = S::LANES;
    let (a_steps, _) = a.as_chunks::<MR>();
    let b_steps = b.chunks_exact(2 * lanes);
    assert_eq!(a_steps.len(), b_steps.len());
    // MR x 2 accumulators, each kept in a register (the array is unrolled).
    let z = s.zero();
    let mut acc = [[z; 2]; MR];
    for (ak, bk) in a_steps.iter().zip(b_steps) {
        let (b0, b1) = (s.load(bk), s.load(&bk[lanes..]));
        for r in 0..MR {
            let v = s.splat(ak[r]);
            acc[r][0] = s.mul_add(v, b0, acc[r][0]);
            acc[r][1] = s.mul_add(v, b1, acc[r][1]);
        }
    }
    for (r, acc) in acc.iter().enumerate() {
        let row = &mut c[r * ldc..r * ldc + 2 * lanes];
        let start = if first { bias } else { &*row };
        let (lo, hi) = (s.load(start), s.load(&start[lanes..]));
        let (lo, hi) = (s.add(lo, acc[0]), s.add(hi, acc[1]));
        s.store(row, lo);
        s.store(&mut row[lanes..], hi);
    }
}

/// One sequence's attention over its `len` rows of `qkv`: the contexts of
/// its queries `first..first + rows` into `out` (`[rows, hidden]`; every
/// key of the sequence is attended to). `head_dim` must be a multiple of 32.
#[inline(always)]
pub(crate) fn attend<S: Simd>(
    s: S,
    qkv: &[f32],
    len: usize,
    shape: Heads,
    first: usize,
    out: &mut [f32],
) {
    let (hidden, hd) = (shape.hidden(), shape.head_dim);
    let kb = 2 * S::LANES;
    assert!(hd.is_multiple_of(32));
    assert_eq!(qkv.len(), len * 3 * hidden);
    let end = first + out.len() / hidden;
    assert!(out.len().is_multiple_of(hidden) && end <= len);
    // Per head: keys in blocks of two vectors (`kb`), dimension-major
    // (`[block][d][kb]`, zeros past the end, masked out of the softmax) and
    // pre-scaled by `1 / sqrt(head_dim)`; values row-major. All heads are
    // gathered in one pass over `qkv` (which can outgrow L2), then each
    // head's share is contiguous. Queries are read in place, 4 rows at a
    // time, each element broadcast.
    let lk = len.next_multiple_of(kb);
    let scale = 1.0 / (hd as f32).sqrt();
    let mut k_heads = vec![0f32; shape.heads * lk * hd];
    let mut v_heads = vec![0f32; shape.heads * len * hd];
    let mut scores = vec![0f32; 4 * lk];
    for (t, row) in qkv.chunks_exact(3 * hidden).enumerate() {
        let (k_row, v_row) = row[hidden..].split_at(hidden);
        let in_block = (t / kb) * kb * hd + t % kb;
        let k_dst = k_heads.chunks_exact_mut(lk * hd);
        let v_dst = v_heads.chunks_exact_mut(len * hd);
        for (((k_src, k_dst), v_src), v_dst) in k_row
            .chunks_exact(hd)
            .zip(k_dst)
            .zip(v_row.chunks_exact(hd))
            .zip(v_dst)
        {
            let k_dst = &mut k_dst[in_block..in_block + (hd - 1) * kb + 1];
            for (d, src) in k_src.iter().enumerate() {
                k_dst[d * kb] = src * scale;
            }
            v_dst[t * hd..(t + 1) * hd].copy_from_slice(v_src);
        }
    }
    let zeros = vec![0f32; hd];
    for h in 0..shape.heads {
        let k = &k_heads[h * lk * hd..(h + 1) * lk * hd];
        let v = &v_heads[h * len * hd..(h + 1) * len * hd];
        for i0 in (first..end).step_by(4) {
            let q: [&[f32]; 4] = std::array::from_fn(|r| match i0 + r < end {
                true => &qkv[(i0 + r) * 3 * hidden + h * hd..][..hd],
                false => &zeros[..],
            });
            query_scores(s, q, k, &mut scores);
            // Padded keys get no weight: the softmax runs over whole vectors.
            let mut inv_sums = [0f32; 4];
            for (r, row) in scores.chunks_exact_mut(lk).enumerate() {
                row[len..].fill(f32::NEG_INFINITY);
                inv_sums[r] = 1.0 / softmax_unnormalized(s, row);
            }
            // Context rows in groups of `R`, `R x 32 / LANES` accumulators
            // (8: as many FMAs in flight as two ports of 4 cycles take).
            if S::LANES >= 16 {
                let at = (i0 - first, end - i0);
                context_rows::<S, 4>(s, &scores, lk, len, at, &inv_sums, v, hd, out, hidden, h);
            } else {
                let at = (i0 - first, end - i0);
                context_rows::<S, 2>(s, &scores, lk, len, at, &inv_sums, v, hd, out, hidden, h);
            }
        }
    }
}

/// Scores of 4 query rows (`q`, each `head_dim` long) against every key
/// (`k`, `[block][d][2 vectors]`, already scaled), into `scores` (`4 x lk`).
#[inline(always)]
fn query_scores<S: Simd>(s: S, q: [&[f32]; 4], k: &[f32], scores: &mut [f32]) {
    let lanes = S::LANES;
    let hd = q[0].len();
    let lk = scores.len() / 4;
    for (block, k_block) in k.chunks_exact(hd * 2 * lanes).enumerate() {
        let z = s.zero();
        let mut acc = [[z; 2]; 4];
        for (d, kd) in k_block.chunks_exact(2 * lanes).enumerate() {
            let (k0, k1) = (s.load(kd), s.load(&kd[lanes..]));
            for r in 0..4 {
                let v = s.splat(q[r][d]);
                acc[r][0] = s.mul_add(v, k0, acc[r][0]);
                acc[r][1] = s.mul_add(v, k1, acc[r][1]);
            }
        }
        let j = block * 2 * lanes;
        for (r, [lo, hi]) in acc.into_iter().enumerate() {
            s.store(&mut scores[r * lk + j..], lo);
            s.store(&mut scores[r * lk + j + lanes..], hi);
        }
    }
}

/// `row[j] = exp(row[j] - max)`; returns the sum.
#[inline(always)]
fn softmax_unnormalized<S: Simd>(s: S, row: &mut [f32]) -> f32 {
    let lanes = S::LANES;
    let whole = row.len() / lanes * lanes;
    let (chunks, tail) = row.split_at_mut(whole);
    let mut max_v = s.splat(f32::NEG_INFINITY);
    for chunk in chunks.chunks_exact(lanes) {
        max_v = s.max(max_v, s.load(chunk));
    }
    let max = tail.iter().fold(s.max_lane(max_v), |m, v| m.max(*v));
    let max_v = s.splat(max);
    let mut sum_v = s.zero();
    for chunk in chunks.chunks_exact_mut(lanes) {
        let e = exp(s, s.sub(s.load(chunk), max_v));
        s.store(chunk, e);
        sum_v = s.add(sum_v, e);
    }
    let mut sum = s.sum(sum_v);
    for v in tail {
        *v = (*v - max).exp();
        sum += *v;
    }
    sum
}

/// The context rows of one block of 4 queries of head `h`, `R` at a time:
/// `at` is (the block's first row in `out`, the rows left from it).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn context_rows<S: Simd, const R: usize>(
    s: S,
    scores: &[f32],
    lk: usize,
    len: usize,
    at: (usize, usize),
    inv_sums: &[f32; 4],
    v: &[f32],
    hd: usize,
    out: &mut [f32],
    hidden: usize,
    h: usize,
) {
    for group in 0..4 / R {
        let r0 = group * R;
        let (row0, left) = at;
        let rows = left.saturating_sub(r0).min(R);
        if rows == 0 {
            break;
        }
        let probs: [&[f32]; R] =
            std::array::from_fn(|r| &scores[(r0 + r) * lk..(r0 + r) * lk + len]);
        let inv_sum: [f32; R] = std::array::from_fn(|r| inv_sums[r0 + r]);
        let at = (row0 + r0) * hidden + h * hd;
        let dst = &mut out[at..at + (rows - 1) * hidden + hd];
        weighted_values::<S, R>(s, probs, v, hd, inv_sum, dst, hidden, rows);
    }
}

/// `rows` (1 to `R`) context rows: `dst[r] = inv_sum[r] * sum_j probs[r][j]
/// v[j]`, head_dim in chunks of 32 (`32 / LANES` vectors); `dst` rows are
/// `ld` apart.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn weighted_values<S: Simd, const R: usize>(
    s: S,
    probs: [&[f32]; R],
    v: &[f32],
    hd: usize,
    inv_sum: [f32; R],
    dst: &mut [f32],
    ld: usize,
    rows: usize,
) {
    let lanes = S::LANES;
    let n = 32 / lanes;
    assert!((1..=R).contains(&rows));
    assert!(n <= 4 && n * lanes == 32);
    for c in (0..hd).step_by(32) {
        let z = s.zero();
        let mut acc = [[z; 4]; R];
        for (j, row) in v.chunks_exact(hd).enumerate() {
            let values = &row[c..c + 32];
            let x: [S::F; 4] = std::array::from_fn(|t| {
                if t < n {
                    s.load(&values[t * lanes..])
                } else {
                    z
                }
            });
            for r in 0..R {
                let p = s.splat(probs[r][j]);
                for t in 0..n {
                    acc[r][t] = s.mul_add(p, x[t], acc[r][t]);
                }
            }
        }
        for (r, acc) in acc.iter().take(rows).enumerate() {
            let scale = s.splat(inv_sum[r]);
            for (t, acc) in acc.iter().take(n).enumerate() {
                s.store(&mut dst[r * ld + c + t * lanes..], s.mul(scale, *acc));
            }
        }
    }
}

/// One query head of a decode step against its sequence's cached `keys` and
/// `values` (`[len, head_dim]` each; `head_dim` a multiple of 32):
/// `out = softmax(q . k / sqrt(head_dim)) v`, each score one vector dot
/// product, the context summed 32 dimensions (`32 / LANES` vectors) at a
/// time over the positions.
#[inline(always)]
pub(crate) fn decode_attend<S: Simd>(
    s: S,
    q: &[f32],
    keys: &[f32],
    values: &[f32],
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    let (lanes, dim) = (S::LANES, q.len());
    assert!(dim.is_multiple_of(32) && out.len() == dim);
    assert_eq!(keys.len(), values.len());
    let len = keys.len() / dim;
    let scale = 1.0 / (dim as f32).sqrt();
    // Whole vectors for the softmax; the padding scores -inf (weight 0).
    scores.clear();
    scores.resize(len.next_multiple_of(lanes), f32::NEG_INFINITY);
    for (score, k) in scores.iter_mut().zip(keys.chunks_exact(dim)) {
        let mut acc = [s.zero(); 2];
        for (i, (qa, ka)) in q.chunks_exact(lanes).zip(k.chunks_exact(lanes)).enumerate() {
            acc[i % 2] = s.mul_add(s.load(qa), s.load(ka), acc[i % 2]);
        }
        *score = s.sum(s.add(acc[0], acc[1])) * scale;
    }
    let inv = 1.0 / softmax_unnormalized(s, scores);
    let n = 32 / lanes;
    for c in (0..dim).step_by(32) {
        let z = s.zero();
        let mut acc = [z; 4];
        for (p, v) in scores.iter().zip(values.chunks_exact(dim)) {
            let p = s.splat(*p);
            for t in 0..n {
                acc[t] = s.mul_add(p, s.load(&v[c + t * lanes..]), acc[t]);
            }
        }
        let inv = s.splat(inv);
        for (t, acc) in acc.iter().take(n).enumerate() {
            s.store(&mut out[c + t * lanes..], s.mul(inv, *acc));
        }
    }
}

/// `out = act(gate) * up`, a vector at a time, the tail in plain Rust.
/// Both activations are `g * sigmoid(k(g))` with this file's `exp`: SiLU's
/// `k(g) = g`; tanh's GELU approximation, `0.5 g (1 + tanh(u))` with `u =
/// sqrt(2 / pi) (g + 0.044715 g^3)`, is `g * sigmoid(2u)`.
#[inline(always)]
pub(crate) fn gated<S: Simd>(s: S, act: Gate, gate: &[f32], up: &[f32], out: &mut [f32]) {
    let lanes = S::LANES;
    assert!(gate.len() == up.len() && up.len() == out.len());
    let whole = out.len() / lanes * lanes;
    let one = s.splat(1.0);
    let c1 = s.splat(2.0 * scalar::SQRT_2_OVER_PI);
    let c3 = s.splat(2.0 * scalar::SQRT_2_OVER_PI * 0.044_715);
    for ((g, u), o) in gate[..whole]
        .chunks_exact(lanes)
        .zip(up[..whole].chunks_exact(lanes))
        .zip(out[..whole].chunks_exact_mut(lanes))
    {
        let g = s.load(g);
        let k = match act {
            Gate::Silu => g,
            // 2u = g (c1 + c3 g^2)
            Gate::GeluTanh => s.mul(g, s.mul_add(c3, s.mul(g, g), c1)),
        };
        let e = exp(s, s.neg(k));
        s.store(o, s.mul(s.div(g, s.add(one, e)), s.load(u)));
    }
    for ((g, u), o) in gate[whole..]
        .iter()
        .zip(&up[whole..])
        .zip(&mut out[whole..])
    {
        *o = scalar::gated(act, *g) * u;
    }
}

/// `row = layer_norm(row + residual) * weight + bias` for each row of `x`
/// (`weight.len()` wide; `residual` the same shape as `x`): the residual
/// added, then the mean and the variance about it, in vector lanes (the
/// tail of a row in plain Rust).
#[inline(always)]
pub(crate) fn layer_norm<S: Simd>(
    s: S,
    x: &mut [f32],
    residual: Option<&[f32]>,
    weight: &[f32],
    bias: &[f32],
    eps: f32,
) {
    let (lanes, h) = (S::LANES, weight.len());
    let whole = h / lanes * lanes;
    for (r, row) in x.chunks_exact_mut(h).enumerate() {
        if let Some(res) = residual {
            let res = &res[r * h..(r + 1) * h];
            for (v, a) in row[..whole]
                .chunks_exact_mut(lanes)
                .zip(res.chunks_exact(lanes))
            {
                s.store(v, s.add(s.load(v), s.load(a)));
            }
            for (v, a) in row[whole..].iter_mut().zip(&res[whole..]) {
                *v += a;
            }
        }
        let mut sum = s.zero();
        for v in row[..whole].chunks_exact(lanes) {
            sum = s.add(sum, s.load(v));
        }
        let mean = (s.sum(sum) + row[whole..].iter().sum::<f32>()) / h as f32;
        let mean_v = s.splat(mean);
        let mut squares = s.zero();
        for v in row[..whole].chunks_exact(lanes) {
            let d = s.sub(s.load(v), mean_v);
            squares = s.mul_add(d, d, squares);
        }
        let tail: f32 = row[whole..].iter().map(|v| (v - mean) * (v - mean)).sum();
        let var = (s.sum(squares) + tail) / h as f32;
        let inv = 1.0 / (var + eps).sqrt();
        let inv_v = s.splat(inv);
        for ((v, w), b) in row[..whole]
            .chunks_exact_mut(lanes)
            .zip(weight.chunks_exact(lanes))
            .zip(bias.chunks_exact(lanes))
        {
            let scaled = s.mul(s.mul(s.sub(s.load(v), mean_v), inv_v), s.load(w));
            s.store(v, s.add(scaled, s.load(b)));
        }
        for ((v, w), b) in row[whole..]
            .iter_mut()
            .zip(&weight[whole..])
            .zip(&bias[whole..])
        {
            *v = (*v - mean) * inv * w + b;
        }
    }
}

/// erf GELU in place, a vector at a time (`gelu_scalar` for the tail).
#[inline(always)]
pub(crate) fn gelu<S: Simd>(s: S, x: &mut [f32]) {
    let lanes = S::LANES;
    let (half, one) = (s.splat(0.5), s.splat(1.0));
    let whole = x.len() / lanes * lanes;
    let (chunks, tail) = x.split_at_mut(whole);
    for chunk in chunks.chunks_exact_mut(lanes) {
        let v = s.load(chunk);
        let az = s.abs(s.mul(v, s.splat(std::f32::consts::FRAC_1_SQRT_2)));
        let t = s.div(one, s.mul_add(s.splat(ERF_P), az, one));
        let mut poly = s.splat(ERF_A[4]);
        for a in ERF_A[..4].iter().rev() {
            poly = s.mul_add(poly, t, s.splat(*a));
        }
        poly = s.mul(poly, t);
        let e = exp(s, s.neg(s.mul(az, az)));
        let erf = s.with_sign_of(s.neg_mul_add(poly, e, one), v);
        s.store(chunk, s.mul(s.mul(half, v), s.add(one, erf)));
    }
    for v in tail {
        *v = crate::scalar::gelu_scalar(*v);
    }
}

/// `e^x` to about 2 ulp over the f32 range (`0` below -87.3): `x = n ln2 +
/// r`, a degree-6 polynomial in `r`, scaled by `2^n` in the exponent.
#[inline(always)]
fn exp<S: Simd>(s: S, x: S::F) -> S::F {
    let x = s.min(x, s.splat(88.37));
    let n = s.round(s.mul(x, s.splat(std::f32::consts::LOG2_E)));
    let r = s.neg_mul_add(n, s.splat(0.693_145_75), x);
    let r = s.neg_mul_add(n, s.splat(1.428_606_8e-6), r);
    let mut p = s.splat(1.0 / 720.0);
    for c in [1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0] {
        p = s.mul_add(p, r, s.splat(c));
    }
    // Below -87.33, n would leave the exponent's range: the result is 0.
    let n = s.max(n, s.splat(-126.0));
    s.zero_where_below(x, s.splat(-87.33), s.mul(p, s.pow2(n)))
}

/// The peak loop: `iters` rounds of 12 independent vector FMAs (enough
/// chains to cover the FMA latency on two ports). Returns a value that
/// depends on every lane, so nothing is optimized away. FLOPs: `iters * 12 *
/// LANES * 2`.
#[inline(always)]
pub(crate) fn fma_peak<S: Simd>(s: S, iters: usize) -> f32 {
    let mut acc = [s.splat(1.0); 12];
    let (a, b) = (s.splat(0.999_999), s.splat(1e-7));
    for _ in 0..iters {
        for x in &mut acc {
            *x = s.mul_add(*x, a, b);
        }
    }
    acc.iter().map(|v| s.sum(*v)).sum()
}
