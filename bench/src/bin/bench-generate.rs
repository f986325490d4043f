//! Generation throughput of sluice's llama forward on SmolLM2-135M (Q4_1
//! GGUF): prompt tokens/s, and decode tokens/s at 1, 4, 8 and 16 concurrent
//! sequences (continuous batching, greedy, fixed lengths). `bench/generate`
//! runs it beside llama.cpp and prints the table.
//!
//! Usage: bench-generate GGUF PROMPTS_OUT.json [NEW_TOKENS] [CONCURRENCY...]
//! Writes the prompts' token ids to PROMPTS_OUT.json (so the baseline reads
//! exactly the same tokens) and prints one JSON object per measurement.
//! Runs each weight format in turn (as stored, requantized to Q8_0, dense f32).
#![allow(clippy::unwrap_used, clippy::expect_used)] // a harness: a panic is its report

use std::time::Instant;

use anyhow::{Context, Result};
use candle_core::Device;
use sluice_models::decoder::generation::{GenerationParams, Generator};
use sluice_models::decoder::{Decoder, StepChoice, WeightFormat};
use sluice_models::tokenizer::gguf::ChatMessage;

use sluice_tests::GENERATE_PROMPTS as PROMPTS;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: bench-generate GGUF PROMPTS_OUT.json [NEW_TOKENS] [CONCURRENCY...]";
    let path = args.get(1).context(usage)?;
    let prompts_out = args.get(2).context(usage)?;
    let new_tokens: usize = args.get(3).map_or(Ok(32), |s| s.parse())?;
    let levels: Vec<usize> = if args.len() > 4 {
        args[4..]
            .iter()
            .map(|s| s.parse())
            .collect::<Result<_, _>>()?
    } else {
        vec![1, 4, 8, 16]
    };
    // BENCH_WEIGHTS=as-stored,q8_0 runs only those formats.
    let only = std::env::var("BENCH_WEIGHTS").ok();
    for (name, format) in [
        ("auto", WeightFormat::Auto),
        ("as stored", WeightFormat::AsStored),
        ("Q8_0", WeightFormat::Q8_0),
        ("f32", WeightFormat::F32),
    ] {
        let key = format.name();
        if only
            .as_deref()
            .is_some_and(|o| !o.split(',').any(|w| w == key))
        {
            continue;
        }
        // BENCH_STEPS=fastest,candle also runs the candle step (the step
        // before the host step existed), to compare the two in one run.
        let steps = std::env::var("BENCH_STEPS").unwrap_or_else(|_| "fastest".into());
        for step in steps.split(',') {
            let (label, choice) = match step {
                "fastest" => (name.to_string(), StepChoice::Fastest),
                "candle" => (format!("{name}, candle step"), StepChoice::Candle),
                other => anyhow::bail!("BENCH_STEPS: unknown step {other:?} (fastest, candle)"),
            };
            run(
                path,
                prompts_out,
                &label,
                format,
                choice,
                new_tokens,
                &levels,
            )?;
        }
    }
    Ok(())
}

fn run(
    path: &str,
    prompts_out: &str,
    name: &str,
    format: WeightFormat,
    step: StepChoice,
    new_tokens: usize,
    levels: &[usize],
) -> Result<()> {
    let (model, tokenizer) =
        Decoder::load_with(std::path::Path::new(path), format, &Device::Cpu, step)?;
    eprintln!("bench-generate: {name}: the {} step", model.forward_name());
    // `auto` names what it chose.
    let name = &if format == WeightFormat::Auto {
        format!("auto ({})", model.weight_format().name())
    } else {
        name.to_string()
    };
    // Chat prompts through the model's template; a model without one (a
    // base model) reads the question as a raw prompt.
    let prompt = |i: usize| {
        let text = PROMPTS[i % PROMPTS.len()];
        match tokenizer.chat_template() {
            Some(_) => tokenizer.encode_chat(&[ChatMessage {
                role: "user".into(),
                content: text.into(),
            }]),
            None => tokenizer.encode_prompt(text),
        }
    };

    let ids: Vec<Vec<u32>> = (0..PROMPTS.len()).map(prompt).collect::<Result<_, _>>()?;
    std::fs::write(prompts_out, serde_json::to_string(&ids)?)?;
    // Prompt processing: every prompt read once, one at a time.
    let mut prompt_tokens = 0;
    let start = Instant::now();
    for i in 0..PROMPTS.len() {
        let ids = prompt(i)?;
        prompt_tokens += ids.len();
        let mut g = Generator::new(&model, &tokenizer, 4096);
        g.add(
            i,
            ids,
            GenerationParams {
                max_new_tokens: 1,
                ..GenerationParams::default()
            },
        )?;
        while !g.is_empty() {
            g.step()?;
        }
    }
    let secs = start.elapsed().as_secs_f64();
    report(name, "prompt", 1, prompt_tokens, secs);
    for &n in levels {
        let mut g = Generator::new(&model, &tokenizer, 4096);
        let params = GenerationParams {
            max_new_tokens: new_tokens,
            ignore_eos: true,
            ..GenerationParams::default()
        };
        for i in 0..n {
            g.add(i, prompt(i)?, params.clone())?;
        }
        // Prefill first (not timed), then decode steps only.
        g.step()?;
        let mut tokens = 0;
        let start = Instant::now();
        while !g.is_empty() {
            tokens += g.running();
            g.step()?;
        }
        let secs = start.elapsed().as_secs_f64();
        report(name, "decode", n, tokens, secs);
    }
    Ok(())
}

fn report(weights: &str, phase: &str, concurrency: usize, tokens: usize, seconds: f64) {
    println!(
        "{}",
        serde_json::json!({
            "engine": "sluice", "weights": weights, "phase": phase,
            "concurrency": concurrency, "tokens": tokens, "seconds": seconds,
        })
    );
}
