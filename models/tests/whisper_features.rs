//! Whisper's log-mel features against transformers' `WhisperFeatureExtractor`
//! on the same signals (`tests/fixtures/whisper_features.json`, made by
//! `tests/fixtures/make/whisper_features.py`): one 30 s window of 80 and of
//! 128 mel bins, and a long-form recording whose range is taken over all
//! of it.

#![allow(clippy::unwrap_used)]

mod common;

use base64::Engine;
use serde::Deserialize;
use sluice_models::audio::features::{FeatureExtractor, WINDOW_SAMPLES};

#[derive(Deserialize)]
struct Fixture {
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    name: String,
    seed: u32,
    samples: usize,
    n_mels: usize,
    long_form: bool,
    total_frames: usize,
    frames: Vec<usize>,
    pcm_checksum: i64,
    features_f32_base64: String,
}

#[test]
fn features_equal_transformers_whisper_feature_extractor() {
    let text =
        std::fs::read_to_string(common::repo_root().join("tests/fixtures/whisper_features.json"))
            .unwrap();
    let fixture: Fixture = serde_json::from_str(&text).unwrap();
    assert_eq!(fixture.cases.len(), 3);
    for case in &fixture.cases {
        let pcm = common::fixture_signal(case.seed, case.samples);
        assert_eq!(
            pcm.iter().sum::<i64>(),
            case.pcm_checksum,
            "{}: the signal is the fixture's",
            case.name
        );
        let audio: Vec<f32> = pcm.iter().map(|&s| s as f32 / 32768.0).collect();
        let pad_to = if case.long_form { 0 } else { WINDOW_SAMPLES };
        let got = FeatureExtractor::new(case.n_mels).compute(&audio, pad_to);
        assert_eq!(
            (got.n_mels, got.frames),
            (case.n_mels, case.total_frames),
            "{}",
            case.name
        );
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(&case.features_f32_base64)
            .unwrap();
        let want: Vec<f32> = bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        assert_eq!(want.len(), case.n_mels * case.frames.len());
        let mut worst = (0f32, 0, 0);
        for mel in 0..case.n_mels {
            let row = got.row(mel);
            for (k, &frame) in case.frames.iter().enumerate() {
                let diff = (row[frame] - want[mel * case.frames.len() + k]).abs();
                if diff > worst.0 {
                    worst = (diff, mel, frame);
                }
            }
        }
        eprintln!(
            "{}: {} mels x {} frames, max abs difference {:.2e} (mel {}, frame {})",
            case.name, case.n_mels, case.total_frames, worst.0, worst.1, worst.2
        );
        assert!(
            worst.0 <= 1e-6,
            "{}: {:e} at mel {}, frame {}",
            case.name,
            worst.0,
            worst.1,
            worst.2
        );
    }
}
