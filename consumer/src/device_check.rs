//! `sluice-consumer device-check`: one pass over what a GPU machine must
//! show, run from the bundle `scripts/device-bundle` makes (no network, no
//! NATS, no S3, nothing installed but the driver), and printed as one table:
//!
//! - the start-up budget against the device's free memory;
//! - the 22 reference texts' embeddings against sentence-transformers'
//!   (cosine >= 0.999), with the bundle's f16 copy of the MiniLM weights;
//! - embedding throughput over N texts (the reference texts, cycled);
//! - generation: decode tokens/s at 1 and 16 sequences on a model of
//!   SmolLM2-135M's exact shapes and weight types with seeded random weights
//!   (the real GGUF, 94 MB, does not fit the 64 MiB a device machine is
//!   sent; the bundle carries its header: metadata, tokenizer and tensor
//!   types), and on a GPU that model's logits against the CPU step's;
//! - the peak memory above each loaded model against that task's budget.
//!
//! `--device cpu` runs the same pass on the CPU: CI's dry run (`tests/tests/it/device_check.rs`).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use candle_core::quantized::{GgmlDType, QTensor, gguf_file};
use candle_core::{Device, Tensor};

use crate::budget::device_headroom_bytes;
use crate::config::ModelConfig;
use crate::memory::MemoryProbe;
use crate::task::encoder::{l2_normalize, load_encoder};
use sluice_models::decoder::{Decoder, Segment, WeightFormat};

/// Where the bundle keeps each part (`scripts/device-bundle` writes them).
pub const BUNDLE_MINILM: &str = "minilm";
pub const BUNDLE_REFERENCE: &str = "minilm_reference.json";
pub const BUNDLE_LLAMA_HEADER: &str = "llama-header.gguf";

/// Cosine to sentence-transformers the embeddings must reach.
const MIN_COSINE: f64 = 0.999;
/// Largest `max |device - cpu| / max |cpu|` over a prompt's logits.
const MAX_LOGITS_DRIFT: f64 = 0.05;
/// Prompt tokens each sequence starts from in the decode figures.
const PROMPT_TOKENS: usize = 16;

#[derive(Debug, Clone, clap::Args)]
pub struct DeviceCheckArgs {
    /// The folder `scripts/device-bundle` made.
    #[arg(long)]
    pub bundle: PathBuf,
    /// Texts embedded for the throughput figure (the reference texts, cycled).
    #[arg(long, default_value_t = 10_000)]
    pub texts: usize,
    /// Tokens each sequence decodes for the generation figures.
    #[arg(long, default_value_t = 32)]
    pub new_tokens: usize,
    /// Concurrent sequences the decode figures are measured at.
    #[arg(long, value_delimiter = ',', default_value = "1,16")]
    pub sequences: Vec<usize>,
    /// Share of the free memory after a model loads that its budget takes
    /// (the consumer's --memory-fraction).
    #[arg(long, default_value_t = 0.5)]
    pub memory_fraction: f64,
    /// Also write the figures as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// The device and batch limits (`--model-dir` defaults to the bundle's MiniLM).
    #[command(flatten)]
    pub model: ModelConfig,
}

/// One row of the table.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Row {
    pub check: String,
    pub figure: String,
    pub target: String,
    /// None: a figure with no target.
    pub pass: Option<bool>,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct DeviceReport {
    pub device: String,
    pub cpu: String,
    pub rows: Vec<Row>,
}

impl DeviceReport {
    pub fn passed(&self) -> bool {
        self.rows.iter().all(|r| r.pass != Some(false))
    }

    /// The report as a Markdown table.
    pub fn table(&self) -> String {
        let mut out = format!(
            "device-check on {} (host CPU: {})\n\n| check | figure | target | |\n| --- | ---: | --- | --- |\n",
            self.device, self.cpu
        );
        for r in &self.rows {
            let verdict = match r.pass {
                Some(true) => "ok",
                Some(false) => "FAILED",
                None => "",
            };
            out.push_str(&format!(
                "| {} | {} | {} | {} |\n",
                r.check, r.figure, r.target, verdict
            ));
        }
        out
    }
}

