//! What every `...ForSequenceClassification` model shares, the rerankers'
//! one-label heads and the classifiers' N-label ones: the architectures
//! sluice runs, the labels `config.json` names, whether the tokenizer hands
//! the model token types, and the head itself (a dense layer and tanh over
//! the first token's last state, then one logit per label: BERT's
//! `bert.pooler` + `classifier`, RoBERTa's `classifier.dense` +
//! `classifier.out_proj`).

use std::path::Path;

use candle_core::Device;
use candle_nn::VarBuilder;
use serde_json::Value;

use super::files::{EncoderFiles, Prompts, read_optional_json, unsupported};
use super::model::EmbeddingModel;
use super::pooling::Pooling;
use super::sentence_encoder::{ForwardChoice, SentenceEncoder};
use crate::error::LoadError;

/// The heads sluice runs, by `config.json`'s `architectures`.
pub const ARCHITECTURES: [&str; 3] = [
    "BertForSequenceClassification",
    "RobertaForSequenceClassification",
    "XLMRobertaForSequenceClassification",
];

/// Refuses a `config.json` whose `architectures` name none of
/// [`ARCHITECTURES`]; `what` says what the head is for, in the message.
pub(crate) fn check_architectures(
    path: &Path,
    config: &Value,
    what: &str,
) -> Result<(), LoadError> {
    let architectures: Vec<&str> = config
        .get("architectures")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    if architectures.iter().any(|a| ARCHITECTURES.contains(a)) {
        return Ok(());
    }
    Err(unsupported(
        path,
        "architectures",
        config.get("architectures").unwrap_or(&Value::Null),
        &format!("one of {} ({what})", ARCHITECTURES.join(", ")),
    ))
}

/// The labels in their ids' order, as transformers reads them: `id2label`
/// (its keys exactly `"0"` to `"N-1"`), else `num_labels` of
/// `LABEL_<i>`, else transformers' default of two.
pub(crate) fn labels(path: &Path, config: &Value) -> Result<Vec<String>, LoadError> {
    match (config.get("id2label"), config.get("num_labels")) {
        (Some(Value::Object(map)), _) => {
            let mut labels = vec![None; map.len()];
            for (key, label) in map {
                let slot = key.parse::<usize>().ok().and_then(|i| labels.get_mut(i));
                match (slot, label.as_str()) {
                    (Some(slot @ None), Some(label)) => *slot = Some(label.to_owned()),
                    _ => {
                        return Err(unsupported(
                            path,
                            "id2label",
                            &config["id2label"],
                            "an object of the ids 0 to N-1, each to its label's name",
                        ));
                    }
                }
            }
            Ok(labels.into_iter().flatten().collect())
        }
        (_, Some(n)) => match n.as_u64() {
            Some(n @ 1..=100_000) => Ok((0..n).map(|i| format!("LABEL_{i}")).collect()),
            _ => Err(unsupported(
                path,
                "num_labels",
                n,
                "a whole number, 1 or more",
            )),
        },
        _ => Ok(vec!["LABEL_0".into(), "LABEL_1".into()]),
    }
}

/// Whether transformers hands the model the tokenizer's token type ids:
/// as `tokenizer_config.json`'s `model_input_names` say, else as its
/// `tokenizer_class` does. A model with one token type reads none.
pub(crate) fn token_types(dir: &Path, config: &Value) -> Result<bool, LoadError> {
    if config.get("type_vocab_size").and_then(Value::as_u64) == Some(1) {
        return Ok(false);
    }
    let path = dir.join("tokenizer_config.json");
    let tokenizer = read_optional_json(&path)?.unwrap_or(Value::Null);
    if let Some(names) = tokenizer.get("model_input_names").and_then(Value::as_array) {
        return Ok(names.iter().any(|n| n.as_str() == Some("token_type_ids")));
    }
    match tokenizer.get("tokenizer_class").and_then(Value::as_str) {
        Some("BertTokenizer" | "BertTokenizerFast") => Ok(true),
        Some(
            "RobertaTokenizer"
            | "RobertaTokenizerFast"
            | "XLMRobertaTokenizer"
            | "XLMRobertaTokenizerFast",
        ) => Ok(false),
        _ => Err(unsupported(
            &path,
            "tokenizer_class",
            tokenizer.get("tokenizer_class").unwrap_or(&Value::Null),
            "a BERT or (XLM-)RoBERTa tokenizer, or model_input_names saying whether token_type_ids are passed",
        )),
    }
}

/// Refuses a `modules.json` (sentence-transformers' CrossEncoder writes
/// one) that lists anything beyond the one Transformer module: nothing
/// after the transformer is run here. `what` names the model.
pub(crate) fn check_only_transformer(dir: &Path, what: &str) -> Result<(), LoadError> {
    let modules_path = dir.join("modules.json");
    let Some(modules) = read_optional_json(&modules_path)? else {
        return Ok(());
    };
    let only_transformer = modules.as_array().is_some_and(|m| {
        m.len() == 1
            && m[0]
                .get("type")
                .and_then(Value::as_str)
                .is_some_and(|t| t.ends_with(".Transformer"))
    });
    if only_transformer {
        return Ok(());
    }
    Err(unsupported(
        &modules_path,
        "(the modules)",
        &modules,
        &format!("{what}'s one Transformer module"),
    ))
}

