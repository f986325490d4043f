//! What a sentence-transformers (or plain Hugging Face) encoder directory
//! says beyond the network's weights, read and checked before anything is
//! loaded: the architecture (`config.json`'s `model_type`), the modules
//! (`modules.json`), the pooling (`1_Pooling/config.json`, or the path
//! `modules.json` gives), the longest input (`sentence_bert_config.json`'s
//! `max_seq_length`, or since sentence-transformers 6 the tokenizer's
//! `model_max_length`) and the prompts, by name, with the default one
//! (`config_sentence_transformers.json`). Both the older files
//! (`pooling_mode_mean_tokens: true`, `...models.Pooling`) and
//! sentence-transformers 6's (`pooling_mode: "mean"`,
//! `...base.modules.transformer.Transformer`) are read.
//!
//! Anything sluice would run differently from sentence-transformers is
//! refused here with the file, the field and what is supported, so a model
//! either gives the reference's vectors or does not start: never loads and
//! answers silently wrong. A directory with none of the sentence-transformers
//! files is a plain transformer, which sentence-transformers itself mean-pools.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::pooling::Pooling;
use crate::error::LoadError;

/// The `model_type`s the encoder runs: BERT, and RoBERTa / XLM-RoBERTa,
/// whose position ids start after `pad_token_id` (`bert::PositionIds`).
pub const MODEL_TYPES: [&str; 3] = ["bert", "roberta", "xlm-roberta"];

/// The sentence-transformers modules the encoder runs, by the last part of
/// their `type`.
const MODULES: [&str; 3] = ["Transformer", "Pooling", "Normalize"];

/// What the directory asks of the encoder beyond its weights.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EncoderFiles {
    pub pooling: Pooling,
    /// sentence-transformers' own limit on tokens per input, if it has one.
    pub max_seq_length: Option<usize>,
    /// Whether the model's last module normalizes its vectors (sluice
    /// normalizes as the job asks, by default).
    pub normalize: bool,
    pub prompts: Prompts,
}

/// The texts a model wants before its inputs, by name
/// (`config_sentence_transformers.json`'s `prompts`, e5's and bge's
/// `"query": "query: "`), and the one used when a job names none
/// (`default_prompt_name`). As in sentence-transformers, the prompt is
/// put before the text and tokenized with it, so it counts towards the
/// model's token limit and is pooled with the text.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Prompts {
    by_name: BTreeMap<String, String>,
    default: Option<String>,
}

/// A job named a prompt the model does not have.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("the model has no prompt named {name:?} (its prompts: {known})")]
pub struct UnknownPrompt {
    pub name: String,
    /// The names it has, comma-separated, or "none".
    pub known: String,
}

impl Prompts {
    /// Prompts from (name, text) pairs and the default's name, which must be
    /// one of them.
    pub fn new(
        by_name: impl IntoIterator<Item = (String, String)>,
        default: Option<String>,
    ) -> Result<Prompts, UnknownPrompt> {
        let prompts = Prompts {
            by_name: by_name.into_iter().collect(),
            default: None,
        };
        match default {
            Some(name) if !prompts.by_name.contains_key(&name) => Err(prompts.unknown(&name)),
            default => Ok(Prompts { default, ..prompts }),
        }
    }