fn row(check: impl Into<String>, figure: String, target: &str, pass: Option<bool>) -> Row {
    Row {
        check: check.into(),
        figure,
        target: target.into(),
        pass,
    }
}

/// The most memory a task took above its loaded model, against its budget.
fn peak_row(task: &str, memory_kind: &str, peak: u64, budget: u64) -> Row {
    row(
        format!("{task}: peak {memory_kind} above the loaded model"),
        format!("{} (budget {})", mib(peak), mib(budget)),
        "<= budget",
        Some(peak <= budget),
    )
}

fn mib(bytes: u64) -> String {
    format!("{:.0} MiB", bytes as f64 / (1u64 << 20) as f64)
}

/// The most memory in use (device memory on a GPU, host RSS on the CPU)
/// while a phase runs, read every 20 ms on a thread of its own.
struct PeakSampler {
    stop: Arc<AtomicBool>,
    peak: Arc<AtomicU64>,
    thread: Option<std::thread::JoinHandle<()>>,
}

fn used_now(probe: &MemoryProbe) -> u64 {
    probe.read().model_side_bytes()
}

impl PeakSampler {
    fn start(probe: &MemoryProbe) -> PeakSampler {
        let (stop, peak) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicU64::new(0)),
        );
        let (s, p, probe) = (Arc::clone(&stop), Arc::clone(&peak), probe.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                p.fetch_max(used_now(&probe), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        PeakSampler {
            stop,
            peak,
            thread: Some(thread),
        }
    }

    fn finish(mut self, probe: &MemoryProbe) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.peak.load(Ordering::Relaxed).max(used_now(probe))
    }
}

