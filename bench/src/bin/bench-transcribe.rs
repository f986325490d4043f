//! sluice's Whisper alone on one recording: decode, resample and features,
//! the encoder, greedy decoding; the model loaded once, the recording
//! transcribed `reps` times after one warm-up, the median of each stage
//! printed as one JSON line (what bench/transcribe compares with
//! faster-whisper).
//!
//!   bench-transcribe MODEL_DIR AUDIO_FILE REPS

use std::time::Instant;

use anyhow::Context;
use sluice_models::audio::decode_file;
use sluice_models::audio::features::{FeatureExtractor, WINDOW_FRAMES, WINDOW_SAMPLES};
use sluice_models::whisper::{
    GenerationSettings, WhisperConfig, WhisperModel, WhisperTask, greedy, prompt,
};

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let [_, dir, audio, reps] = args.as_slice() else {
        anyhow::bail!("usage: bench-transcribe MODEL_DIR AUDIO_FILE REPS");
    };
    let dir = std::path::Path::new(dir);
    let reps: usize = reps.parse().context("REPS")?;
    let model = WhisperModel::load(dir, WhisperConfig::load(dir)?)?;
    let settings = GenerationSettings::load(dir)?;
    let tokenizer = tokenizers::Tokenizer::from_file(dir.join("tokenizer.json"))
        .map_err(|e| anyhow::anyhow!("tokenizer: {e}"))?;
    let extractor = FeatureExtractor::new(model.config.num_mel_bins);
    let forced = prompt(&settings, None, WhisperTask::Transcribe).map_err(anyhow::Error::msg)?;
    let (mut input, mut encode, mut decode, mut total) = (vec![], vec![], vec![], vec![]);
    let mut text = String::new();
    let mut tokens = 0;
    for rep in 0..=reps {
        let started = Instant::now();
        let decoded = decode_file(std::path::Path::new(audio), 3600.0)??;
        let features = extractor.compute(&decoded.samples, WINDOW_SAMPLES);
        let features_done = Instant::now();
        let states = model.encode(&features.values, WINDOW_FRAMES)?;
        let encoded = Instant::now();
        let ids = greedy(&model, &settings, &states, &forced, 200)?;
        let done = Instant::now();
        if rep == 0 {
            continue; // warm-up
        }
        input.push((features_done - started).as_secs_f64());
        encode.push((encoded - features_done).as_secs_f64());
        decode.push((done - encoded).as_secs_f64());
        total.push((done - started).as_secs_f64());
        tokens = ids.len();
        text = tokenizer
            .decode(&ids, true)
            .map_err(|e| anyhow::anyhow!("{e}"))?
            .trim()
            .to_string();
    }
    println!(
        "{}",
        serde_json::json!({
            "input_s": median(input),
            "encode_s": median(encode),
            "decode_s": median(decode),
            "total_s": median(total),
            "tokens": tokens,
            "text": text,
        })
    );
    Ok(())
}
