//! Our own llama forward pass over a GGUF's quantized weights, built for
//! continuous batching: one forward step takes a token segment per sequence
//! (a prompt chunk, or the one token a decoding sequence adds), runs the
//! linear layers over all of the step's tokens at once (the weights are read
//! once per step, whatever the batch), and attention per sequence against its
//! own KV cache at its own positions. Sequences of any lengths share a step;
//! one that finishes simply stops appearing in the next.
//!
//! Two ways to run a step, chosen at load ([`Llama::forward_name`]):
//! - **host** (x86-64 CPUs with AVX2 + FMA, weights in Q4_1 or Q8_0): plain
//!   `f32` buffers and the `sluice-kernels` crate's batched quantized
//!   products and decoder pieces. Q, K and V are one product, gate and up
//!   another, so a layer is four products (each quantizing its input once)
//!   with RMS norm, RoPE, cache writes, attention and SwiGLU between them on
//!   the same buffers; no tensor ops. The products and the attention are
//!   parallel regions on the model's thread team (`kernels::team`), whose
//!   threads spin between regions rather than sleep.
//! - **candle**: the same arithmetic in candle ops (CUDA, other CPUs, other
//!   quantizations, dense f32 weights), and the reference the tests hold the
//!   host step to.
//!
//! Conventions follow llama.cpp's GGUF export: `blk.N.attn_q` etc., Q and K
//! permuted for interleaved (pairwise) rotary embeddings.

use std::path::Path;

use candle_core::quantized::gguf_file::Content;
use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{D, DType, Device, Module, Tensor};

use sluice_kernels::decoder::{self, DecoderHeads, SequenceAttention};
use sluice_kernels::team::Team;

use super::ModelError;
use super::gguf_tokenizer::GgufTokenizer;
use super::qmatmul::{self, BlockType, PackedMatrix};

/// Shape of the network, from the GGUF metadata (`llama.*`).
#[derive(Debug, Clone, PartialEq)]
pub struct LlamaConfig {
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub hidden: usize,
    pub ffn: usize,
    pub vocab: usize,
    pub context_length: usize,
    pub rms_eps: f64,
    pub rope_base: f32,
}

impl LlamaConfig {
    fn from_gguf(content: &Content) -> Result<LlamaConfig, ModelError> {
        let get = |key: &str| {
            content
                .metadata
                .get(key)
                .ok_or_else(|| ModelError::Failed(format!("GGUF metadata has no {key}")))
        };
        let int = |key: &str| -> Result<usize, ModelError> { Ok(get(key)?.to_u32()? as usize) };
        let arch = get("general.architecture")?.to_string()?.clone();
        if arch != "llama" {
            return Err(ModelError::Failed(format!(
                "general.architecture is {arch:?}; only llama GGUFs are supported"
            )));
        }
        let heads = int("llama.attention.head_count")?;
        let hidden = int("llama.embedding_length")?;
        let vocab = match content.metadata.get("llama.vocab_size") {
            Some(v) => v.to_u32()? as usize,
            None => get("tokenizer.ggml.tokens")?.to_vec()?.len(),
        };
        Ok(LlamaConfig {
            layers: int("llama.block_count")?,
            heads,
            kv_heads: int("llama.attention.head_count_kv")?,
            head_dim: hidden / heads,
            hidden,
            ffn: int("llama.feed_forward_length")?,
            vocab,
            context_length: int("llama.context_length")?,
            rms_eps: get("llama.attention.layer_norm_rms_epsilon")?.to_f32()? as f64,
            rope_base: match content.metadata.get("llama.rope.freq_base") {
                Some(v) => v.to_f32()?,
                None => 10_000.0,
            },
        })
    }

    /// KV-cache bytes one token of one sequence holds: keys and values
    /// (f32) of every layer's KV heads.
    pub fn kv_bytes_per_token(&self) -> u64 {
        (2 * self.layers * self.kv_heads * self.head_dim * DType::F32.size_in_bytes()) as u64
    }

