//! Our decoder-only transformer over a GGUF's weights, for the families
//! teams deploy (`config.rs`: Llama 2/3, SmolLM, TinyLlama, Mistral; Qwen 2
//! and 3; Gemma 2 and 3), built for continuous batching: one forward step
//! takes a token segment per sequence (a prompt chunk, or the one token a
//! decoding sequence adds), runs the matrix products over all of the step's
//! tokens at once (the weights are read once per step, whatever the batch),
//! and attention per sequence against its own KV cache at its own
//! positions. Sequences of any lengths share a step; one that finishes
//! simply stops appearing in the next.
//!
//! Two ways to run a step, chosen at load ([`Decoder::forward_name`]):
//! - **host** (`host.rs`: x86-64 CPUs with AVX2 + FMA, every matrix in the
//!   kernels' packing): plain `f32` buffers and the `sluice-kernels` crate's
//!   batched quantized products and decoder pieces.
//! - **candle** (`candle_step.rs`): the same arithmetic in candle ops (CUDA,
//!   other CPUs, dense f32 weights), and the reference the tests hold the
//!   host step to.
//!
//! Conventions follow llama.cpp's GGUF export: `blk.N.attn_q` etc.; llama's
//! Q and K permuted for interleaved rotary pairs, the others' not (halves);
//! Gemma's norm weights with their `+ 1` already added.

mod candle_step;
pub mod config;
pub mod constraint;
pub mod generation;
mod host;
mod kv;
mod rope;
mod weights;

use std::path::Path;
use std::time::{Duration, Instant};

use candle_core::quantized::gguf_file::Content;
use candle_core::{DType, Device, Tensor};

pub use candle_step::argmax;
pub use config::{Activation, Architecture, ConfigError, DecoderConfig, RopeLayout};
use kv::KvLayers;
pub use kv::{KvCache, Segment};
pub use weights::WeightFormat;

use crate::error::ModelError;
use crate::tokenizer::gguf::GgufTokenizer;
use host::{HostBlock, HostLayers};
use rope::Ropes;
use sluice_kernels::decoder::rms_norm;
use sluice_kernels::quantized::BlockType;
use sluice_kernels::team::Team;
use weights::{Block, Embeddings, Linear, Requantized, TensorReader};

/// Which step [`Decoder::load_with`] builds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepChoice {
    /// The host step where it can run (a CPU, every matrix in the kernels'
    /// packing), else the candle step.
    Fastest,
    /// The candle step always.
    Candle,
}

/// The blocks in the form the chosen step runs them.
enum Layers {
    Host(HostLayers),
    Candle(Vec<Block>),
}

pub struct Decoder {
    pub config: DecoderConfig,
    embeddings: Embeddings,
    ropes: Ropes,
    layers: Layers,
    norm: Tensor,
    output: Linear,
    output_bias: Option<Tensor>,
    /// How the matrices ended up held (`auto` resolved).
    weights: WeightFormat,
    device: Device,
}

/// A GGUF that cannot be opened or read, naming the file.
fn unreadable(path: &Path, e: candle_core::Error) -> ModelError {
    // candle's text may carry a backtrace after its first line.
    let text = e.to_string().lines().next().unwrap_or_default().to_string();
    if text.contains("unknown dtype") {
        ModelError::Failed(format!(
            "{}: a tensor is stored in a type sluice does not load ({text}); supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K",
            path.display()
        ))
    } else {
        ModelError::Failed(format!("{} is not a GGUF file: {text}", path.display()))
    }
}

impl Decoder {
    /// Loads the weights (held as `format`) and builds the tokenizer from
    /// the same file; the step is the fastest this device and these weights
    /// allow.
    pub fn load(
        path: &Path,
        format: WeightFormat,
        device: &Device,
    ) -> Result<(Decoder, GgufTokenizer), ModelError> {
        Decoder::load_with(path, format, device, StepChoice::Fastest)
    }

