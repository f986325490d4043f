//! Every container and codec the transcribe task reads, decoded to 16 kHz
//! mono and held to the signal that was encoded (`tests/fixtures/audio/`,
//! written by libsndfile: `tests/fixtures/make/audio_formats.py`): two
//! tones, 0.3 sin(2 pi 440 t) + 0.2 sin(2 pi 1250 t), 0.75 s of 22.05 kHz
//! stereo. Lossless formats come back within 1e-3 of the tones; lossy ones
//! at a signal-to-noise ratio stated and bounded, not shifted in time
//! (encoder delay trimmed). Opus in Ogg is refused, named. AAC in MP4 is
//! decoded by the same code but not tested here: no encoder for it was at
//! hand offline.

#![allow(clippy::unwrap_used)]

mod common;

use sluice_models::audio::{AudioError, decode_file};

fn tones(n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let t = i as f64 / 16_000.0;
            let two_pi = 2.0 * std::f64::consts::PI;
            (0.3 * (two_pi * 440.0 * t).sin() + 0.2 * (two_pi * 1250.0 * t).sin()) as f32
        })
        .collect()
}

/// The signal-to-noise ratio of `got` against `want` (dB) over their
/// middle, and the shift (in samples, within +-40) that maximizes it.
fn snr_db(got: &[f32], want: &[f32]) -> (f64, i64) {
    let mut best = (f64::NEG_INFINITY, 0);
    for shift in -40i64..=40 {
        let (mut signal, mut noise) = (0f64, 0f64);
        let end = got.len().min(want.len()) - 400;
        for (i, &w) in want.iter().enumerate().take(end).skip(400) {
            let j = i as i64 + shift;
            let (g, w) = (f64::from(got[j as usize]), f64::from(w));
            signal += w * w;
            noise += (g - w) * (g - w);
        }
        let db = 10.0 * (signal / noise.max(1e-30)).log10();
        if db > best.0 {
            best = (db, shift);
        }
    }
    best
}

#[test]
fn every_supported_format_decodes_to_the_signal_that_was_encoded() {
    let dir = common::repo_root().join("tests/fixtures/audio");
    for (file, container, lossless, min_snr) in [
        ("tones.wav", "WAV", true, 60.0),
        ("tones.flac", "FLAC", true, 60.0),
        ("tones.mp3", "MP3", false, 30.0),
        ("tones.ogg", "Ogg", false, 30.0),
    ] {
        let audio = decode_file(&dir.join(file), 60.0).unwrap().unwrap();
        assert_eq!(audio.container, container, "{file}");
        assert_eq!(
            (audio.source_rate, audio.source_channels),
            (22_050, 2),
            "{file}"
        );
        let seconds = audio.seconds();
        assert!((seconds - 0.75).abs() < 0.03, "{file}: {seconds} s");
        let want = tones(audio.samples.len());
        let (snr, shift) = snr_db(&audio.samples, &want);
        eprintln!(
            "{file}: {} samples at 16 kHz, SNR {snr:.1} dB against the tones, shift {shift}",
            audio.samples.len()
        );
        assert!(snr >= min_snr, "{file}: SNR {snr:.1} dB");
        assert_eq!(shift, 0, "{file}: the decoded audio is shifted in time");
        if lossless {
            let worst = audio.samples[400..audio.samples.len() - 400]
                .iter()
                .zip(&want[400..])
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(worst < 1e-3, "{file}: off by {worst}");
        }
    }
    let opus = decode_file(&dir.join("tones.opus.ogg"), 60.0)
        .unwrap()
        .unwrap_err();
    eprintln!("tones.opus.ogg: {opus}");
    assert!(
        matches!(&opus, AudioError::UnsupportedCodec { codec, .. } if codec == "Opus"),
        "{opus:?}"
    );
    assert!(opus.to_string().contains("FLAC, MP3"), "{opus}");
}