    /// The prompt's names, in order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.by_name.keys().map(String::as_str)
    }

    /// The name of the prompt used when a job names none.
    pub fn default_name(&self) -> Option<&str> {
        self.default.as_deref()
    }

    /// The text to put before each input of a job that names `name` (none:
    /// the default prompt's), or `None` when there is nothing to put.
    pub fn text_for(&self, name: Option<&str>) -> Result<Option<&str>, UnknownPrompt> {
        let Some(name) = name.or(self.default.as_deref()) else {
            return Ok(None);
        };
        match self.by_name.get(name) {
            Some(text) if text.is_empty() => Ok(None),
            Some(text) => Ok(Some(text)),
            None => Err(self.unknown(name)),
        }
    }

    /// `texts` as the model reads them under the prompt `name` (see
    /// [`Prompts::text_for`]).
    pub fn apply(
        &self,
        name: Option<&str>,
        texts: Vec<String>,
    ) -> Result<Vec<String>, UnknownPrompt> {
        Ok(match self.text_for(name)? {
            None => texts,
            Some(prompt) => texts.into_iter().map(|t| format!("{prompt}{t}")).collect(),
        })
    }

    fn unknown(&self, name: &str) -> UnknownPrompt {
        let known = self.names().collect::<Vec<_>>().join(", ");
        UnknownPrompt {
            name: name.to_string(),
            known: if known.is_empty() {
                "none".into()
            } else {
                known
            },
        }
    }

    /// `config_sentence_transformers.json`'s `prompts` (an object of
    /// strings) and `default_prompt_name` (null or one of its names).
    fn read(path: &Path, config: &Value) -> Result<Prompts, LoadError> {
        let by_name = match config.get("prompts") {
            None | Some(Value::Null) => BTreeMap::new(),
            Some(Value::Object(map)) => map
                .iter()
                .map(|(name, text)| match text {
                    Value::String(text) => Ok((name.clone(), text.clone())),
                    other => Err(unsupported(
                        path,
                        &format!("prompts.{name}"),
                        other,
                        "a string put before the text",
                    )),
                })
                .collect::<Result<_, _>>()?,
            Some(other) => {
                return Err(unsupported(
                    path,
                    "prompts",
                    other,
                    "an object of prompt names to texts",
                ));
            }
        };
        let default = match config.get("default_prompt_name") {
            None | Some(Value::Null) => None,
            Some(Value::String(name)) => Some(name.clone()),
            Some(other) => {
                return Err(unsupported(
                    path,
                    "default_prompt_name",
                    other,
                    "null or the name of one of the prompts",
                ));
            }
        };
        Prompts::new(by_name, default).map_err(|e| {
            unsupported(
                path,
                "default_prompt_name",
                &Value::String(e.name),
                &format!("null or one of the prompts' names: {}", e.known),
            )
        })
    }
}

impl EncoderFiles {
    /// Reads and checks the directory's files (`config.json` must exist;
    /// the sentence-transformers files are optional).
    pub fn read(dir: &Path) -> Result<EncoderFiles, LoadError> {
        let config_path = dir.join("config.json");
        let config = read_json(&config_path)?;
        check_model_type(&config_path, &config)?;
        check_not_a_classifier(&config_path, &config)?;
        let modules_path = dir.join("modules.json");
        let (pooling_dir, normalize) = match read_optional_json(&modules_path)? {
            Some(modules) => modules_of(&modules_path, &modules)?,
            None => (Some(PathBuf::from("1_Pooling")), false),
        };
        let pooling = match pooling_dir {
            Some(sub) => {
                let path = dir.join(sub).join("config.json");
                match read_optional_json(&path)? {
                    Some(config) => pooling_of(&path, &config)?,
                    None => Pooling::Mean,
                }
            }
            None => Pooling::Mean,
        };
        let max_seq_length = declared_max_tokens(dir)?;
        let st_path = dir.join("config_sentence_transformers.json");
        let prompts = match read_optional_json(&st_path)? {
            Some(config) => {
                if let Some(kind) = config
                    .get("model_type")
                    .filter(|t| t.as_str() == Some("CrossEncoder"))
                {
                    return Err(unsupported(&st_path, "model_type", kind, CROSS_ENCODER));
                }
                Prompts::read(&st_path, &config)?
            }
            None => Prompts::default(),
        };
        Ok(EncoderFiles {
            pooling,
            max_seq_length,
            normalize,
            prompts,
        })
    }
}

/// The tokens per input the directory declares: sentence-transformers'
/// `max_seq_length` (`sentence_bert_config.json`), else the tokenizer's
/// `model_max_length` (`tokenizer_config.json`), else none.
pub(crate) fn declared_max_tokens(dir: &Path) -> Result<Option<usize>, LoadError> {
    let sbert_path = dir.join("sentence_bert_config.json");
    if let Some(config) = read_optional_json(&sbert_path)?
        && let Some(n) = whole_number(&sbert_path, &config, "max_seq_length")?
    {
        return Ok(Some(n));
    }
    let path = dir.join("tokenizer_config.json");
    let Some(config) = read_optional_json(&path)? else {
        return Ok(None);
    };
    // transformers writes int(1e30) for "no limit" (read as a float here).
    let unlimited = config
        .get("model_max_length")
        .and_then(Value::as_f64)
        .is_some_and(|n| n >= 4_294_967_296.0);
    if unlimited {
        return Ok(None);
    }
    whole_number(&path, &config, "model_max_length")
}

/// `config[field]` as a whole number, absent or null as `None`.
fn whole_number(path: &Path, config: &Value, field: &str) -> Result<Option<usize>, LoadError> {
    match config.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .map(|n| Some(n as usize))
            .ok_or_else(|| unsupported(path, field, v, "a whole number of tokens")),
    }
}