/// Runs the whole check; the report says what passed.
pub fn run(args: &DeviceCheckArgs) -> anyhow::Result<DeviceReport> {
    let mut model = args.model.clone();
    if model.model_dir.is_none() {
        model.model_dir = Some(args.bundle.join(BUNDLE_MINILM));
    }
    model.validate()?;
    crate::alloc::tune();
    let mut rows = Vec::new();

    // Embeddings.
    let loaded = load_encoder(&model, sluice_schemas::Task::Embed)?;
    let probe = MemoryProbe::for_device(&loaded.device);
    let device = crate::task::startup::device_name(&loaded.device);
    let headroom = device_headroom_bytes(&loaded.device)?;
    let budget = (headroom as f64 * args.memory_fraction) as u64;
    let memory_kind = if probe.has_device() {
        "device memory"
    } else {
        "host RSS"
    };
    let total = probe
        .read()
        .device
        .map_or(String::new(), |d| format!(" of {}", mib(d.total_bytes)));
    rows.push(row(
        "embed: start-up budget vs free memory after loading",
        format!(
            "{} = {} x {}{total}",
            mib(budget),
            args.memory_fraction,
            mib(headroom)
        ),
        "",
        None,
    ));
    let loaded_level = used_now(&probe);
    let sampler = PeakSampler::start(&probe);
    let reference = read_reference(&args.bundle.join(BUNDLE_REFERENCE))?;
    let texts: Vec<String> = reference.iter().map(|(t, _)| t.clone()).collect();
    let (vectors, _) = crate::offline::embed_texts(&loaded, texts, model.max_batch_tokens)?;
    let min_cosine = vectors
        .into_iter()
        .zip(&reference)
        .map(|(v, (_, expected))| cosine(&l2_normalize(v), expected))
        .fold(f64::INFINITY, f64::min);
    rows.push(row(
        format!(
            "embed: {} reference texts vs sentence-transformers ({})",
            reference.len(),
            loaded.model.forward_name()
        ),
        format!("min cosine {min_cosine:.5}"),
        ">= 0.999",
        Some(min_cosine >= MIN_COSINE),
    ));
    let many: Vec<String> = (0..args.texts)
        .map(|i| reference[i % reference.len()].0.clone())
        .collect();
    let (_, report) = crate::offline::embed_texts(&loaded, many, model.max_batch_tokens)?;
    rows.push(row(
        format!(
            "embed: {} texts, {} real tokens, batches of <= {} padded tokens",
            report.texts, report.real_tokens, model.max_batch_tokens
        ),
        format!(
            "{:.0} texts/s, {:.0} tokens/s ({:.2} s)",
            report.texts as f64 / report.total_secs,
            report.real_tokens as f64 / report.total_secs,
            report.total_secs
        ),
        "",
        None,
    ));
    let peak = sampler.finish(&probe).saturating_sub(loaded_level);
    rows.push(peak_row("embed", memory_kind, peak, budget));
    drop(loaded);

    // Generation, on a SmolLM2-135M-shaped model with random weights.
    let scratch = tempfile_dir()?;
    let gguf = scratch.join("llama-random.gguf");
    write_random_llama(&args.bundle.join(BUNDLE_LLAMA_HEADER), &gguf, 0x5eed)?;
    let candle_device = crate::task::startup::open_device(&model)?;
    let (llama, _) = Decoder::load(&gguf, WeightFormat::AsStored, &candle_device)?;
    let headroom = device_headroom_bytes(&candle_device)?;
    let budget = (headroom as f64 * args.memory_fraction) as u64;
    let loaded_level = used_now(&probe);
    let sampler = PeakSampler::start(&probe);
    if !candle_device.is_cpu() {
        let (cpu, _) = Decoder::load(&gguf, WeightFormat::AsStored, &Device::Cpu)?;
        let drift = logits_drift(&llama, &cpu)?;
        rows.push(row(
            format!(
                "generate: a prompt's logits, {} step vs the CPU's {} step",
                llama.forward_name(),
                cpu.forward_name()
            ),
            format!("max |diff| / max |logit| = {drift:.4}"),
            "<= 0.05",
            Some(drift <= MAX_LOGITS_DRIFT),
        ));
    }
    decode_tokens_per_sec(&llama, 1, 2)?; // first-call costs (kernel loads) out of the figures
    for &sequences in &args.sequences {
        let tps = decode_tokens_per_sec(&llama, sequences, args.new_tokens)?;
        rows.push(row(
            format!(
                "generate: decode, {sequences} sequence(s) x {} tokens ({} step, SmolLM2-135M shapes, random weights)",
                args.new_tokens,
                llama.forward_name()
            ),
            format!("{tps:.1} tokens/s"),
            "",
            None,
        ));
    }
    let peak = sampler.finish(&probe).saturating_sub(loaded_level);
    rows.push(peak_row("generate", memory_kind, peak, budget));
    let _ = std::fs::remove_dir_all(&scratch);
    let report = DeviceReport {
        device,
        cpu: sluice_models::cpu::describe(),
        rows,
    };
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(report)
}

/// The reference texts and their sentence-transformers vectors.
fn read_reference(path: &Path) -> anyhow::Result<Vec<(String, Vec<f32>)>> {
    #[derive(serde::Deserialize)]
    struct File {
        items: Vec<Item>,
    }
    #[derive(serde::Deserialize)]
    struct Item {
        text: String,
        embedding: Vec<f32>,
    }
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let file: File = serde_json::from_str(&text)
        .with_context(|| format!("{} is not a reference file", path.display()))?;
    if file.items.is_empty() {
        bail!("{} holds no reference texts", path.display());
    }
    Ok(file
        .items
        .into_iter()
        .map(|i| (i.text, i.embedding))
        .collect())
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum();
    let norm = |v: &[f32]| v.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    dot / (norm(a) * norm(b))
}

/// A scratch folder under the system's temp dir, this process's own.
fn tempfile_dir() -> anyhow::Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("sluice-device-check-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    Ok(dir)
}

/// Copies a GGUF's header (metadata, tokenizer, tensor names, shapes and
/// types; no tensor data) to `out`: what [`write_random_llama`] fills.
pub fn write_gguf_header(gguf: &Path, out: &Path) -> anyhow::Result<()> {
    let mut file =
        std::fs::File::open(gguf).with_context(|| format!("cannot open {}", gguf.display()))?;
    let content = gguf_file::Content::read(&mut file)
        .with_context(|| format!("{} is not a GGUF file", gguf.display()))?;
    use std::io::{Read, Seek};
    file.rewind()?;
    let mut header = Vec::new();
    file.take(content.tensor_data_offset)
        .read_to_end(&mut header)?;
    std::fs::write(out, &header).with_context(|| format!("cannot write {}", out.display()))?;
    Ok(())
}

