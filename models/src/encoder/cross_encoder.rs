//! Cross-encoders (rerankers): a BERT, RoBERTa or XLM-RoBERTa encoder over a
//! (query, document) pair in the tokenizer's pair template, its first
//! token's last state through the sequence-classification head (a dense
//! layer and tanh, then one score: BERT's `bert.pooler` + `classifier`,
//! RoBERTa's `classifier.dense` + `classifier.out_proj`), then the
//! activation sentence-transformers' `CrossEncoder` applies (sigmoid by
//! default for one label, or what its files name).
//!
//! The head and what it reads of `config.json` are every sequence
//! classifier's (`sequence_classification.rs`).
//!
//! The directory is read and checked first, as for embedding models: a head
//! with other than one label, an activation sluice does not run, modules
//! beyond the transformer, or token types it cannot tell are refused naming
//! the file and the field. The encoder is the embedding models' (`SentenceEncoder`,
//! both forwards), pooling the first token.

use std::path::Path;

use candle_core::Device;
use serde_json::Value;

use super::files::{
    check_model_type, declared_max_tokens, read_json, read_optional_json, unsupported,
};
use super::model::EmbeddingModel;
use super::sentence_encoder::{ForwardChoice, SentenceEncoder};
use super::sequence_classification::{
    Head, check_architectures, check_only_transformer, labels, load_encoder_and_head, token_types,
};
use crate::error::{LoadError, ModelError};

/// What turns the head's logit into the score.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScoreActivation {
    /// `1 / (1 + e^-x)`: sentence-transformers' default for one label.
    Sigmoid,
    /// The raw logit.
    Identity,
}

impl ScoreActivation {
    fn apply(self, x: f32) -> f32 {
        match self {
            ScoreActivation::Sigmoid => 1.0 / (1.0 + (-x).exp()),
            ScoreActivation::Identity => x,
        }
    }
}

/// What a cross-encoder directory asks beyond its encoder's weights.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CrossEncoderFiles {
    pub activation: ScoreActivation,
    /// The tokens per pair the directory declares, if any.
    pub max_seq_length: Option<usize>,
    /// Whether the model reads token type ids (BERT's tokenizers pass them;
    /// XLM-RoBERTa's do not).
    pub token_types: bool,
}

impl CrossEncoderFiles {
    pub fn read(dir: &Path) -> Result<CrossEncoderFiles, LoadError> {
        let config_path = dir.join("config.json");
        let config = read_json(&config_path)?;
        check_model_type(&config_path, &config)?;
        check_architectures(&config_path, &config, "a cross-encoder's head")?;
        let labels = labels(&config_path, &config)?.len();
        if labels != 1 {
            return Err(unsupported(
                &config_path,
                "id2label",
                config.get("id2label").unwrap_or(&Value::Null),
                "one label: a reranker gives one score per pair",
            ));
        }
        check_only_transformer(dir, "a cross-encoder")?;
        let st_path = dir.join("config_sentence_transformers.json");
        let activation = match read_optional_json(&st_path)? {
            Some(st) if st.get("activation_fn").is_some() => {
                activation_of(&st_path, &st["activation_fn"])?
            }
            // sentence-transformers before 4 kept it in config.json.
            _ => match config.pointer("/sentence_transformers/activation_fn") {
                Some(name) => activation_of(&config_path, name)?,
                None => ScoreActivation::Sigmoid,
            },
        };
        Ok(CrossEncoderFiles {
            activation,
            max_seq_length: declared_max_tokens(dir)?,
            token_types: token_types(dir, &config)?,
        })
    }
}

fn activation_of(path: &Path, name: &Value) -> Result<ScoreActivation, LoadError> {
    match name.as_str() {
        Some("torch.nn.modules.activation.Sigmoid") => Ok(ScoreActivation::Sigmoid),
        Some("torch.nn.modules.linear.Identity") => Ok(ScoreActivation::Identity),
        _ => Err(unsupported(
            path,
            "activation_fn",
            name,
            "torch.nn.modules.activation.Sigmoid or torch.nn.modules.linear.Identity",
        )),
    }
}

pub struct CrossEncoder {
    encoder: SentenceEncoder,
    head: Head,
    files: CrossEncoderFiles,
}

impl CrossEncoder {
    /// Tokens per pair the reranker in `dir` is run with when the
    /// deployment sets none: the limit its files declare (what
    /// sentence-transformers' `CrossEncoder` truncates at), else
    /// [`super::DEFAULT_MAX_TOKENS`], never more than its positions hold.
    pub fn max_tokens_of(dir: &Path) -> Result<usize, LoadError> {
        let files = CrossEncoderFiles::read(dir)?;
        SentenceEncoder::limit_within_positions(dir, files.max_seq_length)
    }

