//! What a JSON-schema constraint costs a decode: SmolLM2-135M-Instruct (Q4_1
//! GGUF, weights as stored) answering extraction prompts at 1 and 8
//! concurrent sequences (continuous batching, greedy), each constrained by a
//! strict schema, against the same prompts unconstrained for exactly as many
//! new tokens each (so both decode the same token counts), rounds
//! interleaved. `bench/structured` runs it.
//!
//! Usage: bench-structured [ROUNDS] [CONCURRENCY...]   (default 3 1 8)
#![allow(clippy::unwrap_used, clippy::expect_used)] // a harness: a panic is its report

use std::sync::Arc;
use std::time::Instant;

use anyhow::Result;
use candle_core::Device;
use serde_json::{Value, json};
use sluice_models::decoder::constraint::{ConstraintCompiler, OutputFormat};
use sluice_models::decoder::generation::{Generated, GenerationParams, Generator};
use sluice_models::decoder::{Decoder, WeightFormat};
use sluice_models::tokenizer::gguf::{ChatMessage, GgufTokenizer};

const PEOPLE: [&str; 8] = [
    "Maria Lopez, 34, a nurse from Madrid who speaks Spanish and English.",
    "John Smith, 50, a baker from Lyon who speaks French.",
    "Aiko Tanaka, 27, an engineer in Osaka who speaks Japanese and Korean.",
    "Pedro Alves, 61, a retired teacher from Porto who speaks Portuguese.",
    "Grace Okafor, 45, a doctor in Lagos who speaks English, Yoruba and Igbo.",
    "Lars Berg, 38, a fisherman from Bergen who speaks Norwegian.",
    "Mei Chen, 22, a student in Taipei who speaks Mandarin and English.",
    "Omar Haddad, 30, a chef in Beirut who speaks Arabic and French.",
];

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 40},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
            "job": {"type": "string", "maxLength": 30},
            "city": {"type": "string", "maxLength": 40},
            "languages": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 4}
        },
        "required": ["name", "age", "job", "city", "languages"],
        "additionalProperties": false
    })
}

fn run(
    model: &(Decoder, GgufTokenizer),
    prompts: &[(Vec<u32>, GenerationParams)],
) -> (f64, Vec<Generated>) {
    let (llama, tokenizer) = model;
    let mut generator = Generator::new(llama, tokenizer, 512);
    let start = Instant::now();
    for (i, (p, params)) in prompts.iter().enumerate() {
        generator.add(i, p.clone(), params.clone()).unwrap();
    }
    let mut out = vec![None; prompts.len()];
    for (i, g) in generator.run_to_end().unwrap() {
        out[i] = Some(g);
    }
    let secs = start.elapsed().as_secs_f64();
    (secs, out.into_iter().map(Option::unwrap).collect())
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let rounds: usize = args.get(1).map_or(Ok(3), |s| s.parse())?;
    let levels: Vec<usize> = if args.len() > 2 {
        args[2..]
            .iter()
            .map(|s| s.parse())
            .collect::<Result<_, _>>()?
    } else {
        vec![1, 8]
    };
    let gguf = sluice_tests::repo_root().join("weights/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf");
    let model = Decoder::load(&gguf, WeightFormat::AsStored, &Device::Cpu)?;
    let built = Instant::now();
    let compiler = {
        let mut file = std::fs::File::open(&gguf)?;
        let content = candle_core::quantized::gguf_file::Content::read(&mut file)?;
        ConstraintCompiler::new(Arc::new(GgufTokenizer::from_gguf(&content)?))
            .map_err(anyhow::Error::msg)?
    };
    let trie_ms = built.elapsed().as_secs_f64() * 1e3;
    let compiled = Instant::now();
    let constraint = compiler
        .compile(&OutputFormat::JsonSchema(schema()))
        .map_err(anyhow::Error::msg)?;
    let compile_ms = compiled.elapsed().as_secs_f64() * 1e3;
    let validator = jsonschema::validator_for(&schema())?;
    println!(
        "vocabulary trie built in {trie_ms:.0} ms (once per model); schema compiled in {compile_ms:.1} ms (once per job and schema)"
    );
    println!(
        "| sequences | constrained tokens/s | free tokens/s | constrained vs free | new tokens per round | every answer valid |"
    );
    println!("| ---: | ---: | ---: | ---: | ---: | --- |");
    for &n in &levels {
        let prompts: Vec<Vec<u32>> = PEOPLE
            .iter()
            .cycle()
            .take(n)
            .map(|p| {
                model
                    .1
                    .encode_chat(&[ChatMessage {
                        role: "user".into(),
                        content: format!("Extract the person as JSON: {p}"),
                    }])
                    .unwrap()
            })
            .collect();
        let constrained: Vec<_> = prompts
            .iter()
            .map(|p| {
                let params = GenerationParams {
                    max_new_tokens: 128,
                    constraint: Some(constraint.clone()),
                    ..GenerationParams::default()
                };
                (p.clone(), params)
            })
            .collect();
        let (mut c_secs, mut f_secs) = (Vec::new(), Vec::new());
        let mut tokens = 0;
        let mut all_valid = true;
        for round in 0..rounds {
            let (secs, out) = run(&model, &constrained);
            c_secs.push(secs);
            for g in &out {
                let v: Option<Value> = serde_json::from_str(&g.text).ok();
                all_valid &= v.is_some_and(|v| validator.is_valid(&v));
            }
            // The same prompts free, each for exactly as many tokens.
            let free: Vec<_> = prompts
                .iter()
                .zip(&out)
                .map(|(p, g)| {
                    let params = GenerationParams {
                        max_new_tokens: g.completion_tokens.max(1),
                        ignore_eos: true,
                        ..GenerationParams::default()
                    };
                    (p.clone(), params)
                })
                .collect();
            tokens = out.iter().map(|g| g.completion_tokens).sum::<usize>();
            let (secs, _) = run(&model, &free);
            f_secs.push(secs);
            eprintln!(
                "round {round}: {n} sequences, {tokens} tokens: constrained {:.3} s, free {secs:.3} s",
                c_secs[round]
            );
        }
        let median = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let (c, f) = (median(&mut c_secs), median(&mut f_secs));
        println!(
            "| {n} | {:.1} | {:.1} | {:.2}x | {tokens} | {} |",
            tokens as f64 / c,
            tokens as f64 / f,
            f / c,
            if all_valid { "yes" } else { "NO" }
        );
    }
    Ok(())
}
