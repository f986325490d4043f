//! The embedding model alone (no servers): sluice's CPU forward against
//! candle-transformers' BERT and against sentence-transformers' vectors.

// A test that cannot run is a failed test: unwrapping is how it says so.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use candle_core::Device;
use common::{cosine, min_cosine, minilm_reference, norm};
use sluice_models::encoder::pooling::Pooling;
use sluice_models::{
    EmbeddingModel, ForwardChoice, SentenceEncoder, TextTokenizer, encoder_kernels,
};

const MAX_TOKENS: usize = 256;

fn load(choice: ForwardChoice) -> SentenceEncoder {
    let dir = common::models_dir().join("all-minilm-l6-v2");
    SentenceEncoder::load_with(&dir, Device::Cpu, MAX_TOKENS, choice).unwrap()
}

fn reference_ids() -> (Vec<Vec<u32>>, Vec<Vec<f32>>) {
    let reference = minilm_reference().unwrap();
    let dir = common::models_dir().join("all-minilm-l6-v2");
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

/// sluice's packed forward (on the SIMD kernels, or on their plain-Rust
/// references at the `portable` level) and candle's against
/// sentence-transformers and each other. Run on an AMD EPYC (Zen 3, AVX2 +
/// FMA) at both kernel levels it offers.
#[test]
fn both_forwards_match_sentence_transformers_and_each_other() {
    let fast = load(ForwardChoice::Packed);
    let candle = load(ForwardChoice::Candle);
    assert_eq!(candle.forward_name(), "candle");
    let fastest = load(ForwardChoice::Fastest).forward_name();
    if encoder_kernels::available() {
        let level = format!("sluice-{}", encoder_kernels::F32Kernels::current().name());
        assert_eq!(fast.forward_name(), level);
        assert_eq!(fastest, level);
    } else {
        assert_eq!(fast.forward_name(), "sluice-portable");
        assert_eq!(
            fastest, "candle",
            "no SIMD kernels: candle's forward is faster"
        );
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

/// sluice's packed forward computes each sequence's tokens on their own (no
/// padding): a text alone gives exactly the vector it gets among others, on
/// the SIMD kernels and on their plain-Rust references alike. candle's
/// forward pads a batch to its longest text, and its matrix products block
/// differently for other shapes: within 1e-5 of itself, not exactly
/// (1.2e-6 at most here). Run on an AMD EPYC (Zen 3, AVX2 + FMA) at both
/// kernel levels it offers.
#[test]
fn a_vector_does_not_depend_on_its_batch() {
    let (ids, _) = reference_ids();
    let batch: Vec<&[u32]> = ids.iter().map(Vec::as_slice).collect();
    for (choice, exact) in [
        (ForwardChoice::Packed, true),
        (ForwardChoice::Candle, false),
    ] {
        let model = load(choice);
        let together = model.embed(&batch).unwrap();
        let mut worst = 0f32;
        for (i, seq) in batch.iter().enumerate() {
            let alone = model.embed(&[seq]).unwrap();
            if exact {
                assert_eq!(
                    alone[0],
                    together[i],
                    "{}: text {i} ({} tokens)",
                    model.forward_name(),
                    seq.len()
                );
            }
            let diff = alone[0]
                .iter()
                .zip(&together[i])
                .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
            worst = worst.max(diff);
        }
        eprintln!(
            "{}: alone vs batched, max |difference| {worst:e}",
            model.forward_name()
        );
        assert!(worst < 1e-5, "{}: {worst:e}", model.forward_name());
    }
}

/// Both forwards refuse what the tokenizer cannot produce with an error
/// that names it, never a panic.
#[test]
fn bad_token_ids_and_lengths_are_errors_not_panics() {
    for choice in [ForwardChoice::Fastest, ForwardChoice::Candle] {
        let model = load(choice);
        let name = model.forward_name();
        let err = model.embed(&[&[101, 40_000, 102]]).unwrap_err().to_string();
        assert!(
            err.contains("40000") && err.contains("vocabulary"),
            "{name}: {err}"
        );
        let long = vec![101u32; MAX_TOKENS + 1];
        let err = model.embed(&[&long]).unwrap_err().to_string();
        assert!(err.contains("257 tokens"), "{name}: {err}");
        assert!(model.embed(&[]).unwrap().is_empty());
    }
}

/// `--embed-weights bf16` (issue #17): on a CPU with AVX512_BF16 the linear
/// layers round weights and activations to bf16 and sum in f32; the vectors
/// keep a cosine of at least 0.9999 to the f32 forward's on the reference
/// texts, to sentence-transformers' too, and a text's vector is the same
/// bits alone and in the batch. Elsewhere the choice runs the f32 forward.
/// Run on an AMD EPYC (Zen 4, AVX512_BF16: `vdpbf16ps`) and an Intel Xeon
/// with AMX (its tiles).
#[test]
fn bf16_weights_keep_the_vectors_within_cosine_0_9999() {
    let bf16 = load(ForwardChoice::FastestBf16);
    let f32_forward = load(ForwardChoice::Fastest);
    if !["sluice-avx512-bf16", "sluice-amx-bf16"].contains(&bf16.forward_name()) {
        assert_eq!(bf16.forward_name(), f32_forward.forward_name());
        eprintln!(
            "no AVX512_BF16 at this level: bf16 runs {}",
            bf16.forward_name()
        );
        return;
    }
    let (ids, expected) = reference_ids();
    let batch: Vec<&[u32]> = ids.iter().map(Vec::as_slice).collect();
    let a = bf16.embed(&batch).unwrap();
    let b = f32_forward.embed(&batch).unwrap();
    let (mut to_f32, mut to_st) = (1f32, 1f32);
    for ((a, b), e) in a.iter().zip(&b).zip(&expected) {
        to_f32 = to_f32.min(cosine(a, b));
        to_st = to_st.min(cosine(a, e));
    }
    eprintln!(
        "bf16: min cosine {to_f32:.7} to the f32 forward, {to_st:.7} to sentence-transformers, over {} texts",
        ids.len()
    );
    assert!(to_f32 >= 0.9999, "{to_f32}");
    assert!(to_st >= 0.9999, "{to_st}");
    for (i, text) in batch.iter().enumerate() {
        assert_eq!(bf16.embed(&[text]).unwrap()[0], a[i], "text {i} alone");
    }
}

/// `texts` through the `tokenizer.json` in `dir`, truncated to `max`.
fn token_ids(dir: &std::path::Path, max: usize, texts: &[String]) -> Vec<Vec<u32>> {
    let tokenizer = TextTokenizer::load(&dir.join("tokenizer.json"), max).unwrap();
    tokenizer
        .encode(texts.to_vec(), true)
        .unwrap()
        .into_iter()
        .map(|t| t.ids)
        .collect()
}

/// A sentence-transformers directory over MiniLM's weights whose pooling
/// module asks for `mode` (no Normalize module): the files a user's model
/// brings, beside the weights (linked, not copied).
fn pooled_model_dir(mode: &str) -> tempfile::TempDir {
    let weights = common::models_dir().join("all-minilm-l6-v2");
    let dir = tempfile::tempdir().unwrap();
    for file in ["config.json", "tokenizer.json", "model.safetensors"] {
        std::os::unix::fs::symlink(weights.join(file), dir.path().join(file)).unwrap();
    }
    std::fs::write(
        dir.path().join("modules.json"),
        r#"[{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]"#,
    )
    .unwrap();
    std::fs::create_dir(dir.path().join("1_Pooling")).unwrap();
    std::fs::write(
        dir.path().join("1_Pooling/config.json"),
        format!(
            r#"{{"word_embedding_dimension": 384, "pooling_mode_{mode}": true, "include_prompt": true}}"#
        ),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("sentence_bert_config.json"),
        r#"{"max_seq_length": 256, "do_lower_case": false}"#,
    )
    .unwrap();
    dir
}

/// Each pooling mode a model's files may ask for, on both forwards, against
/// sentence-transformers' own pipeline of that mode on the same weights
/// (`tests/fixtures/pooling_reference.json`). The modes give different
/// vectors, so a forward that ignored the files would fail here.
#[test]
fn every_pooling_mode_matches_sentence_transformers() {
    let reference = common::pooling_reference().unwrap();
    let mut by_mode = Vec::new();
    for (mode, config_name, pooling) in [
        ("mean", "mean_tokens", Pooling::Mean),
        ("cls", "cls_token", Pooling::Cls),
        ("max", "max_tokens", Pooling::Max),
        (
            "mean_sqrt_len_tokens",
            "mean_sqrt_len_tokens",
            Pooling::MeanSqrtLen,
        ),
        ("weightedmean", "weightedmean_tokens", Pooling::WeightedMean),
        ("lasttoken", "lasttoken", Pooling::LastToken),
    ] {
        let dir = pooled_model_dir(config_name);
        let ids = token_ids(dir.path(), MAX_TOKENS, &reference.texts);
        let batch: Vec<&[u32]> = ids.iter().map(Vec::as_slice).collect();
        let expected = &reference.modes[mode];
        for choice in [ForwardChoice::Packed, ForwardChoice::Candle] {
            let model =
                SentenceEncoder::load_with(dir.path(), Device::Cpu, MAX_TOKENS, choice).unwrap();
            assert_eq!(model.pooling(), pooling);
            let got = model.embed(&batch).unwrap();
            let worst = min_cosine(&got, expected);
            eprintln!(
                "{mode} pooling, {}: min cosine {worst:.7} to sentence-transformers over {} texts",
                model.forward_name(),
                got.len()
            );
            assert!(worst >= 0.9999, "{mode}, {}: {worst}", model.forward_name());
            // The lengths too: cosine cannot tell the sqrt mean from the mean.
            for (g, e) in got.iter().zip(expected) {
                let (g, e) = (norm(g), norm(e));
                assert!((g - e).abs() <= 1e-4 * e, "{mode}: length {g} vs {e}");
            }
            if choice == ForwardChoice::Packed {
                by_mode.push(got);
            }
        }
    }
    // The modes are told apart: each is far from the mean (the sqrt mean
    // is the mean scaled, so its cosine is 1; its scale is checked by the
    // vectors themselves).
    for (other, name) in [
        (1, "cls"),
        (2, "max"),
        (4, "weightedmean"),
        (5, "lasttoken"),
    ] {
        let closest = by_mode[0]
            .iter()
            .zip(&by_mode[other])
            .map(|(a, b)| cosine(a, b))
            .fold(-1f32, f32::max);
        assert!(
            closest < 0.99,
            "{name} is the mean in disguise: cosine {closest}"
        );
    }
}

/// A directory that asks for more tokens than sentence-transformers'
/// `max_seq_length` is refused, naming the file and the flag.
#[test]
fn more_tokens_than_the_model_was_made_for_is_refused() {
    let dir = pooled_model_dir("mean_tokens");
    let err = match SentenceEncoder::load_with(dir.path(), Device::Cpu, 512, ForwardChoice::Packed)
    {
        Err(e) => e.to_string(),
        Ok(_) => panic!("loaded 512 tokens per item over a 256-token model"),
    };
    for words in [
        "sentence_bert_config.json",
        "max_seq_length",
        "--max-tokens-per-item 256",
    ] {
        assert!(err.contains(words), "{err:?} lacks {words:?}");
    }
}

/// A random-weight model of each family the encoder runs
/// (`tests/fixtures/encoders/<family>/`, made by
/// `tests/fixtures/make/random_encoders.py`): BERT with CLS pooling and a
/// WordPiece tokenizer; XLM-RoBERTa (position ids after the padding id, one
/// token type) with mean pooling and a Unigram tokenizer; BERT with mean
/// pooling, weights stored in f16 and e5's prompts (default "query");
/// XLM-RoBERTa with max pooling, weights stored in bf16. Our tokenizer gives
/// transformers' ids (after the default prompt), and both forwards
/// sentence-transformers' vectors (cosine >= 0.9999; the bf16 layers, where
/// the CPU has AVX512_BF16, >= 0.999), with the default prompt and with
/// each prompt a job may name.
#[test]
fn every_family_matches_sentence_transformers_on_random_weights() {
    let families = [
        ("bert-cls", Pooling::Cls, "F32"),
        ("xlm-roberta-mean", Pooling::Mean, "F32"),
        ("bert-mean-f16-prompts", Pooling::Mean, "F16"),
        ("xlm-roberta-max-bf16", Pooling::Max, "BF16"),
    ];
    for (family, pooling, dtype) in families {
        let dir = common::repo_root()
            .join("tests/fixtures/encoders")
            .join(family);
        let reference = common::family_reference(&dir).unwrap();
        if dtype != "F32" {
            assert_eq!(
                reference.stored_dtypes,
                [dtype],
                "{family}'s stored weights"
            );
        }
        let max = reference.max_seq_length;
        for choice in [
            ForwardChoice::Packed,
            ForwardChoice::Candle,
            ForwardChoice::FastestBf16,
        ] {
            let model = SentenceEncoder::load_with(&dir, Device::Cpu, max, choice).unwrap();
            // bf16 layers where the CPU has them (else that choice is the
            // f32 forward again: skipped), held to the issue's 0.999.
            let bf16 = model.forward_name().ends_with("-bf16");
            if choice == ForwardChoice::FastestBf16 && !bf16 {
                continue;
            }
            let bound = if bf16 { 0.999 } else { 0.9999 };
            assert_eq!(model.pooling(), pooling, "{family}");
            let prompts = model.prompts();
            assert_eq!(
                prompts.default_name(),
                reference.default_prompt_name.as_deref(),
                "{family}"
            );
            assert_eq!(
                prompts.names().collect::<Vec<_>>(),
                reference
                    .prompt_vectors
                    .keys()
                    .map(String::as_str)
                    .collect::<Vec<_>>(),
                "{family}'s prompts"
            );
            let mut runs = vec![(None, &reference.vectors)];
            runs.extend(
                reference
                    .prompt_vectors
                    .iter()
                    .map(|(name, vectors)| (Some(name.as_str()), vectors)),
            );
            for (prompt, expected) in runs {
                let texts = prompts.apply(prompt, reference.texts.clone()).unwrap();
                let ids = token_ids(&dir, max, &texts);
                if prompt.is_none() {
                    for (i, (ours, theirs)) in ids.iter().zip(&reference.ids).enumerate() {
                        assert_eq!(ours, theirs, "{family}: text {i}'s token ids");
                    }
                }
                let batch: Vec<&[u32]> = ids.iter().map(Vec::as_slice).collect();
                let got = model.embed(&batch).unwrap();
                let worst = min_cosine(&got, expected);
                eprintln!(
                    "{family} ({pooling:?} pooling, {dtype} weights, prompt {prompt:?}), {}: min cosine {worst:.7} to sentence-transformers over {} texts",
                    model.forward_name(),
                    got.len()
                );
                assert!(
                    worst >= bound,
                    "{family}, prompt {prompt:?}, {}: {worst}",
                    model.forward_name()
                );
            }
        }
    }
}

/// A prompt changes the vectors: under each two of the model's prompts
/// (e5's "query: ", "passage: " and sentence-transformers' empty
/// "document") some text's vectors are far apart, so a forward that dropped
/// or swapped the prompt would fail the family test's min cosine above. A
/// prompt the model lacks is refused by name.
#[test]
fn a_prompt_is_embedded_with_the_text() {
    let dir = common::repo_root().join("tests/fixtures/encoders/bert-mean-f16-prompts");
    let reference = common::family_reference(&dir).unwrap();
    let prompts = &reference.prompt_vectors;
    for (a, b) in [
        ("query", "passage"),
        ("query", "document"),
        ("passage", "document"),
    ] {
        let farthest = min_cosine(&prompts[a], &prompts[b]);
        assert!(
            farthest < 0.999,
            "{a} and {b} make no difference: min cosine {farthest}"
        );
    }
    let model = SentenceEncoder::load_with(&dir, Device::Cpu, 128, ForwardChoice::Packed).unwrap();
    let err = model
        .prompts()
        .apply(Some("doc"), vec!["x".into()])
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "the model has no prompt named \"doc\" (its prompts: document, passage, query)"
    );
}

/// Without `--max-tokens-per-item` an encoder runs at the limit its files
/// declare (what sentence-transformers truncates at), else at 256, never
/// past what its positions hold.
#[test]
fn the_default_token_limit_is_the_models_own() {
    let fixtures = common::repo_root().join("tests/fixtures/encoders");
    assert_eq!(
        SentenceEncoder::max_tokens_of(&fixtures.join("bert-mean-f16-prompts")).unwrap(),
        128,
        "sentence_bert_config.json's max_seq_length"
    );
    let minilm = common::models_dir().join("all-minilm-l6-v2");
    assert_eq!(
        SentenceEncoder::max_tokens_of(&minilm).unwrap(),
        sluice_models::DEFAULT_MAX_TOKENS,
        "no limit declared: the default"
    );
    let dir = tempfile::tempdir().unwrap();
    for file in ["config.json", "tokenizer.json", "model.safetensors"] {
        std::os::unix::fs::symlink(minilm.join(file), dir.path().join(file)).unwrap();
    }
    for (declared, expected) in [(64, 64), (4096, 512)] {
        std::fs::write(
            dir.path().join("tokenizer_config.json"),
            format!(r#"{{"model_max_length": {declared}}}"#),
        )
        .unwrap();
        assert_eq!(
            SentenceEncoder::max_tokens_of(dir.path()).unwrap(),
            expected,
            "the tokenizer's model_max_length {declared}, 512 positions"
        );
    }
    let model = SentenceEncoder::load(dir.path(), Device::Cpu, None, Default::default()).unwrap();
    assert_eq!(model.max_tokens_per_item(), 512);
}
