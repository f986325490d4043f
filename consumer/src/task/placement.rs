//! Where each part of a task's work runs on the configured device, decided
//! from the config alone (so it is tested without a GPU) and logged at
//! start-up: a CUDA consumer never does work on the host without saying so.
//!
//! On CUDA, embeddings run candle-transformers' BERT on padded batches (the
//! packed forward in `sluice-models`' `encoder/packed.rs` is x86 host code), and generation runs
//! the candle decoder step with candle's quantized matmul on the device (the
//! host step in `sluice-models`' `decoder/host.rs` is CPU-only). What stays on the host there:
//! tokenizing (always), the step's embedding rows (dequantized from the
//! table as stored, then copied up), sampling (the step's logits are copied
//! back each step), and, with `--weights q8_0`, the requantization at load
//! (candle quantizes on the host and uploads the blocks).

use sluice_schemas::{Task, Work};

use crate::config::{DeviceKind, ModelConfig};
use sluice_models::EmbedWeights;
use sluice_models::decoder::WeightFormat;

/// Where a part runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Runs {
    Device,
    Host,
}

/// One part of the work and where it runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    pub part: &'static str,
    pub runs: Runs,
    pub how: &'static str,
    /// Host work on a GPU build that the knobs could move to the device, or
    /// a knob the device ignores: logged as a warning.
    pub warn: bool,
}

/// The plan for `task` as configured.
pub fn plan(task: Task, model: &ModelConfig, weights: WeightFormat) -> Vec<Part> {
    match task.work() {
        Work::Encode => encoder(task, model.device, model.embed_weights),
        Work::Generate => generate(model.device, weights),
        Work::Transcribe => transcribe(),
    }
}

fn part(part: &'static str, runs: Runs, how: &'static str) -> Part {
    Part {
        part,
        runs,
        how,
        warn: false,
    }
}

fn warning(part: &'static str, runs: Runs, how: &'static str) -> Part {
    Part {
        warn: true,
        ..self::part(part, runs, how)
    }
}

fn encoder(task: Task, device: DeviceKind, weights: EmbedWeights) -> Vec<Part> {
    let tokenize = part("tokenize", Runs::Host, "the tokenizers crate");
    // Every encoder task but embed (rerank, classify): a classifier head
    // reads the pooled first token.
    let score = part(
        "score",
        Runs::Host,
        "the first token's state through the classifier head, then the activation its files name",
    );
    let scored = task != Task::Embed;
    match device {
        DeviceKind::Cpu => {
            let mut parts = vec![
                tokenize,
                part(
                    "forward",
                    Runs::Host,
                    "sluice's packed BERT forward (no padding) on the CPU kernels, or candle-transformers' BERT where it cannot run",
                ),
                part(
                    "pool",
                    Runs::Host,
                    "the pooling the model's files name (mean, CLS or max) over the packed rows",
                ),
            ];
            if scored {
                parts.push(score);
            }
            parts
        }
        DeviceKind::Cuda => {
            let mut parts = vec![
                tokenize,
                part(
                    "forward",
                    Runs::Device,
                    "candle-transformers' BERT on padded batches, f32",
                ),
                part(
                    "pool",
                    Runs::Device,
                    "the pooling the model's files name, masked; the pooled rows are copied to the host",
                ),
            ];
            if scored {
                parts.push(score);
            }
            if weights == EmbedWeights::Bf16 {
                parts.push(part(
                    "--embed-weights",
                    Runs::Device,
                    "bf16 applies to the CPU forward only; CUDA runs f32 weights",
                ));
            }
            parts
        }
    }
}

/// Transcription runs on the host only (start-up refuses a GPU).
fn transcribe() -> Vec<Part> {
    vec![
        part(
            "decode",
            Runs::Host,
            "symphonia's demuxers and decoders, resampled to 16 kHz mono",
        ),
        part(
            "features",
            Runs::Host,
            "Whisper's log-mel features (transformers' WhisperFeatureExtractor)",
        ),
        part(
            "encode",
            Runs::Host,
            "candle's Whisper encoder, f32, one 30 s window at a time",
        ),
        part(
            "decode-tokens",
            Runs::Host,
            "candle's Whisper decoder, greedy with timestamps, windows of the recordings in turn",
        ),
    ]
}

