//! Cross-encoders (rerankers) alone: sluice's scores against
//! sentence-transformers' `CrossEncoder.predict` on random-weight models of
//! each family (`tests/fixtures/rerankers/`, made by
//! `tests/fixtures/make/random_rerankers.py`).

// A test that cannot run is a failed test: unwrapping is how it says so.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use candle_core::Device;
use serde::Deserialize;
use sluice_models::encoder::cross_encoder::{CrossEncoder, ScoreActivation};
use sluice_models::{EmbedWeights, EmbeddingModel, ForwardChoice, TextTokenizer};

#[derive(Debug, Deserialize)]
struct RerankerReference {
    max_length: usize,
    activation: String,
    pairs: Vec<(String, String)>,
    ids: Vec<Vec<u32>>,
    type_ids: Vec<Vec<u32>>,
    scores: Vec<f32>,
}

/// The indices of `scores`, best first.
fn order(scores: &[f32]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..scores.len()).collect();
    order.sort_by(|a, b| scores[*b].total_cmp(&scores[*a]));
    order
}

/// BERT (token types 0 then 1, sigmoid) and XLM-RoBERTa (one token type,
/// raw scores): our tokenizer gives the pair ids and types transformers'
/// does, and both forwards give sentence-transformers' scores within 1e-4,
/// in the same order.
#[test]
fn every_reranker_family_scores_as_sentence_transformers_does() {
    for (family, activation) in [
        ("bert-reranker", ScoreActivation::Sigmoid),
        ("xlm-roberta-reranker", ScoreActivation::Identity),
    ] {
        let dir = common::repo_root()
            .join("tests/fixtures/rerankers")
            .join(family);
        let text = std::fs::read_to_string(dir.join("reference.json")).unwrap();
        let reference: RerankerReference = serde_json::from_str(&text).unwrap();
        assert_eq!(
            reference.activation,
            format!("{activation:?}"),
            "{family}'s reference"
        );
        let max = reference.max_length;
        let tokenizer = TextTokenizer::load(&dir.join("tokenizer.json"), max).unwrap();
        let pairs = tokenizer
            .encode_pairs(reference.pairs.clone(), true)
            .unwrap();
        for (i, pair) in pairs.iter().enumerate() {
            assert_eq!(pair.ids, reference.ids[i], "{family}: pair {i}'s ids");
            assert_eq!(
                pair.type_ids, reference.type_ids[i],
                "{family}: pair {i}'s token types"
            );
        }
        assert!(
            pairs.iter().any(|p| p.truncated),
            "{family}: the pairs exercise truncation"
        );
        let ids: Vec<&[u32]> = pairs.iter().map(|p| p.ids.as_slice()).collect();
        let types: Vec<&[u32]> = pairs.iter().map(|p| p.type_ids.as_slice()).collect();
        let mut results = Vec::new();
        for choice in [ForwardChoice::Packed, ForwardChoice::Candle] {
            let model = CrossEncoder::load_with(&dir, Device::Cpu, max, choice).unwrap();
            assert_eq!(model.activation(), activation, "{family}");
            let scores = model.score(&ids, &types).unwrap();
            let worst = scores
                .iter()
                .zip(&reference.scores)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            eprintln!(
                "{family}, {}: largest difference {worst:.2e} to sentence-transformers' CrossEncoder over {} pairs",
                model.forward_name(),
                scores.len()
            );
            results.push((model.forward_name(), worst, scores));
        }
        for (forward, worst, scores) in results {
            assert!(worst <= 1e-4, "{family}, {forward}: {worst}");
            assert_eq!(
                order(&scores),
                order(&reference.scores),
                "{family}, {forward}: the ranking"
            );
        }
    }
}

/// BERT's second text is read as token type 1: the same ids with every
/// type 0 score differently, so a forward that dropped the types would
/// fail above.
#[test]
fn the_second_text_is_read_as_its_own_token_type() {
    let dir = common::repo_root().join("tests/fixtures/rerankers/bert-reranker");
    let model = CrossEncoder::load_with(&dir, Device::Cpu, 128, ForwardChoice::Packed).unwrap();
    let tokenizer = TextTokenizer::load(&dir.join("tokenizer.json"), 128).unwrap();
    let pair = tokenizer
        .encode_pairs(vec![("a short query".into(), "a document".into())], true)
        .unwrap()
        .remove(0);
    assert!(pair.type_ids.contains(&1), "{pair:?}");
    let zeros = vec![0u32; pair.ids.len()];
    let typed = model.score(&[&pair.ids], &[&pair.type_ids]).unwrap()[0];
    let untyped = model.score(&[&pair.ids], &[&zeros]).unwrap()[0];
    assert!(
        (typed - untyped).abs() > 1e-3,
        "token types change nothing: {typed} vs {untyped}"
    );
}

/// `--embed-weights auto` runs a cross-encoder in f32 on every CPU (bf16
/// would move its scores past the 1e-4 bound), at the directory's own
/// token limit; `bf16` is still taken where the CPU has it.
#[test]
fn auto_weights_run_a_reranker_in_f32_at_its_own_limit() {
    let dir = common::repo_root().join("tests/fixtures/rerankers/bert-reranker");
    let auto = CrossEncoder::load(&dir, Device::Cpu, None, EmbedWeights::Auto).unwrap();
    assert!(
        !auto.forward_name().ends_with("-bf16"),
        "auto ran {}",
        auto.forward_name()
    );
    assert_eq!(
        auto.max_tokens_per_item(),
        128,
        "tokenizer_config.json's limit"
    );
    assert_eq!(auto.dim(), 1, "one score per pair");
    let bf16 = CrossEncoder::load(&dir, Device::Cpu, Some(64), EmbedWeights::Bf16).unwrap();
    assert_eq!(bf16.max_tokens_per_item(), 64);
    if sluice_models::encoder_kernels::Bf16Kernels::current().is_some() {
        assert!(
            bf16.forward_name().ends_with("-bf16"),
            "{}",
            bf16.forward_name()
        );
    }
}
