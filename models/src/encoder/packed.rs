//! A BERT encoder forward for the CPU, on `encoder_kernels`: the batch's
//! sequences are packed end to end (no padding: a short text costs its own
//! tokens, not the batch's longest), each linear layer is one blocked matrix
//! product over every token of the batch (Q, K and V fused into one), and
//! attention runs per sequence and head without materializing the score
//! tensor. Pooling (`pooling.rs`) happens on each sequence's packed rows.
//!
//! Same arithmetic as candle-transformers' `BertModel` (post-norm layers, erf
//! GELU, absolute positions, token type 0) up to f32 rounding; the model tests
//! hold the two together, and the device-neutral path stays on candle.

use candle_core::Tensor;
use candle_nn::VarBuilder;
use candle_transformers::models::bert::{Config as BertConfig, HiddenAct, PositionEmbeddingType};

use super::pooling::Pooling;
use crate::encoder_kernels::{self as kernels, Activation, Heads, PackedLinear, Span};
use crate::error::EncoderInputError;

pub struct BertEncoder {
    positions_from: PositionIds,
    hidden: usize,
    heads: Heads,
    vocab: usize,
    max_positions: usize,
    /// `[vocab, hidden]`.
    words: Vec<f32>,
    /// `[positions, hidden]`, with token type 0's embedding added.
    positions: Vec<f32>,
    /// `[types - 1, hidden]`: token type t's embedding minus type 0's, for
    /// t >= 1 (the second text of a pair).
    type_deltas: Vec<f32>,
    embeddings_norm: LayerNorm,
    layers: Vec<EncoderLayer>,
}

/// Where a sequence's position ids start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PositionIds {
    /// BERT: 0, 1, 2, ...
    FromZero,
    /// RoBERTa and XLM-RoBERTa: after the padding id, `pad + 1, pad + 2,
    /// ...`, a padding token itself at `pad` (transformers'
    /// `create_position_ids_from_input_ids`).
    AfterPadding { pad: u32 },
}

impl PositionIds {
    /// The positions `config` numbers its tokens from (by `model_type`).
    pub fn of(config: &BertConfig) -> PositionIds {
        match config.model_type.as_deref() {
            Some("roberta" | "xlm-roberta") => PositionIds::AfterPadding {
                pad: config.pad_token_id as u32,
            },
            _ => PositionIds::FromZero,
        }
    }

    /// Tokens a sequence may have with `table` position embeddings.
    pub fn max_tokens(self, table: usize) -> usize {
        match self {
            PositionIds::FromZero => table,
            PositionIds::AfterPadding { pad } => table.saturating_sub(pad as usize + 1),
        }
    }

    /// Each token's row of the position table.
    fn rows(self, seq: &[u32]) -> impl Iterator<Item = usize> + '_ {
        let mut real = 0usize;
        seq.iter().enumerate().map(move |(i, id)| match self {
            PositionIds::FromZero => i,
            PositionIds::AfterPadding { pad } if *id == pad => pad as usize,
            PositionIds::AfterPadding { pad } => {
                real += 1;
                pad as usize + real
            }
        })
    }
}

struct EncoderLayer {
    /// Queries, keys and values in one product: `hidden -> 3 * hidden`.
    qkv: PackedLinear,
    attention_out: PackedLinear,
    attention_norm: LayerNorm,
    up: PackedLinear,
    down: PackedLinear,
    output_norm: LayerNorm,
}

struct LayerNorm {
    weight: Vec<f32>,
    bias: Vec<f32>,
    eps: f32,
}

fn values(t: Tensor) -> candle_core::Result<Vec<f32>> {
    t.flatten_all()?.to_vec1::<f32>()
}

impl BertEncoder {
    /// The kernel the linear layers run on when they are bf16 (`None`
    /// when they are f32).
    pub fn bf16_kernels(&self) -> Option<kernels::Bf16Kernels> {
        self.layers.first().and_then(|l| l.qkv.bf16_kernels())
    }

    /// Why this forward cannot run `config`, if it cannot (the caller then
    /// keeps candle-transformers' forward).
    pub fn unsupported(config: &BertConfig) -> Option<String> {
        if !matches!(config.hidden_act, HiddenAct::Gelu) {
            return Some(format!(
                "activation {:?} (only erf GELU)",
                config.hidden_act
            ));
        }
        if !matches!(
            config.position_embedding_type,
            PositionEmbeddingType::Absolute
        ) {
            return Some("relative position embeddings".into());
        }
        if config.num_attention_heads == 0
            || !config
                .hidden_size
                .is_multiple_of(config.num_attention_heads)
        {
            return Some("hidden size not divisible by the heads".into());
        }
        if !(config.hidden_size / config.num_attention_heads).is_multiple_of(32) {
            return Some("head size not a multiple of 32 (the attention kernel's unit)".into());
        }
        if config.type_vocab_size == 0 {
            return Some("no token type embeddings".into());
        }
        None
    }

