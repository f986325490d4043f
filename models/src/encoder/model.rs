//! The trait every encoder answers to, and the batch shape that costs the
//! most.

use crate::error::ModelError;

/// An embedding model: token ids in, one pooled vector per item out (pooled
/// as the model's sentence-transformers files say). A cross-encoder is one
/// too ([`CrossEncoder`](super::cross_encoder::CrossEncoder)): its items are (query, document)
/// pairs with their token types, its vector the pair's one score, so the
/// rerank task is batched, budgeted and run exactly as embeddings are.
pub trait EmbeddingModel: Send {
    /// Which forward runs (for logs and reports), e.g. `"sluice-avx512"`.
    fn forward_name(&self) -> &'static str;
    /// Length of the vectors.
    fn dim(&self) -> usize;
    /// Tokens per item the model accepts.
    fn max_tokens_per_item(&self) -> usize;
    /// Peak bytes a forward pass over `items` sequences padded to `len`
    /// tokens needs beyond the weights: activations, and attention, which grows
    /// with `len^2`.
    fn batch_cost_bytes(&self, items: usize, len: usize) -> u64;
    /// Pooled, unnormalized vectors, one per sequence, in order, every
    /// token of type 0.
    fn embed(&self, batch: &[&[u32]]) -> Result<Vec<Vec<f32>>, ModelError> {
        self.embed_typed(batch, None)
    }
    /// [`EmbeddingModel::embed`] with each token's type (`types[i]` as long
    /// as `batch[i]`; a pair's second text is type 1 in BERT's template;
    /// `None`: all type 0). A model that reads no token types ignores them.
    fn embed_typed(
        &self,
        batch: &[&[u32]],
        types: Option<&[&[u32]]>,
    ) -> Result<Vec<Vec<f32>>, ModelError>;
}

/// The batch shape with the highest cost that `max_batch_tokens` allows: items
/// at the longest length, since attention grows with the square of the length.
pub fn worst_batch_shape(max_batch_tokens: usize, max_tokens_per_item: usize) -> (usize, usize) {
    let len = max_tokens_per_item.min(max_batch_tokens).max(1);
    ((max_batch_tokens / len).max(1), len)
}
