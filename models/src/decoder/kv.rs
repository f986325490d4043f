//! A sequence's KV cache, and its part in one forward step.

use candle_core::Tensor;

/// One sequence's keys and values for every layer, allocated once for the
/// most tokens it may ever hold (prompt + max_new_tokens), which is exactly
/// what its budget reservation covered.
pub struct KvCache {
    pub(super) layers: KvLayers,
    pub(super) len: usize,
    pub(super) capacity: usize,
}

/// Per layer: keys and values, each `[kv_heads, capacity, head_dim]`, as
/// plain buffers (host step) or tensors (candle step).
pub(super) enum KvLayers {
    Host(Vec<(Vec<f32>, Vec<f32>)>),
    Tensors(Vec<(Tensor, Tensor)>),
}

impl KvCache {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }
}

/// A sequence's part in one forward step: its cache and the tokens to add.
pub struct Segment<'a, C = KvCache> {
    pub cache: &'a mut C,
    pub tokens: &'a [u32],
}