/// Writes a GGUF with `header`'s metadata and every tensor it names, at its
/// shape and type, filled with weights from `seed`: small uniform values,
/// norms near one.
pub fn write_random_llama(header: &Path, out: &Path, seed: u64) -> anyhow::Result<()> {
    let mut file =
        std::fs::File::open(header).with_context(|| format!("cannot open {}", header.display()))?;
    let content = gguf_file::Content::read(&mut file)
        .with_context(|| format!("{} is not a GGUF header", header.display()))?;
    let mut names: Vec<&String> = content.tensor_infos.keys().collect();
    names.sort();
    let mut rng = seed | 1;
    let mut tensors = Vec::with_capacity(names.len());
    for name in &names {
        let info = &content.tensor_infos[*name];
        let n = info.shape.elem_count();
        let (center, spread) = if name.contains("norm") {
            (1.0, 0.1)
        } else {
            (0.0, 0.05)
        };
        let values: Vec<f32> = (0..n)
            .map(|_| {
                // xorshift64*: fast, and the same weights on every machine.
                rng ^= rng >> 12;
                rng ^= rng << 25;
                rng ^= rng >> 27;
                let unit =
                    (rng.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 40) as f32 / (1u64 << 24) as f32;
                center + spread * (2.0 * unit - 1.0)
            })
            .collect();
        let dense = Tensor::from_vec(values, info.shape.clone(), &Device::Cpu)?;
        let dtype = match info.ggml_dtype {
            // The types candle quantizes to; anything else is held as f32.
            t @ (GgmlDType::F32
            | GgmlDType::F16
            | GgmlDType::Q4_0
            | GgmlDType::Q4_1
            | GgmlDType::Q5_0
            | GgmlDType::Q5_1
            | GgmlDType::Q8_0
            | GgmlDType::Q2K
            | GgmlDType::Q3K
            | GgmlDType::Q4K
            | GgmlDType::Q5K
            | GgmlDType::Q6K) => t,
            _ => GgmlDType::F32,
        };
        tensors.push(QTensor::quantize(&dense, dtype)?);
    }
    let metadata: Vec<(&str, &gguf_file::Value)> = content
        .metadata
        .iter()
        .map(|(k, v)| (k.as_str(), v))
        .collect();
    let named: Vec<(&str, &QTensor)> = names.iter().map(|n| n.as_str()).zip(&tensors).collect();
    let mut w = std::io::BufWriter::new(
        std::fs::File::create(out).with_context(|| format!("cannot create {}", out.display()))?,
    );
    gguf_file::write(&mut w, &metadata, &named)?;
    Ok(())
}

/// `max |a - b| / max |b|` over the logits after a 16-token prompt.
fn logits_drift(device: &Decoder, cpu: &Decoder) -> anyhow::Result<f64> {
    let prompt: Vec<u32> = (1..=PROMPT_TOKENS as u32).collect();
    let logits = |m: &Decoder| -> anyhow::Result<Vec<f32>> {
        let mut cache = m.new_cache(PROMPT_TOKENS)?;
        let out = m.forward(&mut [Segment {
            cache: &mut cache,
            tokens: &prompt,
        }])?;
        Ok(out.to_device(&Device::Cpu)?.flatten_all()?.to_vec1()?)
    };
    let (a, b) = (logits(device)?, logits(cpu)?);
    let scale = b.iter().fold(0f32, |m, x| m.max(x.abs())) as f64;
    let diff = a
        .iter()
        .zip(&b)
        .fold(0f32, |m, (x, y)| m.max((x - y).abs())) as f64;
    Ok(if scale > 0.0 { diff / scale } else { diff })
}