    /// Loads the reranker in `dir` with the fastest forward for `device`
    /// at the precision `weights` asks for, cutting pairs at
    /// `max_tokens_per_pair` (none: [`CrossEncoder::max_tokens_of`]).
    ///
    /// `auto` is f32 here, not the embedding models' measured choice: the
    /// bf16 layers move a score by about 1e-3 (1.3e-3 on the random-weight
    /// BERT reranker on an Intel Xeon's AMX tiles), ten times the 1e-4 a
    /// reranker is held to, enough to swap two close documents. `bf16`
    /// still asks for them.
    pub fn load(
        dir: &Path,
        device: Device,
        max_tokens_per_pair: Option<usize>,
        weights: super::weights::EmbedWeights,
    ) -> Result<CrossEncoder, LoadError> {
        let max_tokens_per_pair = match max_tokens_per_pair {
            Some(n) => n,
            None => Self::max_tokens_of(dir)?,
        };
        let weights = match weights {
            super::weights::EmbedWeights::Auto => super::weights::EmbedWeights::F32,
            asked => asked,
        };
        let choice = SentenceEncoder::choice_for(&device, weights);
        Self::load_with(dir, device, max_tokens_per_pair, choice)
    }

    pub fn load_with(
        dir: &Path,
        device: Device,
        max_tokens_per_pair: usize,
        choice: ForwardChoice,
    ) -> Result<CrossEncoder, LoadError> {
        let files = CrossEncoderFiles::read(dir)?;
        let (encoder, head) = load_encoder_and_head(
            dir,
            device,
            max_tokens_per_pair,
            files.max_seq_length,
            1,
            choice,
        )?;
        tracing::info!(
            model = %dir.display(),
            activation = ?files.activation,
            token_types = files.token_types,
            "cross-encoder files read"
        );
        Ok(CrossEncoder {
            encoder,
            head,
            files,
        })
    }

    pub fn activation(&self) -> ScoreActivation {
        self.files.activation
    }

    /// One score per pair, in order: `ids[i]` in the pair template with
    /// `types[i]` its token types (read only where the model takes them).
    pub fn score(&self, ids: &[&[u32]], types: &[&[u32]]) -> Result<Vec<f32>, ModelError> {
        let types = self.files.token_types.then_some(types);
        let first_tokens = self.encoder.embed_typed(ids, types)?;
        Ok(first_tokens
            .iter()
            .map(|cls| self.files.activation.apply(self.head.logits(cls)[0]))
            .collect())
    }
}

