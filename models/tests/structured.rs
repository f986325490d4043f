//! Structured outputs with SmolLM2-135M-Instruct (Q4_1, as stored): a
//! sequence constrained by a JSON schema always answers JSON that parses and
//! validates against it (checked by an independent validator, the
//! `jsonschema` crate), where the same prompt unconstrained does not;
//! constrained and free sequences share steps without changing the free
//! one's answer; a schema the compiler cannot take is refused with its
//! reason.

// A test that cannot run is a failed test: unwrapping is how it says so.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::{Arc, OnceLock};

use candle_core::Device;
use serde_json::{Value, json};
use sluice_models::decoder::constraint::{ConstraintCompiler, OutputFormat};
use sluice_models::decoder::generation::{FinishReason, Generated, GenerationParams, Generator};
use sluice_models::decoder::{Decoder, WeightFormat};
use sluice_models::tokenizer::gguf::{ChatMessage, GgufTokenizer};

fn gguf() -> std::path::PathBuf {
    common::models_dir().join("smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
}

fn model() -> &'static (Decoder, GgufTokenizer) {
    static MODEL: OnceLock<(Decoder, GgufTokenizer)> = OnceLock::new();
    MODEL.get_or_init(|| Decoder::load(&gguf(), WeightFormat::AsStored, &Device::Cpu).unwrap())
}

fn compiler() -> &'static ConstraintCompiler {
    static COMPILER: OnceLock<ConstraintCompiler> = OnceLock::new();
    COMPILER.get_or_init(|| {
        let mut file = std::fs::File::open(gguf()).unwrap();
        let content = candle_core::quantized::gguf_file::Content::read(&mut file).unwrap();
        let tokenizer = GgufTokenizer::from_gguf(&content).unwrap();
        ConstraintCompiler::new(Arc::new(tokenizer)).unwrap()
    })
}

fn chat(question: &str) -> Vec<u32> {
    model()
        .1
        .encode_chat(&[ChatMessage {
            role: "user".into(),
            content: question.into(),
        }])
        .unwrap()
}

fn run(prompts: &[(Vec<u32>, GenerationParams)]) -> Vec<Generated> {
    let (llama, tokenizer) = model();
    let mut generator = Generator::new(llama, tokenizer, 256);
    for (i, (p, params)) in prompts.iter().enumerate() {
        generator.add(i, p.clone(), params.clone()).unwrap();
    }
    let mut out = vec![None; prompts.len()];
    for (i, g) in generator.run_to_end().unwrap() {
        out[i] = Some(g);
    }
    out.into_iter().map(Option::unwrap).collect()
}

fn person_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 40},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
            "city": {"type": "string", "maxLength": 40},
            "languages": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 3}
        },
        "required": ["name", "age", "city", "languages"],
        "additionalProperties": false
    })
}

const QUESTIONS: [&str; 4] = [
    "Tell me about a person who lives in Paris.",
    "Who wrote Hamlet? Answer briefly.",
    "Extract the person: Maria Lopez, 34, a nurse from Madrid who speaks Spanish and English.",
    "Write a haiku about the sea.",
];

#[test]
fn every_constrained_answer_parses_and_validates_and_free_ones_do_not() {
    let schema = person_schema();
    let validator = jsonschema::validator_for(&schema).unwrap();
    let constrained = GenerationParams {
        max_new_tokens: 96,
        constraint: Some(
            compiler()
                .compile(&OutputFormat::JsonSchema(schema.clone()))
                .unwrap(),
        ),
        ..GenerationParams::default()
    };
    let free = GenerationParams {
        max_new_tokens: 96,
        ..GenerationParams::default()
    };
    // Constrained and free sequences in the same steps.
    let mut prompts = Vec::new();
    for q in QUESTIONS {
        prompts.push((chat(q), constrained.clone()));
        prompts.push((chat(q), free.clone()));
    }
    let together = run(&prompts);
    let mut free_parsed = 0;
    for (i, q) in QUESTIONS.iter().enumerate() {
        let json_answer = &together[2 * i];
        eprintln!(
            "{q}\n  constrained: {:?}\n  free: {:?}",
            json_answer.text,
            together[2 * i + 1].text
        );
        assert_ne!(
            json_answer.finish_reason,
            FinishReason::Length,
            "{q}: cut short"
        );
        let value: Value = serde_json::from_str(&json_answer.text)
            .unwrap_or_else(|e| panic!("{q}: {e}: {:?}", json_answer.text));
        assert!(validator.is_valid(&value), "{q}: {value} does not validate");
        free_parsed +=
            usize::from(serde_json::from_str::<Value>(&together[2 * i + 1].text).is_ok());
    }
    assert!(
        free_parsed < QUESTIONS.len(),
        "the free answers parse as JSON too: the test shows nothing"
    );
    // A free sequence answers the same beside constrained ones as alone.
    let alone = run(&[(chat(QUESTIONS[1]), free.clone())]);
    assert_eq!(alone[0].text, together[3].text);
}

#[test]
fn any_json_object_is_what_json_object_asks() {
    let params = GenerationParams {
        max_new_tokens: 64,
        temperature: 0.8,
        seed: 7,
        constraint: Some(compiler().compile(&OutputFormat::JsonObject).unwrap()),
        ..GenerationParams::default()
    };
    let out = run(&[(chat("List three colours as JSON."), params)]);
    if out[0].finish_reason != FinishReason::Length {
        let v: Value = serde_json::from_str(&out[0].text).unwrap();
        assert!(v.is_object(), "{v}");
    } else {
        // Cut short: still a prefix of an object.
        assert!(
            out[0].text.trim_start().starts_with('{'),
            "{:?}",
            out[0].text
        );
    }
}

#[test]
fn a_schema_the_compiler_cannot_take_is_refused_with_its_reason() {
    for bad in [
        json!({"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}),
        json!({"type": "frobnicate"}),
    ] {
        let err = compiler()
            .compile(&OutputFormat::JsonSchema(bad.clone()))
            .unwrap_err();
        eprintln!("{bad} -> {err}");
        assert!(
            err.starts_with("the JSON schema cannot be compiled"),
            "{err}"
        );
    }
}
