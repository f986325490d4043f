//! sluice's Whisper on recordings, as its transcribe task runs them (the
//! features of the whole recording, 30 s windows decoded greedily with
//! timestamps, each starting at the last closed segment): what
//! bench/transcribe compares with faster-whisper.
//!
//!   bench-transcribe make SPEECH_FILE OUT_DIR
//!       writes OUT_DIR/long.wav (the speech said 68 times with 1 s after
//!       each: about 10 minutes) and OUT_DIR/short.wav (10 times: 89 s)
//!   bench-transcribe run MODEL_DIR AUDIO_FILE COPIES
//!       transcribes COPIES of the file at once (their windows sharing the
//!       decoder's steps, as the consumer's transcription thread runs them) and
//!       prints one JSON line: audio seconds, wall seconds, segments, the
//!       first copy's text

use std::path::Path;
use std::time::Instant;

use anyhow::Context;
use sluice_models::audio::decode_file;
use sluice_models::whisper::transcribe::{Options, Recording};
use sluice_models::whisper::transcriptions::Transcriptions;
use sluice_models::whisper::{Whisper, WhisperTask};

fn wav(samples: &[f32]) -> Vec<u8> {
    sluice_models::audio::wav::pcm16(16_000, 1, &sluice_models::audio::wav::to_pcm16(samples))
}

fn make(speech: &Path, out: &Path) -> anyhow::Result<()> {
    let once = decode_file(speech, 600.0)??.samples;
    std::fs::create_dir_all(out)?;
    for (name, repeats) in [("long.wav", 68), ("short.wav", 10)] {
        let mut samples = Vec::new();
        for _ in 0..repeats {
            samples.extend_from_slice(&once);
            samples.extend(std::iter::repeat_n(0.0, 16_000));
        }
        std::fs::write(out.join(name), wav(&samples))?;
    }
    Ok(())
}

fn run(dir: &Path, audio: &Path, copies: usize) -> anyhow::Result<()> {
    let whisper = Whisper::load(dir)?;
    let started = Instant::now();
    let mut recordings = Vec::with_capacity(copies);
    let mut seconds = 0.0;
    for _ in 0..copies {
        let decoded = decode_file(audio, 4.0 * 3600.0)??;
        let recording = Recording::new(&whisper.extractor, &decoded.samples);
        seconds += recording.seconds;
        recordings.push(recording);
    }
    let input_s = started.elapsed().as_secs_f64();
    let options = Options {
        language: None,
        task: WhisperTask::Transcribe,
        max_new_tokens: None,
    };
    let mut all = Transcriptions::new(&whisper.model, &whisper.settings, &whisper.rules);
    for (i, recording) in recordings.into_iter().enumerate() {
        all.add(i, recording, options.clone());
    }
    let mut done = Vec::new();
    while !all.is_empty() {
        for (i, transcribed) in all.step() {
            done.push((i, transcribed.map_err(|e| anyhow::anyhow!("{e}"))?));
        }
    }
    done.sort_by_key(|(i, _)| *i);
    let windows: u64 = done.iter().map(|(_, t)| t.windows).sum();
    let total_s = started.elapsed().as_secs_f64();
    let (_, first) = done.into_iter().next().context("no copies")?;
    let segments = first.segments.len();
    let tokens: Vec<u32> = first.segments.into_iter().flat_map(|s| s.tokens).collect();
    println!(
        "{}",
        serde_json::json!({
            "audio_s": seconds,
            "total_s": total_s,
            "input_s": input_s,
            "encode_s": all.encode_seconds,
            "decode_s": all.decode_seconds,
            "windows": windows,
            "segments": segments,
            "text": whisper.text(&tokens).trim(),
        })
    );
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        [_, "make", speech, out] => make(Path::new(speech), Path::new(out)),
        [_, "run", dir, audio, copies] => run(
            Path::new(dir),
            Path::new(audio),
            copies.parse().context("COPIES")?,
        ),
        _ => anyhow::bail!(
            "usage: bench-transcribe make SPEECH_FILE OUT_DIR | run MODEL_DIR AUDIO_FILE COPIES"
        ),
    }
}
