//! Whisper against transformers on random-weight models of two shapes
//! (`tests/fixtures/whisper/`, made by
//! `tests/fixtures/make/random_whisper.py`): 80 mel bins and vocabulary
//! 51,865 in f32; 128 mel bins and vocabulary 51,866 (large-v3's) stored in
//! f16. For each of three prompts (English and French transcription, German
//! translation) our features, encoder and decoder give the first step's
//! five largest logits within 1e-3 of transformers' forward, and greedy
//! decoding gives the token ids `WhisperForConditionalGeneration.generate`
//! gave, the forced prompt and the suppress lists included.

#![allow(clippy::unwrap_used)]

mod common;

use serde::Deserialize;
use sluice_models::audio::features::{FeatureExtractor, WINDOW_FRAMES, WINDOW_SAMPLES};
use sluice_models::whisper::{
    GenerationSettings, WhisperConfig, WhisperModel, WhisperTask, greedy, prompt,
};

#[derive(Deserialize)]
struct Reference {
    audio: AudioRef,
    max_new_tokens: usize,
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct AudioRef {
    signal_seed: u32,
    samples: usize,
}

#[derive(Deserialize)]
struct Case {
    language: String,
    task: String,
    prompt: Vec<u32>,
    generated: Vec<u32>,
    min_gap: f32,
    first_logits_top5: Top5,
}

#[derive(Deserialize)]
struct Top5 {
    ids: Vec<u32>,
    values: Vec<f32>,
}

#[test]
fn greedy_transcripts_equal_transformers_generate_on_random_whisper_models() {
    for family in ["whisper-80-mels", "whisper-128-mels-f16"] {
        let dir = common::repo_root()
            .join("tests/fixtures/whisper")
            .join(family);
        let reference: Reference =
            serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap())
                .unwrap();
        let config = WhisperConfig::load(&dir).unwrap();
        let settings = GenerationSettings::load(&dir).unwrap();
        let model = WhisperModel::load(&dir, config).unwrap();
        let audio: Vec<f32> =
            common::fixture_signal(reference.audio.signal_seed, reference.audio.samples)
                .into_iter()
                .map(|s| s as f32 / 32768.0)
                .collect();
        let features =
            FeatureExtractor::new(model.config.num_mel_bins).compute(&audio, WINDOW_SAMPLES);
        let states = model.encode(&features.values, WINDOW_FRAMES).unwrap();
        for case in &reference.cases {
            let task = match case.task.as_str() {
                "translate" => WhisperTask::Translate,
                _ => WhisperTask::Transcribe,
            };
            let forced = prompt(&settings, Some(&case.language), task).unwrap();
            assert_eq!(forced, case.prompt, "{family} {}", case.language);
            // The first step's logits, against transformers' forward.
            let mut state = model.start(&states).unwrap();
            let logits = model.step(&mut state, &forced).unwrap();
            let mut worst = 0f32;
            for (&id, &want) in case
                .first_logits_top5
                .ids
                .iter()
                .zip(&case.first_logits_top5.values)
            {
                let got = logits[id as usize];
                worst = worst.max((got - want).abs() / want.abs().max(1.0));
            }
            let generated = greedy(
                &model,
                &settings,
                &states,
                &forced,
                reference.max_new_tokens,
            )
            .unwrap();
            eprintln!(
                "{family} {} {}: first logits within {worst:.1e} (relative) of transformers', {} tokens, smallest greedy gap there {:.3}",
                case.language,
                case.task,
                generated.len(),
                case.min_gap
            );
            assert!(worst <= 1e-3, "{family} {}: {worst}", case.language);
            assert_eq!(
                generated, case.generated,
                "{family} {} {}",
                case.language, case.task
            );
        }
    }
}

/// What this implementation does not run is refused at load, naming the
/// file and the field.
#[test]
fn an_unsupported_whisper_config_is_refused_naming_the_field() {
    let from = common::repo_root().join("tests/fixtures/whisper/whisper-80-mels");
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(from.join("config.json")).unwrap();
    let mut config: serde_json::Value = serde_json::from_str(&text).unwrap();
    config["activation_function"] = "relu".into();
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
    let error = WhisperConfig::load(dir.path()).unwrap_err().to_string();
    assert!(
        error.contains("config.json") && error.contains("activation_function \"relu\""),
        "{error}"
    );
}