    /// Packs the weights of a BERT checkpoint (`vb` at the model's root).
    /// Loads the weights, the linear layers in bf16 where `weights` asks
    /// for it and the CPU runs it (f32 otherwise).
    pub fn load(
        vb: VarBuilder,
        config: &BertConfig,
        weights: super::weights::EmbedWeights,
    ) -> candle_core::Result<BertEncoder> {
        let pack = |w: &[f32], outputs: usize, inputs: usize, b: &[f32]| match weights {
            super::weights::EmbedWeights::Bf16 => {
                PackedLinear::new_bf16(w, outputs, inputs, Some(b))
                    .unwrap_or_else(|| PackedLinear::new(w, outputs, inputs, Some(b)))
            }
            super::weights::EmbedWeights::F32 | super::weights::EmbedWeights::Auto => {
                PackedLinear::new(w, outputs, inputs, Some(b))
            }
        };
        // A checkpoint saved from a task model keeps the encoder under its
        // family's name.
        let vb = match ["bert", "roberta"]
            .into_iter()
            .find(|p| vb.contains_tensor(&format!("{p}.embeddings.word_embeddings.weight")))
        {
            Some(prefix) => vb.pp(prefix),
            None => vb,
        };
        let (h, i) = (config.hidden_size, config.intermediate_size);
        let eps = config.layer_norm_eps as f32;
        let norm = |vb: VarBuilder| -> candle_core::Result<LayerNorm> {
            Ok(LayerNorm {
                weight: values(vb.get(h, "weight")?)?,
                bias: values(vb.get(h, "bias")?)?,
                eps,
            })
        };
        let linear =
            |vb: VarBuilder, outputs: usize, inputs: usize| -> candle_core::Result<PackedLinear> {
                let w = values(vb.get((outputs, inputs), "weight")?)?;
                let b = values(vb.get(outputs, "bias")?)?;
                Ok(pack(&w, outputs, inputs, &b))
            };
        let e = vb.pp("embeddings");
        let words = values(e.get((config.vocab_size, h), "word_embeddings.weight")?)?;
        let mut positions = values(e.get(
            (config.max_position_embeddings, h),
            "position_embeddings.weight",
        )?)?;
        let token_types =
            values(e.get((config.type_vocab_size, h), "token_type_embeddings.weight")?)?;
        for row in positions.chunks_exact_mut(h) {
            for (p, t) in row.iter_mut().zip(&token_types[..h]) {
                *p += t;
            }
        }
        let type_deltas: Vec<f32> = token_types[h.min(token_types.len())..]
            .chunks_exact(h)
            .flat_map(|row| row.iter().zip(&token_types[..h]).map(|(t, t0)| t - t0))
            .collect();
        let embeddings_norm = norm(e.pp("LayerNorm"))?;
        let mut layers = Vec::with_capacity(config.num_hidden_layers);
        for l in 0..config.num_hidden_layers {
            let vb = vb.pp(format!("encoder.layer.{l}"));
            let attention = vb.pp("attention");
            let (mut w, mut b) = (Vec::with_capacity(3 * h * h), Vec::with_capacity(3 * h));
            for part in ["query", "key", "value"] {
                let p = attention.pp("self").pp(part);
                w.extend(values(p.get((h, h), "weight")?)?);
                b.extend(values(p.get(h, "bias")?)?);
            }
            layers.push(EncoderLayer {
                qkv: pack(&w, 3 * h, h, &b),
                attention_out: linear(attention.pp("output.dense"), h, h)?,
                attention_norm: norm(attention.pp("output.LayerNorm"))?,
                up: linear(vb.pp("intermediate.dense"), i, h)?,
                down: linear(vb.pp("output.dense"), h, i)?,
                output_norm: norm(vb.pp("output.LayerNorm"))?,
            });
        }
        Ok(BertEncoder {
            positions_from: PositionIds::of(config),
            hidden: h,
            heads: Heads {
                heads: config.num_attention_heads,
                head_dim: h / config.num_attention_heads,
            },
            vocab: config.vocab_size,
            max_positions: config.max_position_embeddings,
            words,
            positions,
            type_deltas,
            embeddings_norm,
            layers,
        })
    }

