//! Sequence classifiers: a BERT, RoBERTa or XLM-RoBERTa
//! `...ForSequenceClassification` of N labels over one text, its logits
//! turned into scores as transformers' `text-classification` pipeline does
//! by default: none for a `regression` problem, sigmoid for a
//! `multi_label_classification` one or a single label, softmax otherwise.
//!
//! The head and what it reads of `config.json` (labels from `id2label`,
//! token types) are the rerankers' too (`sequence_classification.rs`); the
//! encoder is the embedding models' (`SentenceEncoder`, both forwards),
//! pooling the first token.

use std::path::Path;

use candle_core::Device;
use serde_json::Value;

use super::files::{check_model_type, declared_max_tokens, read_json, unsupported};
use super::model::EmbeddingModel;
use super::sentence_encoder::{ForwardChoice, SentenceEncoder};
use super::sequence_classification::{
    Head, check_architectures, check_only_transformer, labels, load_encoder_and_head, token_types,
};
use crate::error::{LoadError, ModelError};

/// What turns a text's logits into its label scores.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClassifierActivation {
    /// Scores that sum to 1 over the labels: one label is the answer.
    Softmax,
    /// Each label's own probability: any number of labels may hold.
    Sigmoid,
    /// The raw logits (a regression head).
    Identity,
}

impl ClassifierActivation {
    /// transformers' pipeline default for `problem_type` and `labels`.
    fn of(path: &Path, config: &Value, labels: usize) -> Result<ClassifierActivation, LoadError> {
        let problem = match config.get("problem_type") {
            None | Some(Value::Null) => None,
            Some(Value::String(p))
                if [
                    "regression",
                    "single_label_classification",
                    "multi_label_classification",
                ]
                .contains(&p.as_str()) =>
            {
                Some(p.as_str())
            }
            Some(other) => {
                return Err(unsupported(
                    path,
                    "problem_type",
                    other,
                    "regression, single_label_classification, multi_label_classification or none",
                ));
            }
        };
        // The pipeline's order: a single label is sigmoid whatever else.
        Ok(match problem {
            Some("regression") => ClassifierActivation::Identity,
            Some("multi_label_classification") => ClassifierActivation::Sigmoid,
            _ if labels == 1 => ClassifierActivation::Sigmoid,
            _ => ClassifierActivation::Softmax,
        })
    }

    /// Turns `logits` into scores in place.
    pub fn apply(self, logits: &mut [f32]) {
        match self {
            ClassifierActivation::Softmax => {
                let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let mut sum = 0.0;
                for x in logits.iter_mut() {
                    *x = (*x - max).exp();
                    sum += *x;
                }
                logits.iter_mut().for_each(|x| *x /= sum);
            }
            ClassifierActivation::Sigmoid => {
                logits
                    .iter_mut()
                    .for_each(|x| *x = 1.0 / (1.0 + (-*x).exp()));
            }
            ClassifierActivation::Identity => {}
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            ClassifierActivation::Softmax => "softmax",
            ClassifierActivation::Sigmoid => "sigmoid",
            ClassifierActivation::Identity => "none",
        }
    }
}

/// What a classifier directory asks beyond its encoder's weights.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClassifierFiles {
    /// The labels' names, in their ids' order.
    pub labels: Vec<String>,
    pub activation: ClassifierActivation,
    /// The tokens per text the directory declares, if any.
    pub max_seq_length: Option<usize>,
    /// Whether the model reads token type ids (all 0 for one text).
    pub token_types: bool,
}

impl ClassifierFiles {
    pub fn read(dir: &Path) -> Result<ClassifierFiles, LoadError> {
        let config_path = dir.join("config.json");
        let config = read_json(&config_path)?;
        check_model_type(&config_path, &config)?;
        check_architectures(&config_path, &config, "a sequence classifier's head")?;
        let labels = labels(&config_path, &config)?;
        // A sentence-transformers CrossEncoder directory of N labels is one
        // too; anything it adds after the transformer is not run here.
        check_only_transformer(dir, "a sequence classifier")?;
        Ok(ClassifierFiles {
            activation: ClassifierActivation::of(&config_path, &config, labels.len())?,
            labels,
            max_seq_length: declared_max_tokens(dir)?,
            token_types: token_types(dir, &config)?,
        })
    }
}