pub(crate) fn unsupported(path: &Path, field: &str, value: &Value, supported: &str) -> LoadError {
    LoadError::Unsupported(format!(
        "{}: {field} = {value} is not supported (supported: {supported})",
        path.display()
    ))
}

pub(crate) fn read_json(path: &Path) -> Result<Value, LoadError> {
    let text = std::fs::read_to_string(path).map_err(|source| LoadError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    serde_json::from_str(&text).map_err(|source| LoadError::Config {
        path: path.to_path_buf(),
        source,
    })
}

pub(crate) fn read_optional_json(path: &Path) -> Result<Option<Value>, LoadError> {
    if !path.exists() {
        return Ok(None);
    }
    read_json(path).map(Some)
}

/// What a cross-encoder is told: it scores pairs, it does not embed.
const CROSS_ENCODER: &str = "a sentence embedding model (this is a cross-encoder: its classifier head scores (query, document) pairs, and pooling its encoder would give vectors no one trained; the rerank task that runs it is not served yet)";

/// `config.json` does not name a sequence-classification head (a
/// cross-encoder's or a classifier's): embedding with its encoder alone
/// would give vectors nobody trained.
fn check_not_a_classifier(path: &Path, config: &Value) -> Result<(), LoadError> {
    let classifier = config
        .get("architectures")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .find(|a| {
            a.as_str()
                .is_some_and(|a| a.ends_with("ForSequenceClassification"))
        });
    match classifier {
        Some(name) => Err(unsupported(path, "architectures", name, CROSS_ENCODER)),
        None => Ok(()),
    }
}

/// `config.json`'s `model_type` is one the encoder runs (absent: BERT, as
/// candle-transformers reads it).
pub(crate) fn check_model_type(path: &Path, config: &Value) -> Result<(), LoadError> {
    match config.get("model_type") {
        None => Ok(()),
        Some(Value::String(t)) if MODEL_TYPES.contains(&t.as_str()) => Ok(()),
        Some(other) => Err(unsupported(
            path,
            "model_type",
            other,
            &MODEL_TYPES.join(", "),
        )),
    }
}

/// From `modules.json`: the pooling module's folder (if there is one) and
/// whether a `Normalize` module ends the pipeline. Every module must be one
/// the encoder runs, in sentence-transformers' order.
fn modules_of(path: &Path, modules: &Value) -> Result<(Option<PathBuf>, bool), LoadError> {
    let list = modules.as_array().ok_or_else(|| {
        unsupported(
            path,
            "(the file)",
            modules,
            "a list of {idx, name, path, type}",
        )
    })?;
    let mut kinds = Vec::new();
    let mut pooling = None;
    for module in list {
        let kind = module
            .get("type")
            .and_then(Value::as_str)
            .and_then(|t| t.rsplit('.').next())
            .unwrap_or_default();
        if !MODULES.contains(&kind) {
            let value = module.get("type").cloned().unwrap_or(Value::Null);
            return Err(unsupported(
                path,
                "type",
                &value,
                "sentence_transformers.models.Transformer, .Pooling, .Normalize",
            ));
        }
        if kind == "Pooling" {
            let sub = module
                .get("path")
                .and_then(Value::as_str)
                .unwrap_or("1_Pooling");
            pooling = Some(PathBuf::from(sub));
        }
        kinds.push(kind);
    }
    let order_ok = matches!(
        kinds.as_slice(),
        ["Transformer"] | ["Transformer", "Pooling"] | ["Transformer", "Pooling", "Normalize"]
    );
    if !order_ok {
        return Err(LoadError::Unsupported(format!(
            "{}: modules {kinds:?} are not supported (supported: Transformer, then Pooling, then an optional Normalize)",
            path.display()
        )));
    }
    Ok((pooling, kinds.last() == Some(&"Normalize")))
}

/// The one pooling mode `config` turns on: the string `pooling_mode`
/// (sentence-transformers 6; a list of one counts) or the older booleans.
/// Several at once (their vectors concatenated) are refused.
fn pooling_of(path: &Path, config: &Value) -> Result<Pooling, LoadError> {
    let on = |field: &str| config.get(field).and_then(Value::as_bool).unwrap_or(false);
    let names = Pooling::ALL.map(Pooling::name).join(", ");
    let supported = format!("one pooling_mode of {names} (or one pooling_mode_... key set true)");
    if config.get("include_prompt") == Some(&Value::Bool(false)) {
        return Err(unsupported(
            path,
            "include_prompt",
            &Value::Bool(false),
            "include_prompt = true (prompts are pooled with the text)",
        ));
    }
    if let Some(mode) = config.get("pooling_mode") {
        let one = match mode {
            Value::Array(list) if list.len() == 1 => &list[0],
            other => other,
        };
        return one
            .as_str()
            .and_then(Pooling::from_name)
            .ok_or_else(|| unsupported(path, "pooling_mode", mode, &supported));
    }
    let chosen: Vec<Pooling> = Pooling::ALL
        .into_iter()
        .filter(|p| on(p.legacy_key()))
        .collect();
    match chosen.as_slice() {
        [one] => Ok(*one),
        // sentence-transformers' own default when nothing is set.
        [] => Ok(Pooling::Mean),
        _ => Err(LoadError::Unsupported(format!(
            "{}: several pooling modes are on ({}), which concatenates their vectors; supported: {supported}",
            path.display(),
            chosen
                .iter()
                .map(|p| p.name())
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    }
}

/// A table row's check for a directory reader: `got` is `expected`, or its
/// refusal's message holds every one of the words.
#[cfg(test)]
pub(crate) fn assert_reads_as<T: PartialEq + std::fmt::Debug>(
    what: &str,
    got: Result<T, LoadError>,
    expected: Result<T, Vec<&str>>,
) {
    match (got, expected) {
        (Ok(got), Ok(expected)) => assert_eq!(got, expected, "{what}"),
        (Err(e), Err(words)) => {
            let text = e.to_string();
            for w in words {
                assert!(text.contains(w), "{what}: {text:?} lacks {w:?}");
            }
        }
        (got, expected) => panic!("{what}: got {got:?}, expected {expected:?}"),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    /// A directory with `files` (relative path, contents) and a BERT
    /// `config.json` unless `files` brings its own.
    fn dir_with(files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        if !files.iter().any(|(p, _)| *p == "config.json") {
            std::fs::write(dir.path().join("config.json"), r#"{"model_type": "bert"}"#).unwrap();
        }
        for (path, text) in files {
            let path = dir.path().join(path);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
        dir
    }

    const ST_MODULES: &str = r#"[
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}
    ]"#;

    const ST6_MODULES: &str = r#"[
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.base.modules.transformer.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.sentence_transformer.modules.pooling.Pooling"}
    ]"#;

    fn pooling_config(mode: &str) -> String {
        format!(r#"{{"word_embedding_dimension": 384, "{mode}": true, "include_prompt": true}}"#)
    }

    /// What each directory loads as, or the words its refusal must carry.
    #[test]
    fn each_directory_loads_as_sentence_transformers_would_or_is_refused_by_name() {
        let mean = pooling_config("pooling_mode_mean_tokens");
        let cls = pooling_config("pooling_mode_cls_token");
        let max = pooling_config("pooling_mode_max_tokens");
        let last = pooling_config("pooling_mode_lasttoken");
        let weighted = pooling_config("pooling_mode_weightedmean_tokens");
        let two = r#"{"pooling_mode_mean_tokens": true, "pooling_mode_cls_token": true}"#;
        let no_prompt = r#"{"pooling_mode_mean_tokens": true, "include_prompt": false}"#;
        let dense = r#"[
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
            {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"}
        ]"#;
        let pooling_elsewhere = r#"[
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "pool", "type": "sentence_transformers.models.Pooling"}
        ]"#;
        let ok = |pooling, max_seq_length, normalize| {
            Ok(EncoderFiles {
                pooling,
                max_seq_length,
                normalize,
                prompts: Prompts::default(),
            })
        };
        let e5_prompts = Prompts::new(
            [
                ("query".to_string(), "query: ".to_string()),
                ("passage".to_string(), "passage: ".to_string()),
            ],
            Some("query".into()),
        )
        .unwrap();
        type Case<'a> = (
            &'a str,
            Vec<(&'a str, &'a str)>,
            Result<EncoderFiles, Vec<&'a str>>,
        );
        let cases: Vec<Case> = vec![
            (
                "a plain transformer",
                vec![],
                ok(Pooling::Mean, None, false),
            ),
            (
                "no model_type",
                vec![("config.json", "{}")],
                ok(Pooling::Mean, None, false),
            ),
            (
                "mean, normalized, 256 tokens",
                vec![
                    ("modules.json", ST_MODULES),
                    ("1_Pooling/config.json", &mean),
                    ("sentence_bert_config.json", r#"{"max_seq_length": 256}"#),
                ],
                ok(Pooling::Mean, Some(256), true),
            ),
            (
                "cls",
                vec![
                    ("modules.json", ST_MODULES),
                    ("1_Pooling/config.json", &cls),
                ],
                ok(Pooling::Cls, None, true),
            ),
            (
                "max, pooling config without modules.json",
                vec![("1_Pooling/config.json", &max)],
                ok(Pooling::Max, None, false),
            ),
            (
                "the pooling folder modules.json names",
                vec![
                    ("modules.json", pooling_elsewhere),
                    ("pool/config.json", &cls),
                ],
                ok(Pooling::Cls, None, false),
            ),
            (
                "sentence-transformers 6: pooling_mode and the tokenizer's limit",
                vec![
                    ("modules.json", ST6_MODULES),
                    (
                        "1_Pooling/config.json",
                        r#"{"embedding_dimension": 64, "pooling_mode": "cls", "include_prompt": true}"#,
                    ),
                    (
                        "sentence_bert_config.json",
                        r#"{"transformer_task": "feature-extraction"}"#,
                    ),
                    ("tokenizer_config.json", r#"{"model_max_length": 128}"#),
                    (
                        "config_sentence_transformers.json",
                        r#"{"prompts": {"query": ""}, "default_prompt_name": null}"#,
                    ),
                ],
                Ok(EncoderFiles {
                    prompts: Prompts::new([("query".into(), String::new())], None).unwrap(),
                    ..ok(Pooling::Cls, Some(128), false).unwrap()
                }),
            ),
            (
                "no limit in the tokenizer",
                vec![(
                    "tokenizer_config.json",
                    r#"{"model_max_length": 1000000000000000019884624838656}"#,
                )],
                ok(Pooling::Mean, None, false),
            ),
            (
                "sentence_bert_config.json's limit first",
                vec![
                    ("sentence_bert_config.json", r#"{"max_seq_length": 256}"#),
                    ("tokenizer_config.json", r#"{"model_max_length": 512}"#),
                ],
                ok(Pooling::Mean, Some(256), false),
            ),
            (
                "sentence-transformers 6, last token",
                vec![("1_Pooling/config.json", r#"{"pooling_mode": "lasttoken"}"#)],
                ok(Pooling::LastToken, None, false),
            ),
            (
                "sentence-transformers 6, a list of one mode",
                vec![(
                    "1_Pooling/config.json",
                    r#"{"pooling_mode": ["mean_sqrt_len_tokens"]}"#,
                )],
                ok(Pooling::MeanSqrtLen, None, false),
            ),
            (
                "sentence-transformers 6, two modes",
                vec![(
                    "1_Pooling/config.json",
                    r#"{"pooling_mode": ["cls", "mean"]}"#,
                )],
                Err(vec![
                    "1_Pooling/config.json",
                    "pooling_mode = [\"cls\",\"mean\"] is not supported",
                    "one pooling_mode of cls, max, mean, mean_sqrt_len_tokens, weightedmean, lasttoken",
                ]),
            ),
            (
                "sentence-transformers 6, a mode it does not have",
                vec![("1_Pooling/config.json", r#"{"pooling_mode": "median"}"#)],
                Err(vec!["pooling_mode = \"median\" is not supported"]),
            ),
            (
                "prompts with a default",
                vec![(
                    "config_sentence_transformers.json",
                    r#"{"prompts": {"query": "query: ", "passage": "passage: "}, "default_prompt_name": "query"}"#,
                )],
                Ok(EncoderFiles {
                    prompts: e5_prompts.clone(),
                    ..ok(Pooling::Mean, None, false).unwrap()
                }),
            ),
            (
                "a default prompt it does not have",
                vec![(
                    "config_sentence_transformers.json",
                    r#"{"prompts": {"query": "query: "}, "default_prompt_name": "document"}"#,
                )],
                Err(vec![
                    "config_sentence_transformers.json",
                    "default_prompt_name = \"document\"",
                    "one of the prompts' names: query",
                ]),
            ),
            (
                "a prompt that is not text",
                vec![(
                    "config_sentence_transformers.json",
                    r#"{"prompts": {"query": 3}}"#,
                )],
                Err(vec![
                    "config_sentence_transformers.json",
                    "prompts.query = 3",
                ]),
            ),
            (
                "xlm-roberta",
                vec![("config.json", r#"{"model_type": "xlm-roberta"}"#)],
                ok(Pooling::Mean, None, false),
            ),
            (
                "roberta",
                vec![("config.json", r#"{"model_type": "roberta"}"#)],
                ok(Pooling::Mean, None, false),
            ),
            (
                "a cross-encoder's head",
                vec![(
                    "config.json",
                    r#"{"model_type": "bert", "architectures": ["BertForSequenceClassification"]}"#,
                )],
                Err(vec![
                    "config.json",
                    "architectures = \"BertForSequenceClassification\"",
                    "this is a cross-encoder",
                ]),
            ),
            (
                "sentence-transformers' cross-encoder",
                vec![(
                    "config_sentence_transformers.json",
                    r#"{"model_type": "CrossEncoder", "activation_fn": "torch.nn.modules.activation.Sigmoid", "prompts": {}}"#,
                )],
                Err(vec![
                    "config_sentence_transformers.json",
                    "model_type = \"CrossEncoder\"",
                    "rerank task",
                ]),
            ),
            (
                "a masked-LM checkpoint embeds as its encoder",
                vec![(
                    "config.json",
                    r#"{"model_type": "bert", "architectures": ["BertForMaskedLM"]}"#,
                )],
                ok(Pooling::Mean, None, false),
            ),
            (
                "another architecture",
                vec![("config.json", r#"{"model_type": "modernbert"}"#)],
                Err(vec![
                    "config.json",
                    "model_type = \"modernbert\" is not supported",
                    "supported: bert, roberta, xlm-roberta",
                ]),
            ),
            (
                "last token",
                vec![("1_Pooling/config.json", &last)],
                ok(Pooling::LastToken, None, false),
            ),
            (
                "weighted mean",
                vec![("1_Pooling/config.json", &weighted)],
                ok(Pooling::WeightedMean, None, false),
            ),
            (
                "two modes",
                vec![("1_Pooling/config.json", two)],
                Err(vec!["several pooling modes", "cls, mean", "concatenates"]),
            ),
            (
                "prompt left out of the pooling",
                vec![("1_Pooling/config.json", no_prompt)],
                Err(vec!["include_prompt = false"]),
            ),
            (
                "a Dense module",
                vec![("modules.json", dense)],
                Err(vec!["modules.json", "sentence_transformers.models.Dense"]),
            ),
            (
                "a bad max_seq_length",
                vec![("sentence_bert_config.json", r#"{"max_seq_length": "long"}"#)],
                Err(vec!["sentence_bert_config.json", "max_seq_length"]),
            ),
        ];
        for (what, files, expected) in cases {
            let dir = dir_with(&files);
            assert_reads_as(what, EncoderFiles::read(dir.path()), expected);
        }
    }

    #[test]
    fn a_job_gets_the_prompt_it_names_or_the_default() {
        let texts = || vec!["a".to_string(), "b".to_string()];
        let e5 = Prompts::new(
            [
                ("query".to_string(), "query: ".to_string()),
                ("passage".to_string(), "passage: ".to_string()),
                ("plain".to_string(), String::new()),
            ],
            Some("query".into()),
        )
        .unwrap();
        assert_eq!(e5.apply(None, texts()).unwrap(), ["query: a", "query: b"]);
        assert_eq!(
            e5.apply(Some("passage"), texts()).unwrap(),
            ["passage: a", "passage: b"]
        );
        assert_eq!(e5.apply(Some("plain"), texts()).unwrap(), ["a", "b"]);
        let err = e5.apply(Some("doc"), texts()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "the model has no prompt named \"doc\" (its prompts: passage, plain, query)"
        );
        let plain = Prompts::default();
        assert_eq!(plain.apply(None, texts()).unwrap(), ["a", "b"]);
        assert_eq!(
            plain.apply(Some("query"), texts()).unwrap_err().to_string(),
            "the model has no prompt named \"query\" (its prompts: none)"
        );
        let no_default = Prompts::new([("query".to_string(), "q: ".to_string())], None).unwrap();
        assert_eq!(no_default.apply(None, texts()).unwrap(), ["a", "b"]);
        assert_eq!(no_default.default_name(), None);
        assert_eq!(e5.default_name(), Some("query"));
    }

    #[test]
    fn a_missing_config_names_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let err = EncoderFiles::read(dir.path()).unwrap_err();
        assert!(matches!(err, LoadError::Read { .. }), "{err:?}");
        assert!(err.to_string().contains("config.json"), "{err}");
    }
}