    /// [`Decoder::load`] with the step chosen: the tests and the benchmark
    /// run the candle step beside the host step.
    pub fn load_with(
        path: &Path,
        format: WeightFormat,
        device: &Device,
        step: StepChoice,
    ) -> Result<(Decoder, GgufTokenizer), ModelError> {
        let mut file = std::fs::File::open(path)
            .map_err(|e| ModelError::Failed(format!("cannot open {}: {e}", path.display())))?;
        let content = Content::read(&mut file).map_err(|e| unreadable(path, e))?;
        let config = DecoderConfig::from_metadata(&config::Metadata {
            values: &content.metadata,
        })
        .map_err(|e| ModelError::Failed(format!("{}: {e}", path.display())))?;
        weights::check_tensors(&content, &config)
            .map_err(|e| ModelError::Failed(format!("{}: {e}", path.display())))?;
        let tokenizer = GgufTokenizer::from_gguf(&content)
            .map_err(|e| ModelError::Failed(format!("{}: {e}", path.display())))?;
        let packing = weights::packing_runs(device);
        let mut reader = TensorReader {
            content: &content,
            file: &mut file,
            device,
        };
        let mut requantized = Requantized::default();
        let embed = reader.get("token_embd.weight")?;
        let embeddings = Embeddings::new(&embed)?;
        let norm = reader.required_vector("output_norm.weight")?;
        // Tied embeddings when the file has no separate output matrix
        // (Gemma 2 always ties them, as llama.cpp's gemma2 does).
        let output_q = if reader.has("output.weight") && config.architecture != Architecture::Gemma2
        {
            reader.get("output.weight")?
        } else {
            embed
        };
        let output = Linear::new(output_q, format, device, packing, &mut requantized)?;
        let output_bias = reader.vector("output.bias")?;
        let factors = match reader.vector("rope_freqs.weight")? {
            Some(t) => Some(t.to_vec1::<f32>()?),
            None => None,
        };
        let mut blocks = Vec::with_capacity(config.layers);
        for i in 0..config.layers {
            blocks.push(reader.block(i, format, packing, &mut requantized)?);
        }
        if requantized.matrices > 0 {
            tracing::info!(
                model = %path.display(),
                matrices = requantized.matrices,
                from = requantized.from.iter().cloned().collect::<Vec<_>>().join(","),
                secs = format!("{:.2}", requantized.secs),
                "requantized to Q8_0 at load: the host step's products take these types only as Q8_0"
            );
        }
        let host = step == StepChoice::Fastest && packing && blocks.iter().all(HostBlock::fits);
        let ropes = Ropes::new(
            &config.rope,
            &config.rope_local,
            config.head_dim,
            factors.as_deref(),
        );
        let (layers, output, weights) = if host {
            let team = Team::new(rayon::current_num_threads())
                .map_err(|e| ModelError::Failed(format!("cannot start the step's threads: {e}")))?;
            let blocks: Vec<HostBlock> = blocks
                .into_iter()
                .map(HostBlock::from_block)
                .collect::<Result<_, _>>()?;
            let (blocks, output, weights) = match format {
                WeightFormat::Auto => auto_weights(blocks, output, &team)?,
                other => (blocks, output, other),
            };
            let layers = Layers::Host(HostLayers {
                blocks,
                norm: norm.to_vec1()?,
                team,
            });
            (layers, output, weights)
        } else {
            let weights = match format {
                WeightFormat::Auto => WeightFormat::AsStored,
                other => other,
            };
            (Layers::Candle(blocks), output, weights)
        };
        Ok((
            Decoder {
                config,
                embeddings,
                ropes,
                layers,
                norm,
                output,
                output_bias,
                weights,
                device: device.clone(),
            },
            tokenizer,
        ))
    }

    /// Which step runs: `"host"` (plain buffers, sluice's kernels) or
    /// `"candle"` (candle ops), for logs and reports.
    pub fn forward_name(&self) -> &'static str {
        match self.layers {
            Layers::Host(_) => "host",
            Layers::Candle(_) => "candle",
        }
    }

    /// How the weight matrices are held (`auto` as it was decided).
    pub fn weight_format(&self) -> WeightFormat {
        self.weights
    }

    /// An empty cache for a sequence of at most `capacity` tokens.
    pub fn new_cache(&self, capacity: usize) -> Result<KvCache, ModelError> {
        let c = &self.config;
        let shape = (c.kv_heads, capacity, c.head_dim);
        let layers = match self.layers {
            Layers::Host(_) => {
                let n = c.kv_heads * capacity * c.head_dim;
                KvLayers::Host(
                    (0..c.layers)
                        .map(|_| (vec![0f32; n], vec![0f32; n]))
                        .collect(),
                )
            }
            Layers::Candle(_) => KvLayers::Tensors(
                (0..c.layers)
                    .map(|_| {
                        Ok((
                            Tensor::zeros(shape, DType::F32, &self.device)?,
                            Tensor::zeros(shape, DType::F32, &self.device)?,
                        ))
                    })
                    .collect::<Result<_, candle_core::Error>>()?,
            ),
        };
        Ok(KvCache {
            layers,
            len: 0,
            capacity,
        })
    }

    /// Runs every segment's tokens through the model in one step, appends
    /// them to the segments' caches, and returns the logits after each
    /// segment's last token, `[segments, vocab]`.
    pub fn forward(&self, segments: &mut [Segment]) -> Result<Tensor, ModelError> {
        let mut ids = Vec::new();
        for s in segments.iter() {
            if s.tokens.is_empty() {
                return Err(ModelError::Failed("a segment without tokens".into()));
            }
            if s.cache.len + s.tokens.len() > s.cache.capacity {
                return Err(ModelError::Failed(format!(
                    "a sequence outgrew its KV cache ({} + {} > {} tokens)",
                    s.cache.len,
                    s.tokens.len(),
                    s.cache.capacity
                )));
            }
            ids.extend_from_slice(s.tokens);
        }
        let c = &self.config;
        let mut x = self.embeddings.rows(&ids)?;
        if let Some(scale) = c.embedding_scale {
            x.iter_mut().for_each(|v| *v *= scale);
        }
        let eps = c.rms_eps as f32;
        let last = match &self.layers {
            Layers::Host(host) => {
                let last = host.forward(c, &self.ropes, segments, x)?;
                let mut h = vec![0f32; last.len()];
                rms_norm(&last, &host.norm, eps, &mut h);
                Tensor::from_vec(h, (segments.len(), c.hidden), &self.device)?
            }
            Layers::Candle(blocks) => {
                let x = Tensor::from_vec(x, (ids.len(), c.hidden), &self.device)?;
                let x = candle_step::forward(c, &self.ropes, blocks, segments, x)?;
                let mut rows = Vec::with_capacity(segments.len());
                let mut end = 0u32;
                for s in segments.iter() {
                    end += s.tokens.len() as u32;
                    rows.push(end - 1);
                }
                let last = x.index_select(&Tensor::new(rows.as_slice(), &self.device)?, 0)?;
                candle_nn::ops::rms_norm(&last, &self.norm, eps)?
            }
        };
        for s in segments.iter_mut() {
            s.cache.len += s.tokens.len();
        }
        let mut logits = match (&self.output, &self.layers) {
            (Linear::Packed(output), Layers::Host(host)) => {
                let h: Vec<f32> = last.flatten_all()?.to_vec1()?;
                Tensor::from_vec(
                    output.matmul_on(&host.team, &h, segments.len()),
                    (segments.len(), output.rows()),
                    &self.device,
                )?
            }
            (output, _) => output.forward(&last)?.to_dtype(DType::F32)?,
        };
        if let Some(bias) = &self.output_bias {
            logits = logits.broadcast_add(bias)?;
        }
        if let Some(cap) = c.final_softcap {
            logits = ((logits / f64::from(cap))?.tanh()? * f64::from(cap))?;
        }
        Ok(logits)
    }
}