/// The encoder of a sequence-classification directory (pooling its first
/// token) and its head of `labels` logits.
pub(crate) fn load_encoder_and_head(
    dir: &Path,
    device: Device,
    max_tokens: usize,
    max_seq_length: Option<usize>,
    labels: usize,
    choice: ForwardChoice,
) -> Result<(SentenceEncoder, Head), LoadError> {
    let encoder_files = EncoderFiles {
        pooling: Pooling::Cls,
        max_seq_length,
        normalize: false,
        prompts: Prompts::default(),
    };
    let (encoder, weights) =
        SentenceEncoder::load_from(dir, encoder_files, device, max_tokens, choice)?;
    let head = Head::load(
        &dir.join("model.safetensors"),
        &weights,
        encoder.dim(),
        labels,
    )?;
    Ok((encoder, head))
}

/// The head: `logits = out . tanh(dense . first + dense_bias) + out_bias`.
pub(crate) struct Head {
    hidden: usize,
    /// `[hidden, hidden]`, row per output.
    dense: Vec<f32>,
    dense_bias: Vec<f32>,
    /// `[labels, hidden]`, row per label.
    out: Vec<f32>,
    out_bias: Vec<f32>,
}

impl Head {
    /// The head of `labels` logits (BERT's or RoBERTa's tensor names) from
    /// the weights the encoder was loaded from (`path`, for messages).
    pub(crate) fn load(
        path: &Path,
        vb: &VarBuilder,
        hidden: usize,
        labels: usize,
    ) -> Result<Head, LoadError> {
        let names = if vb.contains_tensor("bert.pooler.dense.weight") {
            ["bert.pooler.dense", "classifier"]
        } else {
            ["classifier.dense", "classifier.out_proj"]
        };
        let get = |name: String, shape: &[usize]| -> Result<Vec<f32>, LoadError> {
            if !vb.contains_tensor(&name) {
                return Err(LoadError::Unsupported(format!(
                    "{}: no tensor {name} (the classifier head of {})",
                    path.display(),
                    ARCHITECTURES.join(", ")
                )));
            }
            vb.get(shape, &name)
                .and_then(|t| t.to_device(&Device::Cpu))
                .and_then(|t| t.flatten_all())
                .and_then(|t| t.to_vec1::<f32>())
                .map_err(|source| LoadError::Weights {
                    path: path.to_path_buf(),
                    source,
                })
        };
        Ok(Head {
            hidden,
            dense: get(format!("{}.weight", names[0]), &[hidden, hidden])?,
            dense_bias: get(format!("{}.bias", names[0]), &[hidden])?,
            out: get(format!("{}.weight", names[1]), &[labels, hidden])?,
            out_bias: get(format!("{}.bias", names[1]), &[labels])?,
        })
    }

    /// One logit per label from the first token's last state.
    pub(crate) fn logits(&self, first: &[f32]) -> Vec<f32> {
        let h = self.hidden;
        let pooled: Vec<f32> = self
            .dense
            .chunks_exact(h)
            .zip(&self.dense_bias)
            .map(|(row, b)| (b + row.iter().zip(first).map(|(w, x)| w * x).sum::<f32>()).tanh())
            .collect();
        self.out
            .chunks_exact(h)
            .zip(&self.out_bias)
            .map(|(row, b)| b + row.iter().zip(&pooled).map(|(w, p)| w * p).sum::<f32>())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    /// The labels each `config.json` gives, in id order, or the words of
    /// its refusal.
    #[test]
    fn labels_read_as_transformers_does_or_are_refused() {
        let path = Path::new("config.json");
        let cases: [(&str, Result<Vec<&str>, &str>); 7] = [
            (
                r#"{"id2label": {"1": "pos", "0": "neg"}}"#,
                Ok(vec!["neg", "pos"]),
            ),
            (
                r#"{"id2label": {"0": "only"}, "num_labels": 3}"#,
                Ok(vec!["only"]),
            ),
            (
                r#"{"num_labels": 3}"#,
                Ok(vec!["LABEL_0", "LABEL_1", "LABEL_2"]),
            ),
            (r#"{}"#, Ok(vec!["LABEL_0", "LABEL_1"])),
            (r#"{"id2label": {"0": "a", "2": "c"}}"#, Err("ids 0 to N-1")),
            (r#"{"id2label": {"0": 7}}"#, Err("ids 0 to N-1")),
            (r#"{"num_labels": 0}"#, Err("num_labels = 0")),
        ];
        for (config, expected) in cases {
            let config: Value = serde_json::from_str(config).unwrap();
            match (labels(path, &config), expected) {
                (Ok(got), Ok(want)) => assert_eq!(got, want, "{config}"),
                (Err(e), Err(words)) => assert!(e.to_string().contains(words), "{config}: {e}"),
                (got, want) => panic!("{config}: got {got:?}, expected {want:?}"),
            }
        }
    }
}