/// Decode tokens/s of `sequences` greedy sequences (after a 16-token
/// prompt each, prefilled in one step) over `new_tokens` steps, each step
/// one token per sequence, sampled on the host as the consumer does.
fn decode_tokens_per_sec(
    llama: &Decoder,
    sequences: usize,
    new_tokens: usize,
) -> anyhow::Result<f64> {
    let capacity = PROMPT_TOKENS + new_tokens;
    let mut caches = (0..sequences)
        .map(|_| llama.new_cache(capacity))
        .collect::<Result<Vec<_>, _>>()?;
    let prompts: Vec<Vec<u32>> = (0..sequences)
        .map(|s| {
            (0..PROMPT_TOKENS as u32)
                .map(|t| 1 + s as u32 * 7 + t)
                .collect()
        })
        .collect();
    let mut segments: Vec<Segment> = caches
        .iter_mut()
        .zip(&prompts)
        .map(|(cache, p)| Segment { cache, tokens: p })
        .collect();
    let mut next = argmax_rows(&llama.forward(&mut segments)?)?;
    let start = Instant::now();
    for _ in 0..new_tokens {
        let tokens: Vec<[u32; 1]> = next.iter().map(|t| [*t]).collect();
        let mut segments: Vec<Segment> = caches
            .iter_mut()
            .zip(&tokens)
            .map(|(cache, t)| Segment { cache, tokens: t })
            .collect();
        next = argmax_rows(&llama.forward(&mut segments)?)?;
    }
    Ok((sequences * new_tokens) as f64 / start.elapsed().as_secs_f64())
}

fn argmax_rows(logits: &Tensor) -> anyhow::Result<Vec<u32>> {
    let rows: Vec<Vec<f32>> = logits.to_device(&Device::Cpu)?.to_vec2()?;
    Ok(rows
        .iter()
        .map(|r| {
            r.iter()
                .enumerate()
                .fold((0, f32::NEG_INFINITY), |best, (i, &x)| {
                    if x > best.1 { (i, x) } else { best }
                })
                .0 as u32
        })
        .collect())
}

/// Writes the MiniLM model at `dir` to `out` with its f32 weights as f16
/// (half the bytes; the forward reads them back as f32), beside its config
/// and tokenizer.
pub fn write_minilm_f16(dir: &Path, out: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    for file in ["config.json", "tokenizer.json"] {
        std::fs::copy(dir.join(file), out.join(file))
            .with_context(|| format!("cannot copy {}", dir.join(file).display()))?;
    }
    let weights = dir.join("model.safetensors");
    let tensors = candle_core::safetensors::load(&weights, &Device::Cpu)
        .with_context(|| format!("cannot read {}", weights.display()))?;
    let half = tensors
        .into_iter()
        .map(|(name, t)| {
            let t = match t.dtype() {
                candle_core::DType::F32 => t.to_dtype(candle_core::DType::F16)?,
                _ => t,
            };
            Ok((name, t))
        })
        .collect::<candle_core::Result<std::collections::HashMap<_, _>>>()?;
    candle_core::safetensors::save(&half, out.join("model.safetensors"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_report_fails_when_any_check_fails_and_prints_every_row() {
        let mut report = DeviceReport {
            device: "cpu".into(),
            cpu: "test".into(),
            rows: vec![
                row("a", "1".into(), "", None),
                row("b", "2".into(), ">= 1", Some(true)),
            ],
        };
        assert!(report.passed());
        report.rows.push(row("c", "0".into(), ">= 1", Some(false)));
        assert!(!report.passed());
        let table = report.table();
        // The header, its rule, and the three rows.
        assert_eq!(table.lines().filter(|l| l.starts_with("| ")).count(), 5);
        assert!(table.contains("| c | 0 | >= 1 | FAILED |"), "{table}");
    }

    #[test]
    fn cosine_of_a_vector_with_itself_is_one_and_with_its_opposite_minus_one() {
        let v = [0.5f32, -1.0, 2.0];
        let w: Vec<f32> = v.iter().map(|x| -x).collect();
        assert!((cosine(&v, &v) - 1.0).abs() < 1e-12);
        assert!((cosine(&v, &w) + 1.0).abs() < 1e-12);
    }
}
