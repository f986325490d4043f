//! What the kernels and their dispatch share, and nothing else: the packed
//! layouts (a linear layer's panels, a quantized matrix's blocks, quantized
//! activations), the shapes (a sequence's span, attention heads) and the
//! packing constants. A leaf: it names no other module of the crate, so the
//! per-level files (`x86_*.rs`), the generic bodies (`f32_kernels.rs`,
//! `quantized_kernels.rs`) and the dispatch (`encoder.rs`, `quantized.rs`)
//! all import it and none of them imports another's types back.

/// Rows of the bf16 layers' register tile (the f32 ones' is per level:
/// `f32_kernels::linear`'s `MR`).
pub(crate) const MR: usize = 6;
/// Depth of a packed block: an `MR x KC` slice of activations and a
/// `KC x 2 vectors` slice of weights together fit the 32 KiB L1 cache.
pub(crate) const KC: usize = 256;
/// Rows of a packed activation block (kept in L2 across all weight panels).
pub(crate) const MC: usize = 72;

/// What a linear layer applies to its outputs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Activation {
    None,
    /// [`gelu`].
    Gelu,
}

/// A linear layer's weights `[outputs, inputs]` (PyTorch's layout) and bias,
/// packed for one kernel level (`encoder::PackedLinear` runs them): panels of `nr`
/// outputs (two of the level's vectors), each stored input-major (`inputs x
/// nr`), the last panel padded with zeros.
pub struct LinearPanels {
    pub(crate) inputs: usize,
    pub(crate) outputs: usize,
    pub(crate) nr: usize,
    /// f32 weights (empty when the layer is bf16).
    pub(crate) panels: Vec<f32>,
    /// bf16 weights, two inputs per u32 (empty when the layer is f32).
    pub(crate) bf16_panels: Vec<u32>,
    pub(crate) bias: Vec<f32>,
}

/// bf16 of `a` (low half) and `b` (high half), rounded to nearest even: a
/// pair of inputs as `vdpbf16ps` multiplies them.
pub(crate) fn bf16_pair(a: f32, b: f32) -> u32 {
    u32::from(half::bf16::from_f32(a).to_bits())
        | (u32::from(half::bf16::from_f32(b).to_bits()) << 16)
}

/// Where one sequence's tokens are in a packed batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    pub start: usize,
    pub len: usize,
}

/// The shape of multi-head attention over rows of `[q | k | v]`.
#[derive(Clone, Copy, Debug)]
pub struct Heads {
    pub heads: usize,
    pub head_dim: usize,
}

impl Heads {
    pub(crate) fn hidden(&self) -> usize {
        self.heads * self.head_dim
    }
}

/// Values per quantization block.
pub(crate) const BLOCK: usize = 32;

/// A weight matrix `[rows (outputs), cols (inputs)]` in its quantized blocks.
#[derive(Clone)]
pub struct PackedMatrix {
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    pub(crate) blocks: usize,
    pub(crate) weights: Packed,
}

/// The GGUF block types the kernels take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockType {
    /// 20 bytes a block of 32: f16 scale, f16 minimum, 16 bytes of nibbles.
    Q4_1,
    /// 34 bytes a block of 32: f16 scale, 32 signed bytes.
    Q8_0,
}

#[derive(Clone)]
pub(crate) enum Packed {
    /// `w = d * q + m`, `q` in 0..=15; low nibbles are values 0..16 of the
    /// block, high nibbles 16..32 (the GGUF layout).
    Q4_1 {
        d: Vec<f32>,
        m: Vec<f32>,
        qs: Vec<[u8; 16]>,
    },
    /// `w = d * q`, `q` in -127..=127.
    Q8_0 { d: Vec<f32>, qs: Vec<[i8; 32]> },
}

/// Activations quantized per block: `x ~ d * q`, and `s = d * sum(q)`
/// (scales rounded to f16, as ggml keeps them).
pub struct QuantizedRows {
    pub(crate) tokens: usize,
    pub(crate) blocks: usize,
    pub(crate) qs: Vec<[i8; 32]>,
    pub(crate) d: Vec<f32>,
    pub(crate) s: Vec<f32>,
}