/// `--weights auto` on the host step: where some matrices are held in 4
/// bits, times every block's products and the vocabulary product as stored
/// and requantized to Q8_0, at one token (a single sequence's decode) and at
/// eight (a batched one), alternating, the best of three each; keeps the
/// 4-bit weights unless Q8_0 is faster by the geometric mean of the two
/// (the other copy is dropped). Logged.
/// How much faster Q8_0 must measure for `--weights auto` to take it: a
/// near tie is noise, and would flip the choice (and the answers, a little)
/// from one start to the next.
const AUTO_Q8_MARGIN: f64 = 1.1;

fn auto_weights(
    blocks: Vec<HostBlock>,
    output: Linear,
    team: &Team,
) -> Result<(Vec<HostBlock>, Linear, WeightFormat), ModelError> {
    let four_bit = |l: &Linear| {
        l.packed()
            .is_some_and(|p| p.block_type() == BlockType::Q4_1)
    };
    if !blocks.iter().any(HostBlock::has_four_bit) && !four_bit(&output) {
        return Ok((blocks, output, WeightFormat::AsStored));
    }
    let q8_blocks: Vec<HostBlock> = blocks
        .iter()
        .map(HostBlock::to_q8_0)
        .collect::<Result<_, _>>()?;
    let q8_output = match &output {
        Linear::Packed(p) if p.block_type() == BlockType::Q4_1 => Some(p.to_q8_0()),
        _ => None,
    };
    let vocab = |out: &Linear, tokens: usize| -> Duration {
        let start = Instant::now();
        if let Linear::Packed(p) = out {
            let x = vec![0.01f32; tokens * p.cols()];
            std::hint::black_box(p.matmul_on(team, &x, tokens));
        }
        start.elapsed()
    };
    let q8_out = q8_output.map(Linear::Packed);
    let mut best = [[Duration::MAX; 2]; 2];
    for _ in 0..3 {
        for (i, tokens) in [1usize, 8].into_iter().enumerate() {
            let stored = host::time_products(&blocks, team, tokens) + vocab(&output, tokens);
            let q8 = host::time_products(&q8_blocks, team, tokens)
                + vocab(q8_out.as_ref().unwrap_or(&output), tokens);
            best[0][i] = best[0][i].min(stored);
            best[1][i] = best[1][i].min(q8);
        }
    }
    let speedup = |i: usize| best[0][i].as_secs_f64() / best[1][i].as_secs_f64().max(1e-12);
    let (one, eight) = (speedup(0), speedup(1));
    let q8_wins = (one * eight).sqrt() >= AUTO_Q8_MARGIN;
    tracing::info!(
        q8_0_vs_stored_1_token = format!("{one:.2}"),
        q8_0_vs_stored_8_tokens = format!("{eight:.2}"),
        choice = if q8_wins { "q8_0" } else { "as-stored" },
        "--weights auto: timed every product of a step with the 4-bit weights as stored and requantized to Q8_0"
    );
    Ok(if q8_wins {
        (q8_blocks, q8_out.unwrap_or(output), WeightFormat::Q8_0)
    } else {
        (blocks, output, WeightFormat::AsStored)
    })
}
