//! Transcripts with timestamps against transformers'
//! `generate(..., return_timestamps=True)` (`tests/fixtures/whisper/
//! longform.json`, made by `tests/fixtures/make/whisper_longform.py`):
//!
//! - the random-weight models of both shapes on a 4 s signal (one window,
//!   padded) and a 45 s one (sequential long-form: the next window starts
//!   at the last closed segment), in a given language, translating, and
//!   with the language detected: every segment's tokens (timestamps
//!   included) and times;
//! - the real tiny.en on its speech said ten times (89 s, three windows and
//!   more) and 68 times (10 minutes): the same segments, so no sentence
//!   lost or doubled at a window's cut, in order and end to end.

#![allow(clippy::unwrap_used)]

mod common;

use common::{RefSegment, same_segments};

use serde::Deserialize;
use sluice_models::audio::decode_file;
use sluice_models::audio::features::{FeatureExtractor, WINDOW_FRAMES};
use sluice_models::whisper::transcribe::{
    Decoded, Options, Recording, WindowDecoding, decode_step, decode_window, timestamp_prompt,
};
use sluice_models::whisper::transcriptions::transcribe;
use sluice_models::whisper::{GenerationSettings, WhisperConfig, WhisperModel, WhisperTask};

#[derive(Deserialize)]
struct Reference {
    random: Vec<RandomCase>,
    speech: SpeechCase,
    ten_minutes: SpeechCase,
}

#[derive(Deserialize)]
struct RandomCase {
    model: String,
    signal_seed: u32,
    seconds: usize,
    language: Option<String>,
    task: String,
    max_new_tokens: usize,
    segments: Vec<RefSegment>,
}

#[derive(Deserialize)]
struct SpeechCase {
    file: String,
    seconds: f64,
    repeats: usize,
    gap_samples: usize,
    segments: Vec<RefSegment>,
    text: String,
}

fn load(dir: &std::path::Path) -> (WhisperModel, GenerationSettings, FeatureExtractor) {
    let config = WhisperConfig::load(dir).unwrap();
    let mels = config.num_mel_bins;
    (
        WhisperModel::load(dir, config).unwrap(),
        GenerationSettings::load(dir).unwrap(),
        FeatureExtractor::new(mels),
    )
}

fn reference() -> Reference {
    common::fixture("whisper/longform.json").unwrap()
}

#[test]
fn random_models_segment_short_and_long_recordings_as_transformers_does() {
    for case in reference().random {
        let dir = common::repo_root()
            .join("tests/fixtures/whisper")
            .join(&case.model);
        let (model, settings, extractor) = load(&dir);
        let samples: Vec<f32> = common::fixture_signal(case.signal_seed, 16_000 * case.seconds)
            .into_iter()
            .map(|s| s as f32 / 32768.0)
            .collect();
        let options = Options {
            language: case.language.clone(),
            task: match case.task.as_str() {
                "translate" => WhisperTask::Translate,
                _ => WhisperTask::Transcribe,
            },
            max_new_tokens: Some(case.max_new_tokens),
        };
        let (language, segments) =
            transcribe(&model, &settings, &extractor, &samples, &options, &|| true).unwrap();
        let what = format!(
            "{} {} s {:?} {}",
            case.model, case.seconds, case.language, case.task
        );
        same_segments(&what, &segments, &case.segments);
        if let Some(given) = &case.language {
            assert_eq!(language.as_ref(), Some(given));
        } else {
            eprintln!("{what}: detected {language:?}");
            assert!(language.is_some());
        }
    }
}

/// tiny.en on `speech` said `repeats` times: the reference's segments and
/// text, each second sentence ("... out of memory ...") once per repeat
/// (none lost or doubled at a window's cut), the segments in order, end to
/// end, from the start to the last word.
fn tiny_en_as_transformers(speech: &SpeechCase, what: &str) {
    let dir = common::models_dir().join("whisper-tiny-en");
    assert!(
        dir.join("model.safetensors").is_file(),
        "{} not found: run ./scripts/setup",
        dir.display()
    );
    let (model, settings, extractor) = load(&dir);
    let once = decode_file(&common::repo_root().join(&speech.file), 600.0)
        .unwrap()
        .unwrap()
        .samples;
    let mut samples = Vec::new();
    for _ in 0..speech.repeats {
        samples.extend_from_slice(&once);
        samples.extend(std::iter::repeat_n(0.0, speech.gap_samples));
    }
    assert!((samples.len() as f64 / 16_000.0 - speech.seconds).abs() < 1e-6);
    let options = Options {
        language: None,
        task: WhisperTask::Transcribe,
        max_new_tokens: None,
    };
    let started = std::time::Instant::now();
    let (_, segments) =
        transcribe(&model, &settings, &extractor, &samples, &options, &|| true).unwrap();
    eprintln!(
        "{what}: {} segments over {:.1} s of audio in {:.1} s",
        segments.len(),
        speech.seconds,
        started.elapsed().as_secs_f64()
    );
    same_segments(what, &segments, &speech.segments);
    let tokenizer = tokenizers::Tokenizer::from_file(dir.join("tokenizer.json")).unwrap();
    let ids: Vec<u32> = segments
        .iter()
        .flat_map(|s| s.tokens.iter().copied())
        .filter(|&t| t < settings.eos_token_id)
        .collect();
    let text = tokenizer.decode(&ids, true).unwrap();
    assert_eq!(text, speech.text);
    assert_eq!(text.matches("memory").count(), speech.repeats, "{text}");
    assert_eq!(segments[0].start, 0.0);
    for pair in segments.windows(2) {
        assert!(
            pair[1].start >= pair[0].end - 1e-9 && pair[0].end >= pair[0].start,
            "{what}: segments out of order: {:?} then {:?}",
            (pair[0].start, pair[0].end),
            (pair[1].start, pair[1].end)
        );
    }
    let last = segments.last().unwrap().end;
    let gap = speech.gap_samples as f64 / 16_000.0;
    assert!(
        last >= speech.seconds - gap - 0.5 && last <= speech.seconds,
        "{what}: the segments end at {last} s of {} s",
        speech.seconds
    );
}