pub struct SequenceClassifier {
    encoder: SentenceEncoder,
    head: Head,
    files: ClassifierFiles,
}

impl SequenceClassifier {
    /// Tokens per text the classifier in `dir` is run with when the
    /// deployment sets none: the limit its files declare, else
    /// [`super::DEFAULT_MAX_TOKENS`], never more than its positions hold.
    pub fn max_tokens_of(dir: &Path) -> Result<usize, LoadError> {
        let files = ClassifierFiles::read(dir)?;
        SentenceEncoder::limit_within_positions(dir, files.max_seq_length)
    }

    /// Loads the classifier in `dir` with the fastest forward for `device`
    /// at the precision `weights` asks for, cutting texts at
    /// `max_tokens_per_text` (none: [`SequenceClassifier::max_tokens_of`]).
    /// `auto` is f32, as for rerankers: scores are held to 1e-4, and the
    /// bf16 layers move them by about 1e-3.
    pub fn load(
        dir: &Path,
        device: Device,
        max_tokens_per_text: Option<usize>,
        weights: super::weights::EmbedWeights,
    ) -> Result<SequenceClassifier, LoadError> {
        let max_tokens_per_text = match max_tokens_per_text {
            Some(n) => n,
            None => Self::max_tokens_of(dir)?,
        };
        let weights = match weights {
            super::weights::EmbedWeights::Auto => super::weights::EmbedWeights::F32,
            asked => asked,
        };
        let choice = SentenceEncoder::choice_for(&device, weights);
        Self::load_with(dir, device, max_tokens_per_text, choice)
    }

    pub fn load_with(
        dir: &Path,
        device: Device,
        max_tokens_per_text: usize,
        choice: ForwardChoice,
    ) -> Result<SequenceClassifier, LoadError> {
        let files = ClassifierFiles::read(dir)?;
        let (encoder, head) = load_encoder_and_head(
            dir,
            device,
            max_tokens_per_text,
            files.max_seq_length,
            files.labels.len(),
            choice,
        )?;
        tracing::info!(
            model = %dir.display(),
            labels = files.labels.len(),
            activation = files.activation.name(),
            token_types = files.token_types,
            "sequence classifier files read"
        );
        Ok(SequenceClassifier {
            encoder,
            head,
            files,
        })
    }

    /// The labels' names, in their ids' order.
    pub fn labels(&self) -> &[String] {
        &self.files.labels
    }

    pub fn activation(&self) -> ClassifierActivation {
        self.files.activation
    }
}