fn generate(device: DeviceKind, weights: WeightFormat) -> Vec<Part> {
    let tokenize = part(
        "tokenize",
        Runs::Host,
        "the GGUF's own tokenizer (byte-level BPE or SentencePiece) and chat template",
    );
    match device {
        DeviceKind::Cpu => vec![
            tokenize,
            part(
                "step",
                Runs::Host,
                "sluice's host step (int8 dot products over 4-bit and 8-bit blocks; other stored types requantized to Q8_0 at load), or the candle step where the weights do not fit it",
            ),
            part("sample", Runs::Host, "greedy or top-p over the logits"),
        ],
        DeviceKind::Cuda => {
            let mut parts = vec![
                tokenize,
                part(
                    "embed",
                    Runs::Host,
                    "each step's embedding rows, dequantized from the table as stored and copied to the device",
                ),
                part(
                    "step",
                    Runs::Device,
                    "the candle decoder step: candle's quantized matmul (dense f32 with --weights f32), attention against device KV caches",
                ),
                part(
                    "sample",
                    Runs::Host,
                    "each step's logits are copied to the host and sampled there",
                ),
            ];
            if weights == WeightFormat::Q8_0 {
                parts.push(warning(
                    "load",
                    Runs::Host,
                    "--weights q8_0 requantizes on the host at load (candle quantizes on the CPU, then uploads); --weights as-stored keeps the GGUF's blocks",
                ));
            }
            parts
        }
    }
}

/// Logs the plan, one line a part: host work on a GPU at `info` when it is
/// by design, at `warn` when a knob could move it or the device ignores it.
pub fn log(device: &str, parts: &[Part]) {
    for p in parts {
        let runs = match p.runs {
            Runs::Device => device,
            Runs::Host => "host",
        };
        if p.warn {
            tracing::warn!(device, part = p.part, runs, "{}", p.how);
        } else {
            tracing::info!(device, part = p.part, runs, "{}", p.how);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runs(parts: &[Part], name: &str) -> Runs {
        match parts.iter().find(|p| p.part == name) {
            Some(p) => p.runs,
            None => panic!("no part {name} in {parts:?}"),
        }
    }

    #[test]
    fn on_a_cpu_everything_runs_on_the_host_and_nothing_warns() {
        for parts in [
            encoder(Task::Embed, DeviceKind::Cpu, EmbedWeights::Bf16),
            encoder(Task::Rerank, DeviceKind::Cpu, EmbedWeights::F32),
            generate(DeviceKind::Cpu, WeightFormat::Q8_0),
        ] {
            assert!(parts.iter().all(|p| p.runs == Runs::Host && !p.warn));
        }
    }

    #[test]
    fn on_cuda_the_models_run_on_the_device_and_host_work_is_named() {
        let e = encoder(Task::Embed, DeviceKind::Cuda, EmbedWeights::Bf16);
        assert_eq!(runs(&e, "forward"), Runs::Device);
        assert_eq!(runs(&e, "pool"), Runs::Device);
        assert_eq!(runs(&e, "tokenize"), Runs::Host);
        assert!(
            e.iter()
                .any(|p| p.part == "--embed-weights" && p.how.contains("CPU forward only"))
        );
        assert!(
            !encoder(Task::Embed, DeviceKind::Cuda, EmbedWeights::F32)
                .iter()
                .any(|p| p.part == "--embed-weights")
        );
        assert!(!e.iter().any(|p| p.part == "score"), "{e:?}");
        let r = encoder(Task::Rerank, DeviceKind::Cuda, EmbedWeights::F32);
        assert_eq!(runs(&r, "forward"), Runs::Device);
        assert_eq!(runs(&r, "score"), Runs::Host);

        let g = generate(DeviceKind::Cuda, WeightFormat::Q8_0);
        assert_eq!(runs(&g, "step"), Runs::Device);
        assert_eq!(runs(&g, "sample"), Runs::Host);
        let load = g.iter().find(|p| p.part == "load");
        assert!(load.is_some_and(|p| p.warn && p.runs == Runs::Host));
        for w in [WeightFormat::AsStored, WeightFormat::F32] {
            let g = generate(DeviceKind::Cuda, w);
            assert!(!g.iter().any(|p| p.warn), "{w:?}: {g:?}");
        }
    }
}