    /// The most bytes one [`Llama::forward`] step holds beyond the weights
    /// and the KV caches, for a step of `step_tokens` tokens over at most
    /// `segments` sequences, whose longest prompt chunk is `chunk` tokens
    /// attending over at most `context` positions. Counted: each token's
    /// activations through a block (residual, norm, q/k/v, attention output,
    /// the MLP's gate, up and product) twice over for temporaries and the
    /// quantized copies the matmuls make; one segment's attention scores,
    /// mask and softmax (segments run one after another); and the logits of
    /// every segment with the sampler's copy.
    pub fn step_activation_bytes(
        &self,
        step_tokens: usize,
        segments: usize,
        chunk: usize,
        context: usize,
    ) -> u64 {
        let f32_bytes = DType::F32.size_in_bytes() as u64;
        let kv_dim = self.kv_heads * self.head_dim;
        let per_token = (5 * self.hidden + 2 * kv_dim + 4 * self.ffn) as u64 * f32_bytes * 2;
        let scores = 3 * (self.heads * chunk * context) as u64 * f32_bytes;
        let logits = 2 * (segments.min(step_tokens) * self.vocab) as u64 * f32_bytes;
        step_tokens as u64 * per_token + scores + logits
    }
}

/// How the weight matrices are held in memory (measured on SmolLM2-135M Q4_1
/// on 2 CPU cores; see the README's generation benchmark).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WeightFormat {
    /// As stored in the GGUF. The least memory; on the host step the fewest
    /// bytes read per token, so the fastest single-sequence decode, but each
    /// Q4_1 block costs more arithmetic than a Q8_0 one, so prompts and
    /// batched decoding are slower than Q8_0's.
    AsStored,
    /// Requantized to Q8_0 at load: about 1.7x the memory of Q4_1, the
    /// fastest prompts and batched decoding (the default: a consumer decodes
    /// many sequences together).
    #[default]
    Q8_0,
    /// Dense f32, stored transposed so a step is one matrix-matrix product
    /// (always the candle step): about 5.5x the memory of Q4_1; one sequence
    /// is bound by memory bandwidth (slow), but the weights are read once
    /// per step, so throughput grows with the sequences batched.
    F32,
}

impl std::str::FromStr for WeightFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "as-stored" => Ok(WeightFormat::AsStored),
            "q8_0" => Ok(WeightFormat::Q8_0),
            "f32" => Ok(WeightFormat::F32),
            other => Err(format!(
                "unknown weight format {other:?} (as-stored, q8_0, f32)"
            )),
        }
    }
}

/// Which step [`Llama::load_with`] builds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepChoice {
    /// The host step where it can run (a CPU, every matrix in the kernels'
    /// packing), else the candle step.
    Fastest,
    /// The candle step always.
    Candle,
}

/// A weight matrix as the forward multiplies by it.
enum Linear {
    /// Quantized blocks in our batched 8-bit kernels (Q4_1, Q8_0 on x86-64
    /// with AVX2, AVX-512 where the CPU has it): each weight block read once
    /// per step for all of its tokens.
    Packed(PackedMatrix),
    /// Quantized blocks in candle: one vector product per (token, output)
    /// pair (other quantizations, other CPUs, CUDA).
    Quantized(QMatMul),
    /// Dense f32, `[in, out]`.
    Dense(Tensor),
}

/// The kernels' packing of a Q4_1 or Q8_0 matrix whose rows are whole
/// blocks; `None` for other types and shapes (candle's matmul keeps them).
fn packed(q: &QTensor) -> Option<PackedMatrix> {
    let (rows, cols) = q.shape().dims2().ok()?;
    let kind = match q.dtype() {
        GgmlDType::Q4_1 => BlockType::Q4_1,
        GgmlDType::Q8_0 => BlockType::Q8_0,
        _ => return None,
    };
    PackedMatrix::from_blocks(kind, rows, cols, &q.data().ok()?)
}

impl Linear {
    fn new(q: QTensor, format: WeightFormat, device: &Device) -> Result<Linear, ModelError> {
        let quantized = |q: QTensor| -> Result<Linear, ModelError> {
            if device.is_cpu()
                && qmatmul::available()
                && let Some(p) = packed(&q)
            {
                return Ok(Linear::Packed(p));
            }
            Ok(Linear::Quantized(QMatMul::from_qtensor(q)?))
        };
        match format {
            WeightFormat::AsStored => quantized(q),
            WeightFormat::Q8_0 => {
                let dense = q.dequantize(device)?;
                quantized(QTensor::quantize(&dense, GgmlDType::Q8_0)?)
            }
            WeightFormat::F32 => Ok(Linear::Dense(q.dequantize(device)?.t()?.contiguous()?)),
        }
    }