/// A cross-encoder's "vector" is its pair's one score, so the rerank task
/// runs on the embed task's batcher, executor and budget unchanged.
impl EmbeddingModel for CrossEncoder {
    fn forward_name(&self) -> &'static str {
        self.encoder.forward_name()
    }

    /// One score per pair.
    fn dim(&self) -> usize {
        1
    }

    fn max_tokens_per_item(&self) -> usize {
        self.encoder.max_tokens_per_item()
    }

    /// The encoder's: the head's few vectors are noise beside it.
    fn batch_cost_bytes(&self, items: usize, len: usize) -> u64 {
        self.encoder.batch_cost_bytes(items, len)
    }

    /// `[score]` per pair. Without `types` every token is type 0, which a
    /// BERT cross-encoder reads as a different pair: the rerank task always
    /// passes the tokenizer's.
    fn embed_typed(
        &self,
        batch: &[&[u32]],
        types: Option<&[&[u32]]>,
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        let zeros: Vec<Vec<u32>> = match types {
            Some(_) => Vec::new(),
            None => batch.iter().map(|s| vec![0; s.len()]).collect(),
        };
        let zero_refs: Vec<&[u32]> = zeros.iter().map(Vec::as_slice).collect();
        let types = types.unwrap_or(&zero_refs);
        Ok(self
            .score(batch, types)?
            .into_iter()
            .map(|s| vec![s])
            .collect())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    /// A directory with a BERT cross-encoder's `config.json` (unless
    /// `files` brings its own) and `files`.
    fn dir_with(files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        if !files.iter().any(|(p, _)| *p == "config.json") {
            std::fs::write(
                dir.path().join("config.json"),
                r#"{"model_type": "bert", "architectures": ["BertForSequenceClassification"], "id2label": {"0": "LABEL_0"}}"#,
            )
            .unwrap();
        }
        for (path, text) in files {
            std::fs::write(dir.path().join(path), text).unwrap();
        }
        dir
    }

    const BERT_TOKENIZER: &str = r#"{"tokenizer_class": "BertTokenizer"}"#;

    /// What each directory reads as, or the words its refusal carries.
    #[test]
    fn each_cross_encoder_directory_reads_as_sentence_transformers_would_or_is_refused() {
        let ok = |activation, max_seq_length, token_types| {
            Ok(CrossEncoderFiles {
                activation,
                max_seq_length,
                token_types,
            })
        };
        type Case<'a> = (
            &'a str,
            Vec<(&'a str, &'a str)>,
            Result<CrossEncoderFiles, Vec<&'a str>>,
        );
        let cases: Vec<Case> = vec![
            (
                "sentence-transformers' default activation",
                vec![("tokenizer_config.json", BERT_TOKENIZER)],
                ok(ScoreActivation::Sigmoid, None, true),
            ),
            (
                "identity, from sentence-transformers 6's file",
                vec![
                    ("tokenizer_config.json", BERT_TOKENIZER),
                    (
                        "config_sentence_transformers.json",
                        r#"{"model_type": "CrossEncoder", "activation_fn": "torch.nn.modules.linear.Identity"}"#,
                    ),
                    ("sentence_bert_config.json", r#"{"max_seq_length": 512}"#),
                ],
                ok(ScoreActivation::Identity, Some(512), true),
            ),
            (
                "identity, from an older config.json",
                vec![
                    (
                        "config.json",
                        r#"{"model_type": "bert", "architectures": ["BertForSequenceClassification"], "num_labels": 1, "sentence_transformers": {"activation_fn": "torch.nn.modules.linear.Identity"}}"#,
                    ),
                    ("tokenizer_config.json", BERT_TOKENIZER),
                ],
                ok(ScoreActivation::Identity, None, true),
            ),
            (
                "a tokenizer that passes no token types",
                vec![(
                    "tokenizer_config.json",
                    r#"{"model_input_names": ["input_ids", "attention_mask"]}"#,
                )],
                ok(ScoreActivation::Sigmoid, None, false),
            ),
            (
                "XLM-RoBERTa's one token type",
                vec![(
                    "config.json",
                    r#"{"model_type": "xlm-roberta", "architectures": ["XLMRobertaForSequenceClassification"], "id2label": {"0": "LABEL_0"}, "type_vocab_size": 1}"#,
                )],
                ok(ScoreActivation::Sigmoid, None, false),
            ),
            (
                "an embedding model",
                vec![(
                    "config.json",
                    r#"{"model_type": "bert", "architectures": ["BertModel"]}"#,
                )],
                Err(vec![
                    "config.json",
                    "architectures",
                    "a cross-encoder's head",
                ]),
            ),
            (
                "two labels",
                vec![(
                    "config.json",
                    r#"{"model_type": "bert", "architectures": ["BertForSequenceClassification"], "id2label": {"0": "no", "1": "yes"}}"#,
                )],
                Err(vec!["config.json", "id2label", "one label"]),
            ),
            (
                "transformers' default of two labels",
                vec![(
                    "config.json",
                    r#"{"model_type": "bert", "architectures": ["BertForSequenceClassification"]}"#,
                )],
                Err(vec!["id2label", "one label"]),
            ),
            (
                "another activation",
                vec![
                    ("tokenizer_config.json", BERT_TOKENIZER),
                    (
                        "config_sentence_transformers.json",
                        r#"{"activation_fn": "torch.nn.modules.activation.Tanh"}"#,
                    ),
                ],
                Err(vec![
                    "config_sentence_transformers.json",
                    "activation_fn = \"torch.nn.modules.activation.Tanh\"",
                ]),
            ),
            (
                "a module after the transformer",
                vec![(
                    "modules.json",
                    r#"[{"type": "sentence_transformers.models.Transformer"}, {"type": "sentence_transformers.models.Pooling"}]"#,
                )],
                Err(vec!["modules.json", "one Transformer module"]),
            ),
            (
                "token types it cannot tell",
                vec![(
                    "tokenizer_config.json",
                    r#"{"tokenizer_class": "ElectraTokenizer"}"#,
                )],
                Err(vec![
                    "tokenizer_config.json",
                    "tokenizer_class = \"ElectraTokenizer\"",
                ]),
            ),
        ];
        for (what, files, expected) in cases {
            let dir = dir_with(&files);
            crate::encoder::files::assert_reads_as(
                what,
                CrossEncoderFiles::read(dir.path()),
                expected,
            );
        }
    }
}
