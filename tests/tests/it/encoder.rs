//! The embedding model alone (no servers): sluice's CPU forward against
//! candle-transformers' BERT and against sentence-transformers' vectors.

use candle_core::Device;
use sluice_consumer::model::{
    EmbeddingModel, ForwardChoice, MiniLm, TextTokenizer, encoder_kernels,
};
use sluice_tests::fixtures::{cosine, minilm_reference};

const MAX_TOKENS: usize = 256;

fn load(choice: ForwardChoice) -> MiniLm {
    let dir = sluice_tests::models_dir().join("all-minilm-l6-v2");
    MiniLm::load_with(&dir, Device::Cpu, MAX_TOKENS, choice).unwrap()
}

fn reference_ids() -> (Vec<Vec<u32>>, Vec<Vec<f32>>) {
    let reference = minilm_reference().unwrap();
    let dir = sluice_tests::models_dir().join("all-minilm-l6-v2");
    let tokenizer = TextTokenizer::load(&dir.join("tokenizer.json"), MAX_TOKENS).unwrap();
    let texts = reference.items.iter().map(|i| i.text.clone()).collect();
    let ids = tokenizer
        .encode(texts, true)
        .unwrap()
        .into_iter()
        .map(|t| t.ids)
        .collect();
    (
        ids,
        reference.items.into_iter().map(|i| i.embedding).collect(),
    )
}

#[test]
fn both_forwards_match_sentence_transformers_and_each_other() {
    let fast = load(ForwardChoice::Fastest);
    let candle = load(ForwardChoice::Candle);
    assert_eq!(candle.forward_name(), "candle");
    if encoder_kernels::available() {
        assert_eq!(fast.forward_name(), "sluice-avx2");
    }
    let (ids, expected) = reference_ids();
    let lens: Vec<usize> = ids.iter().map(Vec::len).collect();
    assert!(
        lens.iter().min() < lens.iter().max(),
        "the batch mixes lengths: {lens:?}"
    );
    let batch: Vec<&[u32]> = ids.iter().map(Vec::as_slice).collect();
    let a = fast.embed(&batch).unwrap();
    let b = candle.embed(&batch).unwrap();
    let mut worst = (1f32, 1f32, 0f32);
    for ((a, b), e) in a.iter().zip(&b).zip(&expected) {
        worst.0 = worst.0.min(cosine(a, e));
        worst.1 = worst.1.min(cosine(b, e));
        let diff = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
        worst.2 = worst.2.max(diff);
    }
    eprintln!(
        "{} texts, lengths {}..{}: min cosine to sentence-transformers {:.7} ({}) / {:.7} (candle); max |difference| {:e}",
        ids.len(),
        lens.iter().min().unwrap(),
        lens.iter().max().unwrap(),
        worst.0,
        fast.forward_name(),
        worst.1,
        worst.2
    );
    assert!(
        worst.0 >= 0.999 && worst.1 >= 0.999,
        "cosine to the reference: {worst:?}"
    );
    // Same arithmetic up to f32 sum order (measured 1.6e-6 at most, on
    // vector components of magnitude up to about 1).
    assert!(worst.2 < 1e-5, "the two forwards differ by {:e}", worst.2);
}

#[test]
fn a_vector_does_not_depend_on_its_batch() {
    // Each sequence's tokens are packed and computed on their own: a text
    // alone gives exactly the vector it gets among others.
    let fast = load(ForwardChoice::Fastest);
    let (ids, _) = reference_ids();
    let batch: Vec<&[u32]> = ids.iter().map(Vec::as_slice).collect();
    let together = fast.embed(&batch).unwrap();
    for (i, seq) in batch.iter().enumerate() {
        let alone = fast.embed(&[seq]).unwrap();
        assert_eq!(alone[0], together[i], "text {i} ({} tokens)", seq.len());
    }
}

#[test]
fn bad_token_ids_and_lengths_are_errors_not_panics() {
    let fast = load(ForwardChoice::Fastest);
    let err = fast.embed(&[&[101, 40_000, 102]]).unwrap_err().to_string();
    assert!(err.contains("40000") && err.contains("vocabulary"), "{err}");
    let long = vec![101u32; MAX_TOKENS + 1];
    let err = fast.embed(&[&long]).unwrap_err().to_string();
    assert!(err.contains("257 tokens"), "{err}");
    assert!(fast.embed(&[]).unwrap().is_empty());
}
