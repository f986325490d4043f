//! The name a consumer answers to when `--model-name` is not given: the
//! model's own, read from where it was loaded, so a consumer started on a
//! Qwen GGUF never answers as the default SmolLM2.
//!
//! - A GGUF (a `.gguf` file, or a directory holding exactly one): its file
//!   name without the extension and the quantization suffix
//!   (`SmolLM2-135M-Instruct.Q4_1.gguf` -> `smollm2-135m-instruct`,
//!   `qwen2.5-coder-0.5b-instruct-q4_k_m.gguf` ->
//!   `qwen2_5-coder-0_5b-instruct`). Not the GGUF's `general.name`: in the
//!   files teams run it often names something else (SmolLM2's says
//!   "Smollm2 135M 8k Lc100K Mix1 Ep2", Qwen2.5-Coder's Q4_K_M file
//!   "... Instruct AWQ"), while the file name is what its publisher and its
//!   users call it.
//! - A model directory (an encoder, a cross-encoder): the directory's name
//!   (`weights/all-minilm-l6-v2` -> `all-minilm-l6-v2`).
//!
//! Either is then put in the model-name charset
//! ([`sluice_schemas::names::is_valid_model`]: 1 to 64 of `a-z 0-9 - _`):
//! lower case, `.` as `_` (`v1.5` -> `v1_5`), anything else as `-`.

use std::path::Path;

/// The name of the model at `path`, or `None` when there is nothing there
/// or nothing usable is left of its name (the caller falls back on the
/// task's default name).
pub fn derive(path: &Path) -> Option<String> {
    if !path.exists() {
        // Nothing to name it from (its load will say what is missing).
        return None;
    }
    let gguf = if path.is_file() {
        Some(path.to_path_buf())
    } else {
        one_gguf_in(path)
    };
    let raw = match &gguf {
        Some(file) => strip_quantization(file.file_stem()?.to_str()?),
        None => path.file_name()?.to_str()?.to_string(),
    };
    normalize(&raw)
}

/// The only `.gguf` file directly in `dir`, if there is exactly one.
fn one_gguf_in(dir: &Path) -> Option<std::path::PathBuf> {
    let mut found = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "gguf"));
    let first = found.next()?;
    found.next().is_none().then_some(first)
}

/// `stem` without trailing quantization tags (`.Q4_1`, `-q4_k_m`,
/// `-IQ4_XS`, `.f16`, `-bf16`...), however many there are.
fn strip_quantization(stem: &str) -> String {
    let mut s = stem.to_string();
    while let Some(cut) = s.rfind(['.', '-']) {
        let tail = s[cut + 1..].to_ascii_lowercase();
        if cut > 0 && is_quantization(&tail) {
            s.truncate(cut);
        } else {
            break;
        }
    }
    s
}

/// A GGUF tensor-type tag as file names carry them.
fn is_quantization(tag: &str) -> bool {
    if matches!(tag, "f16" | "f32" | "bf16" | "fp16" | "fp32") {
        return true;
    }
    let rest = tag
        .strip_prefix("iq")
        .or_else(|| tag.strip_prefix('q'))
        .unwrap_or("");
    let mut chars = rest.chars();
    chars.next().is_some_and(|c| c.is_ascii_digit())
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// `raw` in the model-name charset; `None` when nothing is left.
pub fn normalize(raw: &str) -> Option<String> {
    let mut out = String::with_capacity(raw.len());
    for c in raw.chars() {
        let c = match c {
            'A'..='Z' => c.to_ascii_lowercase(),
            'a'..='z' | '0'..='9' | '_' | '-' => c,
            '.' => '_',
            _ => '-',
        };
        if c == '-' && out.ends_with('-') {
            continue;
        }
        out.push(c);
    }
    let trimmed: String = out
        .trim_matches(|c| c == '-' || c == '_')
        .chars()
        .take(64)
        .collect();
    let trimmed = trimmed.trim_end_matches(['-', '_']).to_string();
    (!trimmed.is_empty()).then_some(trimmed)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn names_in_the_model_charset() {
        let cases = [
            ("SmolLM2-135M-Instruct.Q4_1", "smollm2-135m-instruct"),
            (
                "qwen2.5-coder-0.5b-instruct-q4_k_m",
                "qwen2_5-coder-0_5b-instruct",
            ),
            ("gemma-3-270m-Q4_K_M", "gemma-3-270m"),
            ("Llama-3.2-1B-Instruct-IQ4_XS", "llama-3_2-1b-instruct"),
            ("tinyllama.f16", "tinyllama"),
            ("model-Q8_0.Q8_0", "model"),
            ("Mistral 7B v0.1 (instruct)", "mistral-7b-v0_1-instruct"),
            // Not quantization tags: kept.
            ("qwen3-4b", "qwen3-4b"),
            ("phi-2", "phi-2"),
            ("Q4_K_M", "q4_k_m"),
        ];
        for (stem, want) in cases {
            let got = normalize(&strip_quantization(stem));
            assert_eq!(got.as_deref(), Some(want), "{stem}");
            assert!(sluice_schemas::names::is_valid_model(want), "{want}");
        }
        assert_eq!(normalize("..."), None);
        assert_eq!(normalize("日本語"), None);
        let long = "a".repeat(100);
        assert_eq!(normalize(&long).unwrap().len(), 64);
    }

    #[test]
    fn a_gguf_by_its_file_an_encoder_by_its_directory() {
        let dir = tempfile::tempdir().unwrap();
        let gguf_dir = dir.path().join("smollm2");
        std::fs::create_dir(&gguf_dir).unwrap();
        std::fs::write(gguf_dir.join("SmolLM2-135M-Instruct.Q4_1.gguf"), b"").unwrap();
        assert_eq!(derive(&gguf_dir).as_deref(), Some("smollm2-135m-instruct"));
        assert_eq!(
            derive(&gguf_dir.join("SmolLM2-135M-Instruct.Q4_1.gguf")).as_deref(),
            Some("smollm2-135m-instruct")
        );
        // Two GGUFs: the directory names it (the load refuses it anyway).
        std::fs::write(gguf_dir.join("other.Q8_0.gguf"), b"").unwrap();
        assert_eq!(derive(&gguf_dir).as_deref(), Some("smollm2"));
        let encoder = dir.path().join("bge-small-en-v1.5");
        std::fs::create_dir(&encoder).unwrap();
        std::fs::write(encoder.join("config.json"), b"{}").unwrap();
        assert_eq!(derive(&encoder).as_deref(), Some("bge-small-en-v1_5"));
    }
}