#[test]
fn tiny_en_transcribes_a_long_recording_window_by_window_as_transformers_does() {
    tiny_en_as_transformers(&reference().speech, "tiny.en, 89 s");
}

/// The ten minutes: 20 windows and more, 138 segments.
#[test]
fn tiny_en_transcribes_ten_minutes_with_segments_that_cover_it() {
    tiny_en_as_transformers(&reference().ten_minutes, "tiny.en, 10 minutes");
}

/// Windows of several recordings decoded in the same decoder steps (the
/// transcription thread's batching), ending at different steps: each gets
/// the tokens, log-probability and no-speech probability it gets decoded
/// alone, to the bit, on the real model (SIMD attention) and a random one
/// (the plain-Rust attention of its 8-wide heads).
#[test]
fn windows_sharing_decoder_steps_decode_as_each_alone() {
    let speech = decode_file(&common::repo_root().join(&reference().speech.file), 600.0)
        .unwrap()
        .unwrap()
        .samples;
    let noise: Vec<f32> = common::fixture_signal(7, 16_000 * 12)
        .into_iter()
        .map(|s| s as f32 / 32768.0)
        .collect();
    let twice = [&speech[..], &vec![0.0; 8_000], &speech[..]].concat();
    let late = [&vec![0.0; 16_000 * 9][..], &speech[..]].concat();
    let recordings = [&speech[..], &noise, &twice, &late, &speech[..16_000 * 3]];
    // Random weights never end a window: each its own room.
    let room = |i: usize| Some(24 + 9 * i);
    for dir in [
        common::models_dir().join("whisper-tiny-en"),
        common::repo_root().join("tests/fixtures/whisper/whisper-80-mels"),
    ] {
        let (model, settings, extractor) = load(&dir);
        let rules = sluice_models::whisper::transcribe::rules(&settings).unwrap();
        let language = settings.is_multilingual.then_some("en");
        let prompt = timestamp_prompt(&settings, language, WhisperTask::Transcribe).unwrap();
        let audio: Vec<_> = recordings
            .iter()
            .map(|samples| {
                let window = Recording::new(&extractor, samples).next_window().unwrap();
                model.encode(&window.features, WINDOW_FRAMES).unwrap()
            })
            .collect();
        let alone: Vec<Decoded> = audio
            .iter()
            .enumerate()
            .map(|(i, a)| decode_window(&model, &settings, &rules, a, &prompt, room(i)).unwrap())
            .collect();
        let mut windows: Vec<(usize, WindowDecoding)> = audio
            .iter()
            .enumerate()
            .map(|(i, a)| {
                (
                    i,
                    WindowDecoding::start(&model, a, &prompt, room(i)).unwrap(),
                )
            })
            .collect();
        let mut together: Vec<Option<Decoded>> = (0..audio.len()).map(|_| None).collect();
        let mut steps = 0;
        while !windows.is_empty() {
            let mut sharing: Vec<&mut WindowDecoding> =
                windows.iter_mut().map(|(_, w)| w).collect();
            let ended = decode_step(&model, &settings, &rules, &mut sharing).unwrap();
            let mut still = Vec::new();
            for ((i, w), ended) in windows.drain(..).zip(ended) {
                match ended {
                    Some(decoded) => together[i] = Some(decoded),
                    None => still.push((i, w)),
                }
            }
            windows = still;
            steps += 1;
        }
        let lengths: Vec<usize> = alone.iter().map(|d| d.tokens.len()).collect();
        eprintln!(
            "{}: {} windows of {lengths:?} tokens in {steps} shared steps",
            dir.display(),
            audio.len()
        );
        assert!(
            lengths
                .iter()
                .collect::<std::collections::BTreeSet<_>>()
                .len()
                > 1,
            "the windows end at different steps"
        );
        for (i, (alone, together)) in alone.iter().zip(&together).enumerate() {
            let together = together.as_ref().unwrap();
            assert_eq!(
                together.tokens,
                alone.tokens,
                "{} window {i}",
                dir.display()
            );
            assert_eq!(
                together.avg_logprob.to_bits(),
                alone.avg_logprob.to_bits(),
                "window {i}"
            );
            assert_eq!(
                together.no_speech_prob.to_bits(),
                alone.no_speech_prob.to_bits(),
                "window {i}"
            );
        }
    }
}