    fn packed(&self) -> Option<&PackedMatrix> {
        match self {
            Linear::Packed(p) => Some(p),
            _ => None,
        }
    }

    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        match self {
            Linear::Packed(p) => {
                let (tokens, cols) = x.dims2()?;
                if cols != p.cols() {
                    candle_core::bail!("matmul: {cols} inputs for a matrix of {}", p.cols());
                }
                let input: Vec<f32> = x.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?;
                Tensor::from_vec(p.matmul(&input, tokens), (tokens, p.rows()), x.device())
            }
            Linear::Quantized(q) => q.forward(x),
            Linear::Dense(w) => x.matmul(w),
        }
    }
}

struct Block {
    attn_norm: Tensor,
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    ffn_norm: Tensor,
    gate: Linear,
    up: Linear,
    down: Linear,
}

/// A block as the host step runs it: Q, K and V stacked into one matrix,
/// gate and up into another, norms as plain vectors.
struct HostBlock {
    attn_norm: Vec<f32>,
    qkv: PackedMatrix,
    o: PackedMatrix,
    ffn_norm: Vec<f32>,
    gate_up: PackedMatrix,
    down: PackedMatrix,
}

impl HostBlock {
    /// Whether every matrix of `b` is in the kernels' packing and Q, K, V
    /// (and gate, up) share a block type and width, so they stack.
    fn fits(b: &Block) -> bool {
        let stackable = |parts: &[&Linear]| {
            let packed: Option<Vec<&PackedMatrix>> = parts.iter().map(|l| l.packed()).collect();
            packed.is_some_and(|p| {
                p.iter()
                    .all(|m| m.block_type() == p[0].block_type() && m.cols() == p[0].cols())
            })
        };
        stackable(&[&b.q, &b.k, &b.v])
            && stackable(&[&b.gate, &b.up])
            && b.o.packed().is_some()
            && b.down.packed().is_some()
    }

    fn from_block(b: Block) -> Result<HostBlock, ModelError> {
        let unfit = || ModelError::Failed("a block's weights do not fit the host step".into());
        let stack = |parts: &[&Linear]| -> Result<PackedMatrix, ModelError> {
            let packed: Option<Vec<&PackedMatrix>> = parts.iter().map(|l| l.packed()).collect();
            PackedMatrix::stack(&packed.ok_or_else(unfit)?).ok_or_else(unfit)
        };
        let qkv = stack(&[&b.q, &b.k, &b.v])?;
        let gate_up = stack(&[&b.gate, &b.up])?;
        let (Linear::Packed(o), Linear::Packed(down)) = (b.o, b.down) else {
            return Err(unfit());
        };
        Ok(HostBlock {
            attn_norm: b.attn_norm.to_vec1()?,
            qkv,
            o,
            ffn_norm: b.ffn_norm.to_vec1()?,
            gate_up,
            down,
        })
    }
}

/// The blocks and rotary tables in the form the chosen step runs them.
enum Layers {
    Host {
        blocks: Vec<HostBlock>,
        /// `[context, head_dim / 2]` each.
        cos: Vec<f32>,
        sin: Vec<f32>,
        /// The final RMS norm's weights.
        norm: Vec<f32>,
        /// The threads the step's products and attention share (as many as
        /// rayon's pool: `RAYON_NUM_THREADS`, else one per core).
        team: Team,
    },
    Candle {
        blocks: Vec<Block>,
        cos: Tensor,
        sin: Tensor,
    },
}

pub struct Llama {
    pub config: LlamaConfig,
    embed: Tensor,
    layers: Layers,
    norm: Tensor,
    output: Linear,
    device: Device,
}

/// One sequence's keys and values for every layer, allocated once for the
/// most tokens it may ever hold (prompt + max_new_tokens), which is exactly
/// what its budget reservation covered.
pub struct KvCache {
    layers: KvLayers,
    len: usize,
    capacity: usize,
}

/// Per layer: keys and values, each `[kv_heads, capacity, head_dim]`, as
/// plain buffers (host step) or tensors (candle step).
enum KvLayers {
    Host(Vec<(Vec<f32>, Vec<f32>)>),
    Tensors(Vec<(Tensor, Tensor)>),
}

