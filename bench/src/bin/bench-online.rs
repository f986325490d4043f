//! Streaming through the gateway against the model alone, on the same
//! prompts, rounds interleaved: `bench/online` runs it and prints a table.
//!
//! Through the gateway: N chat completions streamed at once with the
//! official `openai` SDK (`bench/online_client.py`), each a job through NATS
//! to a generate consumer whose stream messages the gateway relays as SSE.
//! The model alone: the consumer's own generator on the same token ids
//! (Q8_0 weights, the consumer's default), all N added at once, each
//! sequence's text taken after every step, as the consumer does for a
//! streaming job. Per stream: time to first token (from its request, or
//! from the start) and decode tokens/s (tokens after the first over the
//! time from the first text to the last).
//!
//! Usage: bench-online [ROUNDS] [NEW_TOKENS] [STREAMS...]
#![allow(clippy::unwrap_used, clippy::expect_used)] // a harness: a panic is its report

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use candle_core::Device;
use serde_json::Value;
use sluice_models::decoder::generation::{GenerationParams, Generator};
use sluice_models::decoder::{Decoder, WeightFormat};
use sluice_models::tokenizer::gguf::ChatMessage;
use sluice_tests::deploy::Deployment;
use sluice_tests::{models_dir, repo_root};

use sluice_tests::GENERATE_PROMPTS as PROMPTS;

/// One stream's figures.
#[derive(Debug, Clone)]
struct Stream {
    first: f64,
    last: f64,
    tokens: usize,
    text: String,
}

