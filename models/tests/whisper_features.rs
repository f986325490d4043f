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

const BLOCK: usize = 4000;

fn lcg(state: u32) -> u32 {
    state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223)
}

/// The fixture maker's `signal`: smoothed noise under a per-block
/// envelope, plus a triangle tone, as 16-bit samples.
fn signal(seed: u32, n: usize) -> Vec<i64> {
    let (mut noise_state, mut env_state) = (seed, seed ^ 0x9E37_79B9);
    let mut taps = [0i64; 3];
    let mut envelope = 0i64;
    (0..n)
        .map(|i| {
            if i % BLOCK == 0 {
                env_state = lcg(env_state);
                envelope = if (i / BLOCK) % 5 == 4 {
                    0
                } else {
                    i64::from(env_state >> 24)
                };
            }
            noise_state = lcg(noise_state);
            let noise = i64::from(noise_state >> 16) - 32768;
            let smoothed = (noise + taps[0] + taps[1] + taps[2]).div_euclid(4);
            taps = [noise, taps[0], taps[1]];
            let phase = (i % 37) as i64;
            let tri = (phase * 4 * 2000).div_euclid(37) - 4000;
            let tri = tri.abs() - 2000;
            ((smoothed * envelope).div_euclid(256) + tri).clamp(-32768, 32767)
        })
        .collect()
}

#[test]
fn features_equal_transformers_whisper_feature_extractor() {
    let text =
        std::fs::read_to_string(common::repo_root().join("tests/fixtures/whisper_features.json"))
            .unwrap();
    let fixture: Fixture = serde_json::from_str(&text).unwrap();
    assert_eq!(fixture.cases.len(), 3);
    for case in &fixture.cases {
        let pcm = signal(case.seed, case.samples);
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