/// A classifier's "vector" is its text's logits, one per label, so the
/// classify task runs on the embed task's batcher, executor and budget
/// unchanged; the task applies [`SequenceClassifier::activation`].
impl EmbeddingModel for SequenceClassifier {
    fn forward_name(&self) -> &'static str {
        self.encoder.forward_name()
    }

    /// One logit per label.
    fn dim(&self) -> usize {
        self.files.labels.len()
    }

    fn max_tokens_per_item(&self) -> usize {
        self.encoder.max_tokens_per_item()
    }

    /// The encoder's: the head's few vectors are noise beside it.
    fn batch_cost_bytes(&self, items: usize, len: usize) -> u64 {
        self.encoder.batch_cost_bytes(items, len)
    }

    /// The logits of each text, every token of type 0 (one text).
    fn embed_typed(
        &self,
        batch: &[&[u32]],
        types: Option<&[&[u32]]>,
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        let types = types.filter(|_| self.files.token_types);
        let first_tokens = self.encoder.embed_typed(batch, types)?;
        Ok(first_tokens
            .iter()
            .map(|first| self.head.logits(first))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    const BERT_TOKENIZER: &str = r#"{"tokenizer_class": "BertTokenizer"}"#;

    fn dir_with(config: &str, files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("config.json"), config).unwrap();
        std::fs::write(dir.path().join("tokenizer_config.json"), BERT_TOKENIZER).unwrap();
        for (path, text) in files {
            std::fs::write(dir.path().join(path), text).unwrap();
        }
        dir
    }

    /// What each directory reads as (labels, the pipeline's default
    /// activation), or the words its refusal carries.
    #[test]
    fn each_classifier_directory_reads_as_the_pipeline_would_or_is_refused() {
        let ok = |labels: &[&str], activation| {
            Ok(ClassifierFiles {
                labels: labels.iter().map(|l| l.to_string()).collect(),
                activation,
                max_seq_length: None,
                token_types: true,
            })
        };
        let head = r#""model_type": "bert", "architectures": ["BertForSequenceClassification"]"#;
        type Case = (
            String,
            Vec<(&'static str, &'static str)>,
            Result<ClassifierFiles, Vec<&'static str>>,
        );
        let cases: Vec<Case> = vec![
            (
                format!(r#"{{{head}, "id2label": {{"0": "neg", "1": "pos"}}}}"#),
                vec![],
                ok(&["neg", "pos"], ClassifierActivation::Softmax),
            ),
            (
                format!(
                    r#"{{{head}, "id2label": {{"0": "a", "1": "b", "2": "c"}}, "problem_type": "multi_label_classification"}}"#
                ),
                vec![],
                ok(&["a", "b", "c"], ClassifierActivation::Sigmoid),
            ),
            (
                format!(r#"{{{head}, "num_labels": 1}}"#),
                vec![],
                ok(&["LABEL_0"], ClassifierActivation::Sigmoid),
            ),
            (
                format!(r#"{{{head}, "num_labels": 1, "problem_type": "regression"}}"#),
                vec![],
                ok(&["LABEL_0"], ClassifierActivation::Identity),
            ),
            (
                format!(r#"{{{head}, "problem_type": "single_label_classification"}}"#),
                vec![],
                ok(&["LABEL_0", "LABEL_1"], ClassifierActivation::Softmax),
            ),
            (
                format!(r#"{{{head}, "problem_type": "ranking"}}"#),
                vec![],
                Err(vec!["config.json", "problem_type = \"ranking\""]),
            ),
            (
                r#"{"model_type": "bert", "architectures": ["BertForTokenClassification"]}"#.into(),
                vec![],
                Err(vec!["architectures", "a sequence classifier's head"]),
            ),
            (
                format!(r#"{{{head}}}"#),
                vec![(
                    "modules.json",
                    r#"[{"type": "sentence_transformers.models.Transformer"}, {"type": "sentence_transformers.models.Pooling"}]"#,
                )],
                Err(vec!["modules.json", "one Transformer module"]),
            ),
        ];
        for (config, files, expected) in cases {
            let dir = dir_with(&config, &files);
            crate::encoder::files::assert_reads_as(
                &config,
                ClassifierFiles::read(dir.path()),
                expected,
            );
        }
    }

    /// Softmax sums to one and keeps the order; sigmoid is each logit's own.
    #[test]
    fn activations_turn_logits_into_the_pipelines_scores() {
        let mut x = [1.0f32, 2.0, 3.0];
        ClassifierActivation::Softmax.apply(&mut x);
        let want = [0.090_030_57, 0.244_728_48, 0.665_240_94];
        for (got, want) in x.iter().zip(want) {
            assert!((got - want).abs() < 1e-6, "{x:?}");
        }
        let mut y = [0.0f32, -2.0];
        ClassifierActivation::Sigmoid.apply(&mut y);
        assert!(
            (y[0] - 0.5).abs() < 1e-7 && (y[1] - 0.119_202_92).abs() < 1e-6,
            "{y:?}"
        );
        let mut z = [-3.5f32];
        ClassifierActivation::Identity.apply(&mut z);
        assert_eq!(z, [-3.5]);
    }
}
