//! The GGUF tokenizers against llama.cpp on real vocabularies: llama.cpp's
//! own tokenizer test vectors (the `.inp` / `.out` pairs beside its
//! `ggml-vocab-*.gguf` files, which scripts/setup unpacks from the
//! llama-cpp-python sdist), llama.cpp's ids for a set of tricky strings
//! (`tests/fixtures/tokenizers/llama_cpp_tokens.json`), Hugging Face's
//! renders of the families' chat templates
//! (`tests/fixtures/tokenizers/chat_templates.json`), and the refusals of
//! what sluice does not tokenize.

// A test that cannot run is a failed test: unwrapping is how it says so.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Deserialize;
use sha2::{Digest, Sha256};
use sluice_models::tokenizer::gguf::{ChatMessage, ChatTemplate, GgufTokenizer, TemplateTokens};

fn vocab_dir() -> PathBuf {
    common::models_dir().join("llama.cpp/vocab")
}

fn tokenizer(path: &std::path::Path) -> GgufTokenizer {
    GgufTokenizer::from_gguf(&common::gguf_content(path))
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// llama.cpp's test vectors: each `.inp` text's ids, tokenized without
/// special tokens (llama.cpp's `test-tokenizer-0`), for every vocabulary
/// sluice runs.
#[test]
fn llama_cpp_test_vectors_tokenize_the_same() {
    let mut checked = 0;
    for name in [
        "llama-bpe",
        "qwen2",
        "gpt-2",
        "starcoder",
        "refact",
        "mpt",
        "llama-spm",
        "phi-3",
    ] {
        let gguf = vocab_dir().join(format!("ggml-vocab-{name}.gguf"));
        let inp = std::fs::read_to_string(gguf.with_extension("gguf.inp")).unwrap();
        let out = std::fs::read_to_string(gguf.with_extension("gguf.out")).unwrap();
        let texts: Vec<&str> = inp.split("\n__ggml_vocab_test__\n").collect();
        let expected: Vec<Vec<u32>> = out
            .lines()
            .map(|l| l.split_whitespace().map(|t| t.parse().unwrap()).collect())
            .collect();
        let tok = tokenizer(&gguf);
        let mut failed = Vec::new();
        for (text, want) in texts.iter().zip(&expected) {
            let got = tok.tokenize(text, false, false).unwrap();
            if &got != want {
                failed.push(format!("{text:?}: {got:?} != {want:?}"));
            }
        }
        assert!(
            failed.is_empty(),
            "{name}: {} of {} differ:\n{}",
            failed.len(),
            texts.len(),
            failed.join("\n")
        );
        checked += texts.len();
        eprintln!("{name}: {} texts as llama.cpp's test expects", texts.len());
    }
    assert!(checked > 100, "{checked}");
}

#[derive(Deserialize)]
struct Tokens {
    texts: Vec<String>,
    vocabs: BTreeMap<String, VocabTokens>,
}

#[derive(Deserialize)]
struct VocabTokens {
    content: Vec<Vec<u32>>,
    prompt: Vec<Vec<u32>>,
    detokenized: Vec<String>,
}

/// Where a vocabulary of the fixture lives.
fn vocab_path(name: &str) -> PathBuf {
    let models = common::models_dir();
    match name {
        n if n.starts_with("ggml-vocab-") => vocab_dir().join(n),
        "SmolLM2-135M-Instruct.Q4_1.gguf" => models.join("smollm2").join(name),
        "gemma-3-270m-Q4_K_M.gguf" => models.join("gemma3-270m").join(name),
        _ => models.join("qwen2.5-coder-0.5b").join(name),
    }
}

/// llama.cpp's ids of tricky strings (digits, whitespace runs, CJK, emoji,
/// code, markup spelled as text), as a chat message's content is tokenized
/// (no BOS, control tokens as text) and as a raw prompt is (BOS as the
/// model says, control tokens parsed), for each vocabulary; and the text
/// each content's ids decode to.
#[test]
fn tricky_strings_tokenize_as_llama_cpp_does() {
    let fixture: Tokens = common::fixture("tokenizers/llama_cpp_tokens.json").unwrap();
    assert!(fixture.vocabs.len() >= 10, "{:?}", fixture.vocabs.keys());
    for (name, want) in &fixture.vocabs {
        let tok = tokenizer(&vocab_path(name));
        for (i, text) in fixture.texts.iter().enumerate() {
            assert_eq!(
                tok.tokenize(text, false, false).unwrap(),
                want.content[i],
                "{name}, content of {text:?}"
            );
            assert_eq!(
                tok.encode_prompt(text).unwrap(),
                want.prompt[i],
                "{name}, prompt of {text:?}"
            );
            // SentencePiece puts a space before the text (Llama 2's, Phi-3's
            // `add_space_prefix`); llama-cpp-python's detokenize keeps it,
            // sluice removes it as sentencepiece and transformers do.
            let detokenized = match name.as_str() {
                "ggml-vocab-llama-spm.gguf" | "ggml-vocab-phi-3.gguf" => want.detokenized[i]
                    .strip_prefix(' ')
                    .unwrap_or(&want.detokenized[i]),
                _ => want.detokenized[i].as_str(),
            };
            assert_eq!(
                tok.decode(&want.content[i]),
                detokenized,
                "{name}, decoded {text:?}"
            );
        }
        eprintln!(
            "{name}: {} strings as llama.cpp tokenizes them",
            fixture.texts.len()
        );
    }
}

#[derive(Deserialize)]
struct Templates {
    conversations: BTreeMap<String, Vec<Message>>,
    templates: Vec<Template>,
}

#[derive(Deserialize)]
struct Message {
    role: String,
    content: String,
}

#[derive(Deserialize)]
struct Template {
    file: String,
    sha256: String,
    bos_token: String,
    eos_token: String,
    renders: BTreeMap<String, Render>,
}

#[derive(Deserialize)]
struct Render {
    rendered: Option<String>,
    refused: Option<String>,
}

/// Every family's chat template renders each conversation as transformers'
/// `apply_chat_template` does (or is refused by the template, as there).
#[test]
fn chat_templates_render_as_transformers_does() {
    let fixture: Templates = common::fixture("tokenizers/chat_templates.json").unwrap();
    let today = time::macros::date!(2026 - 12 - 05);
    for t in &fixture.templates {
        let path = common::repo_root().join(&t.file);
        let tokens = TemplateTokens {
            bos: t.bos_token.clone(),
            eos: t.eos_token.clone(),
        };
        // The template, from its file or from its GGUF.
        let source = if t.file.ends_with(".gguf") {
            tokenizer(&path).chat_template().unwrap().to_string()
        } else {
            std::fs::read_to_string(&path).unwrap()
        };
        assert_eq!(
            hex(&Sha256::digest(source.as_bytes())),
            t.sha256,
            "{} is not the template the fixture was rendered from: rerun tests/fixtures/make/chat_templates.py",
            t.file
        );
        for (name, want) in &t.renders {
            let messages: Vec<ChatMessage> = fixture.conversations[name]
                .iter()
                .map(|m| ChatMessage {
                    role: m.role.clone(),
                    content: m.content.clone(),
                })
                .collect();
            let got = render(&source, &tokens, &messages, today);
            match (&want.rendered, &want.refused, got) {
                (Some(w), _, Ok(g)) => assert_eq!(&g, w, "{}: {name}", t.file),
                (None, Some(_), Err(e)) => {
                    eprintln!("{}: {name}: refused, as in transformers: {e}", t.file)
                }
                (w, r, g) => panic!("{}: {name}: got {g:?}, transformers {w:?} / {r:?}", t.file),
            }
        }
        eprintln!(
            "{}: {} conversations as transformers renders them",
            t.file,
            t.renders.len()
        );
    }
}

fn render(
    source: &str,
    tokens: &TemplateTokens,
    messages: &[ChatMessage],
    today: time::Date,
) -> Result<String, String> {
    ChatTemplate::new(source)
        .and_then(|t| t.render(messages, tokens, today))
        .map_err(|e| e.to_string())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// What sluice does not tokenize is refused at load, by name.
#[test]
fn other_tokenizers_are_refused_by_name() {
    for (name, words) in [
        (
            "falcon",
            vec![
                "tokenizer.ggml.pre = \"falcon\" is not supported",
                "llama-bpe",
            ],
        ),
        (
            "deepseek-coder",
            vec!["tokenizer.ggml.pre = \"deepseek-coder\""],
        ),
        (
            "bert-bge",
            vec![
                "tokenizer.ggml.model = \"bert\" is not supported",
                "SentencePiece",
            ],
        ),
    ] {
        let path = vocab_dir().join(format!("ggml-vocab-{name}.gguf"));
        let e = match GgufTokenizer::from_gguf(&common::gguf_content(&path)) {
            Err(e) => e.to_string(),
            Ok(_) => panic!("{name}: loaded"),
        };
        for w in words {
            assert!(e.contains(w), "{name}: {e:?} lacks {w:?}");
        }
    }
}
