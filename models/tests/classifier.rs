//! Sequence classifiers alone: sluice's logits and label scores against
//! transformers' model and its text-classification pipeline (top_k=None) on
//! random-weight classifiers of each family (`tests/fixtures/classifiers/`,
//! made by `tests/fixtures/make/random_classifiers.py`).

// A test that cannot run is a failed test: unwrapping is how it says so.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use candle_core::Device;
use serde::Deserialize;
use sluice_models::encoder::classifier::{ClassifierActivation, SequenceClassifier};
use sluice_models::{EmbeddingModel, ForwardChoice, TextTokenizer};

#[derive(Debug, Deserialize)]
struct LabelScore {
    label: String,
    score: f32,
}

#[derive(Debug, Deserialize)]
struct ClassifierReference {
    max_length: usize,
    labels: Vec<String>,
    texts: Vec<String>,
    ids: Vec<Vec<u32>>,
    logits: Vec<Vec<f32>>,
    answers: Vec<Vec<LabelScore>>,
}

/// BERT (three labels, softmax, token types passed) and XLM-RoBERTa (four
/// labels, multi-label sigmoid, one token type): our tokenizer gives the ids
/// transformers' does, both forwards give its logits within 1e-4, and the
/// scores with the pipeline's activation, best first (ties in id order, as
/// Python's stable sort), are the pipeline's labels within 1e-4.
#[test]
fn every_classifier_family_answers_as_the_transformers_pipeline_does() {
    for (family, activation) in [
        ("bert-classifier", ClassifierActivation::Softmax),
        ("xlm-roberta-classifier", ClassifierActivation::Sigmoid),
    ] {
        let dir = common::repo_root()
            .join("tests/fixtures/classifiers")
            .join(family);
        let text = std::fs::read_to_string(dir.join("reference.json")).unwrap();
        let reference: ClassifierReference = serde_json::from_str(&text).unwrap();
        let max = reference.max_length;
        assert_eq!(
            SequenceClassifier::max_tokens_of(&dir).unwrap(),
            max,
            "{family}"
        );
        let tokenizer = TextTokenizer::load(&dir.join("tokenizer.json"), max).unwrap();
        let texts = tokenizer.encode(reference.texts.clone(), true).unwrap();
        for (i, t) in texts.iter().enumerate() {
            assert_eq!(t.ids, reference.ids[i], "{family}: text {i}'s ids");
        }
        assert!(
            texts.iter().any(|t| t.truncated),
            "{family}: the texts exercise truncation"
        );
        let ids: Vec<&[u32]> = texts.iter().map(|t| t.ids.as_slice()).collect();
        for choice in [ForwardChoice::Packed, ForwardChoice::Candle] {
            let model = SequenceClassifier::load_with(&dir, Device::Cpu, max, choice).unwrap();
            assert_eq!(model.activation(), activation, "{family}");
            assert_eq!(model.labels(), reference.labels, "{family}");
            assert_eq!(model.dim(), reference.labels.len(), "{family}");
            let logits = model.embed(&ids).unwrap();
            let mut worst_logit = 0f32;
            let mut worst_score = 0f32;
            for (i, row) in logits.into_iter().enumerate() {
                for (a, b) in row.iter().zip(&reference.logits[i]) {
                    worst_logit = worst_logit.max((a - b).abs());
                }
                let mut scores = row;
                model.activation().apply(&mut scores);
                let mut order: Vec<usize> = (0..scores.len()).collect();
                order.sort_by(|a, b| scores[*b].total_cmp(&scores[*a]));
                let answer = &reference.answers[i];
                assert_eq!(answer.len(), order.len(), "{family}: text {i}");
                for (rank, (&id, want)) in order.iter().zip(answer).enumerate() {
                    assert_eq!(
                        model.labels()[id],
                        want.label,
                        "{family}, {}: text {i}'s label at rank {rank}",
                        model.forward_name()
                    );
                    worst_score = worst_score.max((scores[id] - want.score).abs());
                }
            }
            eprintln!(
                "{family}, {}: largest difference {worst_logit:.2e} to transformers' logits, \
                 {worst_score:.2e} to its pipeline's scores, over {} texts",
                model.forward_name(),
                ids.len()
            );
            assert!(
                worst_logit <= 1e-4,
                "{family}, {}: {worst_logit}",
                model.forward_name()
            );
            assert!(
                worst_score <= 1e-4,
                "{family}, {}: {worst_score}",
                model.forward_name()
            );
        }
    }
}