impl Stream {
    fn rate(&self) -> Option<f64> {
        (self.tokens > 1 && self.last > self.first)
            .then(|| (self.tokens - 1) as f64 / (self.last - self.first))
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let rounds: usize = args.get(1).map_or(Ok(2), |s| s.parse())?;
    let new_tokens: usize = args.get(2).map_or(Ok(32), |s| s.parse())?;
    let levels: Vec<usize> = if args.len() > 3 {
        args[3..]
            .iter()
            .map(|s| s.parse())
            .collect::<Result<_, _>>()?
    } else {
        vec![1, 8, 32]
    };
    let gguf = models_dir().join("smollm2/SmolLM2-135M-Instruct.Q4_1.gguf");
    let (model, tokenizer) = Decoder::load(&gguf, WeightFormat::Q8_0, &Device::Cpu)
        .with_context(|| format!("loading {} (run ./scripts/setup)", gguf.display()))?;
    let ids: Vec<Vec<u32>> = PROMPTS
        .iter()
        .map(|p| {
            tokenizer.encode_chat(&[ChatMessage {
                role: "user".into(),
                content: (*p).into(),
            }])
        })
        .collect::<Result<_, _>>()?;

    let d = Deployment::start().await?;
    let consumer = d
        .start_consumer(&[
            "--task=generate",
            &format!("--max-new-tokens={new_tokens}"),
            "--max-items-per-job=1",
            "--max-prompt-tokens=256",
            "--memory-budget=2000000000",
        ])
        .await?;
    let gateway = d.start_gateway("bench:sk-bench-0123456789", &[]).await?;
    let base = format!("http://{}/v1", gateway.addr);
    through_gateway(&base, 1, new_tokens).await?; // warm-up

    let mut alone: Vec<Vec<Stream>> = vec![Vec::new(); levels.len()];
    let mut online: Vec<Vec<Stream>> = vec![Vec::new(); levels.len()];
    for round in 1..=rounds {
        for (l, &n) in levels.iter().enumerate() {
            let a = model_alone(&model, &tokenizer, &ids, n, new_tokens)?;
            let g = through_gateway(&base, n, new_tokens).await?;
            let same = a.iter().zip(&g).filter(|(a, g)| a.text == g.text).count();
            eprintln!(
                "round {round}, {n} streams: first token {:.0} / {:.0} ms, {:.1} / {:.1} tokens/s per stream (alone / gateway); {same} of {n} texts equal",
                median(a.iter().map(|s| s.first * 1e3)),
                median(g.iter().map(|s| s.first * 1e3)),
                median(a.iter().filter_map(Stream::rate)),
                median(g.iter().filter_map(Stream::rate)),
            );
            alone[l].extend(a);
            online[l].extend(g);
        }
    }
    consumer.shutdown(Duration::from_secs(10)).await?;

    println!(
        "SmolLM2-135M-Instruct (Q8_0), chat, greedy, up to {new_tokens} new tokens, medians over the streams of {rounds} interleaved rounds"
    );
    println!(
        "| streams | first token, model alone (ms) | first token, gateway (ms) | tokens/s per stream, model alone | tokens/s per stream, gateway | gateway vs alone |"
    );
    println!("| ---: | ---: | ---: | ---: | ---: | ---: |");
    for (l, &n) in levels.iter().enumerate() {
        let (a_first, g_first) = (
            median(alone[l].iter().map(|s| s.first * 1e3)),
            median(online[l].iter().map(|s| s.first * 1e3)),
        );
        let (a_rate, g_rate) = (
            median(alone[l].iter().filter_map(Stream::rate)),
            median(online[l].iter().filter_map(Stream::rate)),
        );
        println!(
            "| {n} | {a_first:.0} | {g_first:.0} | {a_rate:.1} | {g_rate:.1} | {:.2}x |",
            g_rate / a_rate
        );
    }
    Ok(())
}

/// N sequences on the generator at once, their text taken after each step.
fn model_alone(
    model: &Decoder,
    tokenizer: &sluice_models::tokenizer::gguf::GgufTokenizer,
    ids: &[Vec<u32>],
    n: usize,
    new_tokens: usize,
) -> Result<Vec<Stream>> {
    let mut g = Generator::new(model, tokenizer, 512).with_max_running(64);
    let params = GenerationParams {
        max_new_tokens: new_tokens,
        ..GenerationParams::default()
    };
    let start = Instant::now();
    for i in 0..n {
        g.add_streamed(i, ids[i % ids.len()].clone(), params.clone())?;
    }
    let mut streams = vec![
        Stream {
            first: 0.0,
            last: 0.0,
            tokens: 0,
            text: String::new(),
        };
        n
    ];
    let mut seen = vec![false; n];
    while !g.is_empty() {
        let done = g.step()?;
        let now = start.elapsed().as_secs_f64();
        for (k, piece) in g.take_streamed() {
            let text = piece.text;
            if text.is_empty() {
                continue;
            }
            if !seen[k] {
                seen[k] = true;
                streams[k].first = now;
            }
            streams[k].last = now;
            streams[k].text.push_str(&text);
        }
        for (k, generated) in done {
            streams[k].tokens = generated.completion_tokens;
        }
    }
    Ok(streams)
}

/// N streams at once through the gateway (`bench/online_client.py`).
async fn through_gateway(base: &str, n: usize, new_tokens: usize) -> Result<Vec<Stream>> {
    let out = tokio::process::Command::new(repo_root().join(".sluice/pyenv/bin/python"))
        .arg(repo_root().join("bench/online_client.py"))
        .arg(base)
        .arg(n.to_string())
        .arg(new_tokens.to_string())
        .arg(serde_json::to_string(&PROMPTS)?)
        .kill_on_drop(true)
        .output()
        .await?;
    if !out.status.success() {
        bail!(
            "online_client.py failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let got: Vec<Value> = serde_json::from_slice(&out.stdout)?;
    Ok(got
        .iter()
        .map(|s| Stream {
            first: s["first"].as_f64().unwrap_or(0.0),
            last: s["last"].as_f64().unwrap_or(0.0),
            tokens: s["tokens"].as_u64().unwrap_or(0) as usize,
            text: s["text"].as_str().unwrap_or("").to_string(),
        })
        .collect())
}

fn median(values: impl Iterator<Item = f64>) -> f64 {
    let mut v: Vec<f64> = values.collect();
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}
