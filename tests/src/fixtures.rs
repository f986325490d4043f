//! Reference data kept in the repository (`tests/fixtures/`, where its
//! README says how each file was produced).

use std::path::PathBuf;

use anyhow::{Context, Result};
use serde::Deserialize;

use crate::repo_root;

#[derive(Debug, Deserialize)]
pub struct Reference {
    pub items: Vec<ReferenceItem>,
}

#[derive(Debug, Deserialize)]
pub struct ReferenceItem {
    pub text: String,
    pub tokens_untruncated: usize,
    pub embedding: Vec<f32>,
}

/// `tests/fixtures/` of this repository.
pub fn fixtures_dir() -> PathBuf {
    repo_root().join("tests/fixtures")
}

/// sentence-transformers' all-MiniLM-L6-v2 vectors for a set of texts.
pub fn minilm_reference() -> Result<Reference> {
    let path = fixtures_dir().join("minilm_reference.json");
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("cannot read {} (the test fixtures)", path.display()))?;
    Ok(serde_json::from_str(&text)?)
}

/// A random-weight encoder of `tests/fixtures/encoders/<family>/` and what
/// its `reference.json` holds that the job tests use: sentence-transformers'
/// vectors with the default prompt and with each named one.
#[derive(Debug, Deserialize)]
pub struct EncoderFamily {
    pub max_seq_length: usize,
    pub texts: Vec<String>,
    /// Token ids of each text after the default prompt, if any.
    pub ids: Vec<Vec<u32>>,
    pub vectors: Vec<Vec<f32>>,
    #[serde(default)]
    pub prompt_vectors: std::collections::BTreeMap<String, Vec<Vec<f32>>>,
}

/// The family's directory and reference.
pub fn encoder_family(family: &str) -> Result<(PathBuf, EncoderFamily)> {
    family_fixture("encoders", family)
}

/// `tests/fixtures/<kind>/<family>/` and its `reference.json`, read.
fn family_fixture<T: serde::de::DeserializeOwned>(
    kind: &str,
    family: &str,
) -> Result<(PathBuf, T)> {
    let dir = fixtures_dir().join(kind).join(family);
    let path = dir.join("reference.json");
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("cannot read {} (the test fixtures)", path.display()))?;
    Ok((dir, serde_json::from_str(&text)?))
}

/// A random-weight cross-encoder of `tests/fixtures/rerankers/<family>/`
/// and its `reference.json`: sentence-transformers' `CrossEncoder.predict`
/// scores of its pairs, and the pairs' token ids.
#[derive(Debug, Deserialize)]
pub struct RerankerFamily {
    pub max_length: usize,
    pub pairs: Vec<(String, String)>,
    pub ids: Vec<Vec<u32>>,
    pub scores: Vec<f32>,
}

/// The reranker's directory and reference.
pub fn reranker_family(family: &str) -> Result<(PathBuf, RerankerFamily)> {
    family_fixture("rerankers", family)
}

/// A random-weight sequence classifier of
/// `tests/fixtures/classifiers/<family>/` and its `reference.json`:
/// transformers' `text-classification` pipeline's answers (every label,
/// best first), the model's logits and the texts' token ids.
#[derive(Debug, Deserialize)]
pub struct ClassifierFamily {
    pub max_length: usize,
    pub labels: Vec<String>,
    pub texts: Vec<String>,
    pub ids: Vec<Vec<u32>>,
    pub logits: Vec<Vec<f32>>,
    pub answers: Vec<Vec<PipelineLabel>>,
}

/// One label of a pipeline answer.
#[derive(Debug, Clone, Deserialize)]
pub struct PipelineLabel {
    pub label: String,
    pub score: f32,
}

/// The classifier's directory and reference.
pub fn classifier_family(family: &str) -> Result<(PathBuf, ClassifierFamily)> {
    family_fixture("classifiers", family)
}

/// The indices of `scores`, best first (ties in order).
pub fn ranking(scores: &[f32]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..scores.len()).collect();
    order.sort_by(|a, b| scores[*b].total_cmp(&scores[*a]));
    order
}

pub fn cosine(a: &[f32], b: &[f32]) -> f32 {
    let dot: f32 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let na = a.iter().map(|x| x * x).sum::<f32>().sqrt();
    let nb = b.iter().map(|x| x * x).sum::<f32>().sqrt();
    dot / (na * nb).max(1e-12)
}

/// JSONL of `texts`, one JSON string per line.
pub fn jsonl(texts: &[String]) -> Vec<u8> {
    let mut out = Vec::new();
    for t in texts {
        out.extend_from_slice(serde_json::to_string(t).unwrap_or_default().as_bytes());
        out.push(b'\n');
    }
    out
}

/// The example of the JSON Schema `schema` whose `field` is `id`.
pub fn schema_example(schema: &str, field: &str, id: &str) -> serde_json::Value {
    let schema: serde_json::Value = serde_json::from_str(schema).unwrap_or_default();
    schema["examples"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|e| e[field] == id)
        .unwrap_or_else(|| panic!("no example with {field} {id}"))
        .clone()
}