    /// The last hidden states pooled by `pooling`, one vector per
    /// sequence, with each token's type (`types[i]` as long as `batch[i]`;
    /// none: all type 0), as a pair's second text has.
    pub fn embed_typed(
        &self,
        batch: &[&[u32]],
        types: Option<&[&[u32]]>,
        pooling: Pooling,
    ) -> Result<Vec<Vec<f32>>, EncoderInputError> {
        let h = self.hidden;
        let type_count = 1 + self.type_deltas.len() / h.max(1);
        // (Each sequence's types as long as it: checked by `SentenceEncoder`.)
        if let Some(id) = types
            .into_iter()
            .flatten()
            .flat_map(|t| t.iter())
            .find(|id| **id as usize >= type_count)
        {
            return Err(EncoderInputError::BadTokenType {
                id: *id,
                types: type_count,
            });
        }
        let mut spans = Vec::with_capacity(batch.len());
        let mut tokens = 0;
        for seq in batch {
            let max_tokens = self.positions_from.max_tokens(self.max_positions);
            if seq.len() > max_tokens {
                return Err(EncoderInputError::TooLong {
                    tokens: seq.len(),
                    positions: max_tokens,
                });
            }
            if let Some(id) = seq.iter().find(|id| **id as usize >= self.vocab) {
                return Err(EncoderInputError::OutOfVocabulary {
                    id: *id,
                    vocab: self.vocab,
                });
            }
            spans.push(Span {
                start: tokens,
                len: seq.len(),
            });
            tokens += seq.len();
        }
        let mut hidden = vec![0f32; tokens * h];
        let positioned = batch
            .iter()
            .flat_map(|seq| self.positions_from.rows(seq).zip(seq.iter()));
        for (row, (pos, id)) in hidden.chunks_exact_mut(h).zip(positioned) {
            let word = &self.words[*id as usize * h..(*id as usize + 1) * h];
            let position = &self.positions[pos * h..(pos + 1) * h];
            for ((r, w), p) in row.iter_mut().zip(word).zip(position) {
                *r = w + p;
            }
        }
        if let Some(types) = types {
            let typed = types.iter().flat_map(|t| t.iter());
            for (row, &t) in hidden.chunks_exact_mut(h).zip(typed) {
                if t > 0 {
                    let delta = &self.type_deltas[(t as usize - 1) * h..t as usize * h];
                    for (r, d) in row.iter_mut().zip(delta) {
                        *r += d;
                    }
                }
            }
        }
        self.embeddings_norm.apply(&mut hidden, None);
        // One buffer per activation, reused by every layer (the kernels
        // overwrite them whole): allocated and faulted in once per batch.
        let (mut qkv, mut context, mut attended, mut inner) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for layer in &self.layers {
            layer
                .qkv
                .forward_into(&hidden, tokens, &mut qkv, Activation::None);
            kernels::attention_into(&qkv, &spans, self.heads, &mut context);
            let out = &layer.attention_out;
            out.forward_into(&context, tokens, &mut attended, Activation::None);
            layer.attention_norm.apply(&mut attended, Some(&hidden));
            layer
                .up
                .forward_into(&attended, tokens, &mut inner, Activation::Gelu);
            layer
                .down
                .forward_into(&inner, tokens, &mut hidden, Activation::None);
            layer.output_norm.apply(&mut hidden, Some(&attended));
        }
        Ok(spans
            .iter()
            .map(|span| pooling.pool(&hidden[span.start * h..(span.start + span.len) * h], h))
            .collect())
    }

    /// Peak bytes of [`BertEncoder::embed_typed`] over `tokens` tokens beyond
    /// the weights, counted generously: the hidden state, Q/K/V, the
    /// context, the attention output and the intermediate all live for the
    /// whole forward (one buffer each, reused by every layer); each
    /// thread's attention scratch holds one head of a sequence of `len`
    /// (per token of that sequence).
    pub fn batch_cost_bytes(&self, tokens: usize, len: usize) -> u64 {
        let (h, i) = (
            self.hidden as u64,
            self.layers.first().map_or(0, |l| l.up.outputs()) as u64,
        );
        let per_token = 6 * h + i;
        let threads = rayon::current_num_threads() as u64;
        let scratch = threads * (len as u64 + 16) * (3 * self.heads.head_dim as u64 + 4);
        4 * (tokens as u64 * per_token + scratch) + threads * (1 << 20)
    }
}

impl LayerNorm {
    /// `x = norm(x + residual)`, per row.
    fn apply(&self, x: &mut [f32], residual: Option<&[f32]>) {
        kernels::layer_norm(x, residual, &self.weight, &self.bias, self.eps);
    }
}