impl KvCache {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }
}

/// A sequence's part in one forward step: its cache and the tokens to add.
pub struct Segment<'a, C = KvCache> {
    pub cache: &'a mut C,
    pub tokens: &'a [u32],
}

impl Llama {
    /// Loads the weights (held as `format`) and builds the tokenizer from
    /// the same file; the step is the fastest this device and these weights
    /// allow.
    pub fn load(
        path: &Path,
        format: WeightFormat,
        device: &Device,
    ) -> Result<(Llama, GgufTokenizer), ModelError> {
        Llama::load_with(path, format, device, StepChoice::Fastest)
    }

    /// [`Llama::load`] with the step chosen: the tests and the benchmark run
    /// the candle step beside the host step.
    pub fn load_with(
        path: &Path,
        format: WeightFormat,
        device: &Device,
        step: StepChoice,
    ) -> Result<(Llama, GgufTokenizer), ModelError> {
        let mut file = std::fs::File::open(path)
            .map_err(|e| ModelError::Failed(format!("cannot open {}: {e}", path.display())))?;
        let content = Content::read(&mut file).map_err(|e| {
            ModelError::Failed(format!("{} is not a GGUF file: {e}", path.display()))
        })?;
        let tokenizer = GgufTokenizer::from_gguf(&content)
            .map_err(|e| ModelError::Failed(format!("{}: {e}", path.display())))?;
        let config = LlamaConfig::from_gguf(&content)?;
        let mut tensor = |name: &str| -> Result<QTensor, ModelError> {
            content
                .tensor(&mut file, name, device)
                .map_err(|e| ModelError::Failed(format!("tensor {name}: {e}")))
        };
        let embed_q = tensor("token_embd.weight")?;
        let embed = embed_q.dequantize(device)?;
        let norm = tensor("output_norm.weight")?.dequantize(device)?;
        // Tied embeddings when the file has no separate output matrix.
        let output = match tensor("output.weight") {
            Ok(t) => Linear::new(t, format, device)?,
            Err(_) => Linear::new(embed_q, format, device)?,
        };
        let mut blocks = Vec::with_capacity(config.layers);
        for i in 0..config.layers {
            let mut matmul = |part: &str| -> Result<Linear, ModelError> {
                Linear::new(tensor(&format!("blk.{i}.{part}.weight"))?, format, device)
            };
            blocks.push(Block {
                q: matmul("attn_q")?,
                k: matmul("attn_k")?,
                v: matmul("attn_v")?,
                o: matmul("attn_output")?,
                gate: matmul("ffn_gate")?,
                up: matmul("ffn_up")?,
                down: matmul("ffn_down")?,
                attn_norm: tensor(&format!("blk.{i}.attn_norm.weight"))?.dequantize(device)?,
                ffn_norm: tensor(&format!("blk.{i}.ffn_norm.weight"))?.dequantize(device)?,
            });
        }
        let (cos, sin) = rope_tables(&config, device)?;
        let host = step == StepChoice::Fastest && device.is_cpu();
        let layers = if host && blocks.iter().all(HostBlock::fits) {
            Layers::Host {
                blocks: blocks
                    .into_iter()
                    .map(HostBlock::from_block)
                    .collect::<Result<_, _>>()?,
                cos: cos.flatten_all()?.to_vec1()?,
                sin: sin.flatten_all()?.to_vec1()?,
                norm: norm.to_vec1()?,
                team: Team::new(rayon::current_num_threads()).map_err(|e| {
                    ModelError::Failed(format!("cannot start the step's threads: {e}"))
                })?,
            }
        } else {
            Layers::Candle { blocks, cos, sin }
        };
        Ok((
            Llama {
                config,
                embed,
                layers,
                norm,
                output,
                device: device.clone(),
            },
            tokenizer,
        ))
    }

