//! What the model tests share: where `scripts/setup` put the models, and the
//! repository's reference vectors (`tests/fixtures/`, where its README says
//! how each file was produced).

#![allow(dead_code)]

use std::path::{Path, PathBuf};

use serde::Deserialize;

/// The repository root (the workspace holding this crate).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// Where `scripts/setup` put the models (or `$SLUICE_MODELS_DIR`).
pub fn models_dir() -> PathBuf {
    std::env::var_os("SLUICE_MODELS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("weights"))
}

#[derive(Debug, Deserialize)]
pub struct Reference {
    pub items: Vec<ReferenceItem>,
}

#[derive(Debug, Deserialize)]
pub struct ReferenceItem {
    pub text: String,
    pub embedding: Vec<f32>,
}

/// sentence-transformers' all-MiniLM-L6-v2 vectors for a set of texts
/// (`tests/fixtures/minilm_reference.json`).
pub fn minilm_reference() -> Result<Reference, String> {
    read_json(&repo_root().join("tests/fixtures/minilm_reference.json"))
}

/// A fixture file, parsed; the error names the file.
fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {} (the test fixtures): {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
}

/// sentence-transformers' unnormalized vectors per pooling mode (`mean`,
/// `cls`, `max`) for a set of texts (`tests/fixtures/pooling_reference.json`).
#[derive(Debug, Deserialize)]
pub struct PoolingReference {
    pub texts: Vec<String>,
    pub modes: std::collections::BTreeMap<String, Vec<Vec<f32>>>,
}

pub fn pooling_reference() -> Result<PoolingReference, String> {
    read_json(&repo_root().join("tests/fixtures/pooling_reference.json"))
}

/// A random-weight family fixture's `reference.json`: transformers' token
/// ids and sentence-transformers' vectors for its texts.
#[derive(Debug, Deserialize)]
pub struct FamilyReference {
    pub max_seq_length: usize,
    /// The dtypes `model.safetensors` stores (`F32`, `F16`, `BF16`).
    #[serde(default)]
    pub stored_dtypes: Vec<String>,
    #[serde(default)]
    pub default_prompt_name: Option<String>,
    pub texts: Vec<String>,
    /// Of each text as sentence-transformers embeds it: after the default
    /// prompt, if the model has one.
    pub ids: Vec<Vec<u32>>,
    /// `encode(texts)`: with the default prompt, if any.
    pub vectors: Vec<Vec<f32>>,
    /// `encode(texts, prompt_name=name)` for each of the model's prompts.
    #[serde(default)]
    pub prompt_vectors: std::collections::BTreeMap<String, Vec<Vec<f32>>>,
}

pub fn family_reference(dir: &Path) -> Result<FamilyReference, String> {
    read_json(&dir.join("reference.json"))
}

/// The lowest cosine between `got[i]` and `expected[i]` over the pairs.
pub fn min_cosine(got: &[Vec<f32>], expected: &[Vec<f32>]) -> f32 {
    got.iter()
        .zip(expected)
        .map(|(a, e)| cosine(a, e))
        .fold(1f32, f32::min)
}

pub fn cosine(a: &[f32], b: &[f32]) -> f32 {
    let dot: f32 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    dot / (norm(a) * norm(b)).max(1e-12)
}

/// The Euclidean length of `v`.
pub fn norm(v: &[f32]) -> f32 {
    v.iter().map(|x| x * x).sum::<f32>().sqrt()
}

/// A fixture of `tests/fixtures/`, parsed (`rel` from there).
pub fn fixture<T: serde::de::DeserializeOwned>(rel: &str) -> Result<T, String> {
    read_json(&repo_root().join("tests/fixtures").join(rel))
}

/// A GGUF's header (metadata and tensor list), no tensor data read.
pub fn gguf_content(path: &Path) -> candle_core::quantized::gguf_file::Content {
    let mut file = std::fs::File::open(path).unwrap_or_else(|e| {
        panic!(
            "cannot open {} (scripts/setup unpacks it): {e}",
            path.display()
        )
    });
    candle_core::quantized::gguf_file::Content::read(&mut file)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The 16-bit samples of `tests/fixtures/make/whisper_features.py`'s
/// `signal` (the audio fixtures' reproducible input): 4-tap smoothed LCG
/// noise under an envelope that changes every 4,000 samples (every fifth
/// block silent), plus a triangle of period 37 and amplitude 2,000.
pub fn fixture_signal(seed: u32, n: usize) -> Vec<i64> {
    const BLOCK: usize = 4000;
    let lcg = |s: u32| s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
    let (mut noise_state, mut env_state) = (seed, seed ^ 0x9E37_79B9);
    let mut taps = [0i64; 3];
    let mut envelope = 0i64;
    (0..n)
        .map(|i| {
            if i % BLOCK == 0 {
                env_state = lcg(env_state);
                envelope = if (i / BLOCK) % 5 == 4 {
                    0
                } else {
                    i64::from(env_state >> 24)
                };
            }
            noise_state = lcg(noise_state);
            let noise = i64::from(noise_state >> 16) - 32768;
            let smoothed = (noise + taps[0] + taps[1] + taps[2]).div_euclid(4);
            taps = [noise, taps[0], taps[1]];
            let tri = ((i % 37) as i64 * 4 * 2000).div_euclid(37) - 4000;
            ((smoothed * envelope).div_euclid(256) + tri.abs() - 2000).clamp(-32768, 32767)
        })
        .collect()
}

/// A transcript segment as the Whisper fixtures write it (transformers'
/// `generate(return_segments=True)`).
#[derive(Deserialize, Debug)]
pub struct RefSegment {
    pub start: f64,
    pub end: f64,
    pub tokens: Vec<u32>,
}

/// `got` is `want` segment for segment: tokens equal, times within 1e-3 s.
pub fn same_segments(
    what: &str,
    got: &[sluice_models::whisper::transcribe::Segment],
    want: &[RefSegment],
) {
    let brief = |s: Vec<(f64, f64, usize)>| format!("{s:?}");
    assert_eq!(
        got.len(),
        want.len(),
        "{what}: {} against {}",
        brief(
            got.iter()
                .map(|s| (s.start, s.end, s.tokens.len()))
                .collect()
        ),
        brief(
            want.iter()
                .map(|s| (s.start, s.end, s.tokens.len()))
                .collect()
        )
    );
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.tokens, w.tokens, "{what}: segment {i}");
        assert!(
            (g.start - w.start).abs() < 1e-3 && (g.end - w.end).abs() < 1e-3,
            "{what}: segment {i} at {}..{}, the reference's {}..{}",
            g.start,
            g.end,
            w.start,
            w.end
        );
    }
}