    /// Which step runs: `"host"` (plain buffers, sluice's kernels) or
    /// `"candle"` (candle ops), for logs and reports.
    pub fn forward_name(&self) -> &'static str {
        match self.layers {
            Layers::Host { .. } => "host",
            Layers::Candle { .. } => "candle",
        }
    }

    /// An empty cache for a sequence of at most `capacity` tokens.
    pub fn new_cache(&self, capacity: usize) -> Result<KvCache, ModelError> {
        let c = &self.config;
        let shape = (c.kv_heads, capacity, c.head_dim);
        let layers = match self.layers {
            Layers::Host { .. } => {
                let n = c.kv_heads * capacity * c.head_dim;
                KvLayers::Host(
                    (0..c.layers)
                        .map(|_| (vec![0f32; n], vec![0f32; n]))
                        .collect(),
                )
            }
            Layers::Candle { .. } => KvLayers::Tensors(
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
        let ids = Tensor::new(ids.as_slice(), &self.device)?;
        let x = self.embed.index_select(&ids, 0)?;
        let x = match &self.layers {
            Layers::Host {
                blocks,
                cos,
                sin,
                norm,
                team,
            } => {
                let x = x.flatten_all()?.to_vec1::<f32>()?;
                let last = self.host_layers(team, blocks, cos, sin, segments, x)?;
                for s in segments.iter_mut() {
                    s.cache.len += s.tokens.len();
                }
                if let Linear::Packed(output) = &self.output {
                    let mut h = vec![0f32; last.len()];
                    decoder::rms_norm(&last, norm, self.config.rms_eps as f32, &mut h);
                    let logits = output.matmul_on(team, &h, segments.len());
                    return Ok(Tensor::from_vec(
                        logits,
                        (segments.len(), output.rows()),
                        &self.device,
                    )?);
                }
                let last =
                    Tensor::from_vec(last, (segments.len(), self.config.hidden), &self.device)?;
                let last = candle_nn::ops::rms_norm(&last, &self.norm, self.config.rms_eps as f32)?;
                return Ok(self.output.forward(&last)?.to_dtype(DType::F32)?);
            }
            Layers::Candle { blocks, cos, sin } => {
                let x = self.candle_layers(blocks, cos, sin, segments, x)?;
                let mut last = Vec::with_capacity(segments.len());
                let mut end = 0u32;
                for s in segments.iter() {
                    end += s.tokens.len() as u32;
                    last.push(end - 1);
                }
                x.index_select(&Tensor::new(last.as_slice(), &self.device)?, 0)?
            }
        };
        for s in segments.iter_mut() {
            s.cache.len += s.tokens.len();
        }
        let x = candle_nn::ops::rms_norm(&x, &self.norm, self.config.rms_eps as f32)?;
        Ok(self.output.forward(&x)?.to_dtype(DType::F32)?)
    }

    /// The blocks on plain buffers: `x` is the step's embeddings, `[tokens,
    /// hidden]`; returns the hidden state after each segment's last token,
    /// `[segments, hidden]`. Writes the new keys and values into the caches
    /// (their `len` is advanced by the caller).
    fn host_layers(
        &self,
        team: &Team,
        blocks: &[HostBlock],
        cos: &[f32],
        sin: &[f32],
        segments: &mut [Segment],
        mut x: Vec<f32>,
    ) -> Result<Vec<f32>, ModelError> {
        let c = &self.config;
        let (hidden, hd) = (c.hidden, c.head_dim);
        let half = hd / 2;
        let q_dim = c.heads * hd;
        let kv_dim = c.kv_heads * hd;
        let qkv_dim = q_dim + 2 * kv_dim;
        let tokens = x.len() / hidden;
        let eps = c.rms_eps as f32;
        let shape = DecoderHeads {
            heads: c.heads,
            kv_heads: c.kv_heads,
            head_dim: hd,
        };
        let mut h = vec![0f32; x.len()];
        for (layer, block) in blocks.iter().enumerate() {
            decoder::rms_norm(&x, &block.attn_norm, eps, &mut h);
            let mut qkv = block.qkv.matmul_on(team, &h, tokens);
            // Rotate Q and K at each token's position; K and V go into the
            // sequence's cache, Q into the step's queries.
            let mut queries = vec![0f32; tokens * q_dim];
            let mut row = 0;
            for s in segments.iter_mut() {
                let (start, capacity) = (s.cache.len, s.cache.capacity);
                let KvLayers::Host(caches) = &mut s.cache.layers else {
                    return Err(candle_cache_in_host_step());
                };
                let (keys, values) = &mut caches[layer];
                for pos in start..start + s.tokens.len() {
                    let angles = pos * half..(pos + 1) * half;
                    let (cos, sin) = (&cos[angles.clone()], &sin[angles]);
                    let (q, kv) = qkv[row * qkv_dim..(row + 1) * qkv_dim].split_at_mut(q_dim);
                    let (k, v) = kv.split_at_mut(kv_dim);
                    for head in q.chunks_exact_mut(hd) {
                        decoder::rope_interleaved(head, cos, sin);
                    }
                    for (g, (kh, vh)) in k.chunks_exact_mut(hd).zip(v.chunks_exact(hd)).enumerate()
                    {
                        decoder::rope_interleaved(kh, cos, sin);
                        let at = (g * capacity + pos) * hd;
                        keys[at..at + hd].copy_from_slice(kh);
                        values[at..at + hd].copy_from_slice(vh);
                    }
                    queries[row * q_dim..(row + 1) * q_dim].copy_from_slice(q);
                    row += 1;
                }
            }
            let mut row = 0;
            let mut sequences = Vec::with_capacity(segments.len());
            for s in segments.iter() {
                let KvLayers::Host(caches) = &s.cache.layers else {
                    return Err(candle_cache_in_host_step());
                };
                let n = s.tokens.len();
                sequences.push(SequenceAttention {
                    queries: &queries[row * q_dim..(row + n) * q_dim],
                    keys: &caches[layer].0,
                    values: &caches[layer].1,
                    capacity: s.cache.capacity,
                    start: s.cache.len,
                });
                row += n;
            }
            let context = decoder::causal_attention_on(team, shape, &sequences);
            add(&mut x, &block.o.matmul_on(team, &context, tokens));
            decoder::rms_norm(&x, &block.ffn_norm, eps, &mut h);
            let gate_up = block.gate_up.matmul_on(team, &h, tokens);
            add(
                &mut x,
                &block
                    .down
                    .matmul_on(team, &decoder::swiglu(&gate_up, c.ffn), tokens),
            );
        }
        let mut last = Vec::with_capacity(segments.len() * hidden);
        let mut end = 0;
        for s in segments.iter() {
            end += s.tokens.len();
            last.extend_from_slice(&x[(end - 1) * hidden..end * hidden]);
        }
        Ok(last)
    }

    /// The blocks in candle ops: `x` is the step's embeddings, `[tokens,
    /// hidden]`; returns the hidden state of every token. Writes the new
    /// keys and values into the caches (their `len` is advanced by the
    /// caller).
    fn candle_layers(
        &self,
        blocks: &[Block],
        cos_table: &Tensor,
        sin_table: &Tensor,
        segments: &mut [Segment],
        mut x: Tensor,
    ) -> Result<Tensor, ModelError> {
        let c = &self.config;
        let eps = c.rms_eps as f32;
        let scale = 1.0 / (c.head_dim as f64).sqrt();
        let group = c.heads / c.kv_heads;
        for (layer, block) in blocks.iter().enumerate() {
            let h = candle_nn::ops::rms_norm(&x, &block.attn_norm, eps)?;
            let q = block.q.forward(&h)?;
            let k = block.k.forward(&h)?;
            let v = block.v.forward(&h)?;
            let mut contexts = Vec::with_capacity(segments.len());
            let mut offset = 0;
            for s in segments.iter_mut() {
                let n = s.tokens.len();
                let start = s.cache.len;
                let heads = |t: &Tensor, count: usize| -> candle_core::Result<Tensor> {
                    t.narrow(0, offset, n)?
                        .reshape((n, count, c.head_dim))?
                        .transpose(0, 1)?
                        .contiguous()
                };
                let cos = cos_table.narrow(0, start, n)?;
                let sin = sin_table.narrow(0, start, n)?;
                let rope = |t: Tensor| -> candle_core::Result<Tensor> {
                    candle_nn::rotary_emb::rope_i(&t.unsqueeze(0)?, &cos, &sin)?.squeeze(0)
                };
                let qs = rope(heads(&q, c.heads)?)?;
                let ks = rope(heads(&k, c.kv_heads)?)?;
                let vs = heads(&v, c.kv_heads)?;
                let KvLayers::Tensors(caches) = &s.cache.layers else {
                    return Err(ModelError::Failed(
                        "a KV cache made for the host step in the candle step".into(),
                    ));
                };
                let (k_cache, v_cache) = &caches[layer];
                k_cache.slice_set(&ks, 1, start)?;
                v_cache.slice_set(&vs, 1, start)?;
                let len = start + n;
                let keys = k_cache.narrow(1, 0, len)?;
                let values = v_cache.narrow(1, 0, len)?;
                // The query heads that share a KV head, side by side:
                // [kv_heads, group * n, head_dim].
                let qg = qs.reshape((c.kv_heads, group * n, c.head_dim))?;
                let mut scores = (qg.matmul(&keys.t()?)? * scale)?;
                if n > 1 {
                    scores = scores.broadcast_add(&causal_mask(group, n, start, &self.device)?)?;
                }
                let weights = candle_nn::ops::softmax_last_dim(&scores)?;
                let ctx = weights
                    .matmul(&values.contiguous()?)?
                    .reshape((c.heads, n, c.head_dim))?
                    .transpose(0, 1)?
                    .reshape((n, c.heads * c.head_dim))?;
                contexts.push(ctx);
                offset += n;
            }
            let attn = Tensor::cat(&contexts, 0)?;
            x = (x + block.o.forward(&attn)?)?;
            let h = candle_nn::ops::rms_norm(&x, &block.ffn_norm, eps)?;
            let mlp = (candle_nn::ops::silu(&block.gate.forward(&h)?)? * block.up.forward(&h)?)?;
            x = (x + block.down.forward(&mlp)?)?;
        }
        Ok(x)
    }
}

fn candle_cache_in_host_step() -> ModelError {
    ModelError::Failed("a KV cache made for the candle step in the host step".into())
}

/// `x += y`, elementwise (the residual connections).
fn add(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

/// 0 where query `i` (of `n`, at position `start + i`, repeated for each of
/// `group` heads) may see key `j`, minus infinity where `j` is in its future.
fn causal_mask(
    group: usize,
    n: usize,
    start: usize,
    device: &Device,
) -> candle_core::Result<Tensor> {
    let len = start + n;
    let mask: Vec<f32> = (0..group * n)
        .flat_map(|row| {
            let pos = start + row % n;
            (0..len).map(move |j| if j <= pos { 0.0 } else { f32::NEG_INFINITY })
        })
        .collect();
    Tensor::from_vec(mask, (group * n, len), device)
}

/// cos and sin of every position's rotation angles, `[context, head_dim / 2]`.
fn rope_tables(c: &LlamaConfig, device: &Device) -> candle_core::Result<(Tensor, Tensor)> {
    let half = c.head_dim / 2;
    let inv_freq: Vec<f32> = (0..half)
        .map(|i| 1.0 / c.rope_base.powf(2.0 * i as f32 / c.head_dim as f32))
        .collect();
    let inv_freq = Tensor::from_vec(inv_freq, (1, half), device)?;
    let positions = Tensor::arange(0u32, c.context_length as u32, device)?
        .to_dtype(DType::F32)?
        .reshape((c.context_length, 1))?;
    let angles = positions.broadcast_mul(&inv_freq)?;
    Ok((angles.cos()?, angles.sin()?))
}

/// Index of the largest logit (greedy decoding).
pub fn argmax(logits: &Tensor) -> Result<u32, ModelError> {
    Ok(logits.argmax(D::Minus1)?.to_scalar::<u32>()?)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use candle_core::{Device, Tensor};

    use super::*;

    /// Other quantizations and rows that are not whole blocks stay with
    /// candle's matmul.
    #[test]
    fn other_types_and_ragged_rows_are_left_to_candle() {
        let values = |n: usize| {
            (0..n)
                .map(|i| (i % 17) as f32 / 8.0 - 1.0)
                .collect::<Vec<_>>()
        };
        let t = Tensor::from_vec(values(4 * 64), (4, 64), &Device::Cpu).unwrap();
        let q4k = QTensor::quantize(
            &Tensor::from_vec(values(4 * 256), (4, 256), &Device::Cpu).unwrap(),
            GgmlDType::Q4K,
        )
        .unwrap();
        assert!(packed(&q4k).is_none());
        assert!(packed(&QTensor::quantize(&t, GgmlDType::F32).unwrap()).is_none());
        assert!(packed(&QTensor::quantize(&t, GgmlDType::Q8_0).unwrap()).is_some());
        assert!(packed(&QTensor::quantize(&t, GgmlDType::Q4_1).unwrap()).is_some());
    }
}
