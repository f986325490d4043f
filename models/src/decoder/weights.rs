//! A decoder's weights read from its GGUF: which tensors a family has (any
//! other tensor is refused by name, as llama.cpp refuses a file with tensors
//! it would not use), each matrix in the form the steps multiply by, and the
//! embedding table kept as stored, its rows dequantized as they are looked
//! up (Gemma 3's 262k x 640 table would be 670 MB in f32).
//!
//! On a CPU with the kernels (`qmatmul::available`) a matrix is held in
//! their packing: as stored where the packing takes the format as it is
//! (Q4_0, Q4_1, Q4_K in the 4-bit packing; Q5_0, Q8_0 in the 8-bit one),
//! requantized to Q8_0 otherwise (F32, F16, BF16, Q5_1, Q2_K, Q3_K, Q5_K,
//! Q6_K: logged, with the time it took). Elsewhere candle's quantized
//! product takes every format.

use std::collections::BTreeSet;
use std::io::{Read, Seek};

use candle_core::quantized::gguf_file::Content;
use candle_core::quantized::{GgmlDType, QMatMul, QTensor, ggml_file};
use candle_core::{DType, Device, Module, Tensor};

use super::config::{Architecture, DecoderConfig};
use crate::ModelError;
use crate::qmatmul::{self, PackedMatrix, StoredBlocks};

/// How the weight matrices are held in memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WeightFormat {
    /// As stored where the host step's packing takes the format (4-bit
    /// Q4_0 / Q4_1 / Q4_K, 8-bit Q5_0 / Q8_0), else Q8_0 — or all Q8_0 —
    /// whichever a measurement at load finds faster on this machine for
    /// this model (logged); Q8_0 must win by 10%. Only 4-bit matrices
    /// differ between the two, and so may the answers: a fleet of unlike
    /// machines may choose unlike formats, so it is not the default.
    Auto,
    /// As stored where the host step's packing takes the format, else Q8_0:
    /// the least memory, on the host step the fewest bytes read per token,
    /// and the same answers on every machine and at every start (the
    /// default).
    #[default]
    AsStored,
    /// Every matrix requantized to Q8_0 at load: about 1.7x the memory of
    /// 4-bit weights; more arithmetic per byte saved, so often the faster
    /// prompts and batched decoding.
    Q8_0,
    /// Dense f32, stored transposed so a step is one matrix-matrix product
    /// (always the candle step): about 7x the memory of 4-bit weights.
    F32,
}

impl std::str::FromStr for WeightFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(WeightFormat::Auto),
            "as-stored" => Ok(WeightFormat::AsStored),
            "q8_0" => Ok(WeightFormat::Q8_0),
            "f32" => Ok(WeightFormat::F32),
            other => Err(format!(
                "unknown weight format {other:?} (auto, as-stored, q8_0, f32)"
            )),
        }
    }
}

impl WeightFormat {
    pub fn name(self) -> &'static str {
        match self {
            WeightFormat::Auto => "auto",
            WeightFormat::AsStored => "as-stored",
            WeightFormat::Q8_0 => "q8_0",
            WeightFormat::F32 => "f32",
        }
    }
}

/// A weight matrix as the forward multiplies by it.
pub(crate) enum Linear {
    /// Blocks in the kernels' packing: each weight block read once per step
    /// for all of its tokens.
    Packed(PackedMatrix),
    /// Quantized blocks in candle (other CPUs, CUDA).
    Quantized(QMatMul),
    /// Dense f32, `[in, out]`.
    Dense(Tensor),
}

/// The stored format the kernels' packing takes as it is.
fn stored_blocks(dtype: GgmlDType) -> Option<StoredBlocks> {
    Some(match dtype {
        GgmlDType::Q4_0 => StoredBlocks::Q4_0,
        GgmlDType::Q4_1 => StoredBlocks::Q4_1,
        GgmlDType::Q4K => StoredBlocks::Q4K,
        GgmlDType::Q5_0 => StoredBlocks::Q5_0,
        GgmlDType::Q8_0 => StoredBlocks::Q8_0,
        _ => None?,
    })
}

/// What loading requantized, for the log.
#[derive(Default, Debug)]
pub(crate) struct Requantized {
    pub(crate) matrices: usize,
    pub(crate) from: BTreeSet<String>,
    pub(crate) secs: f64,
}

impl Linear {
    /// `q` held as `format` says (see the module's text); `packing`: the
    /// kernels run here.
    pub(crate) fn new(
        q: QTensor,
        format: WeightFormat,
        device: &Device,
        packing: bool,
        requantized: &mut Requantized,
    ) -> Result<Linear, ModelError> {
        if format == WeightFormat::F32 {
            return Ok(Linear::Dense(q.dequantize(device)?.t()?.contiguous()?));
        }
        let keep = match format {
            WeightFormat::Q8_0 => matches!(q.dtype(), GgmlDType::Q8_0 | GgmlDType::Q5_0),
            _ => true,
        };
        if packing {
            let (rows, cols) = q.shape().dims2()?;
            if keep
                && let Some(kind) = stored_blocks(q.dtype())
                && let Some(p) = PackedMatrix::from_stored(kind, rows, cols, &q.data()?)
            {
                return Ok(Linear::Packed(p));
            }
            let q8 = requantize(&q, device, requantized)?;
            if let Some(p) = PackedMatrix::from_stored(StoredBlocks::Q8_0, rows, cols, &q8.data()?)
            {
                return Ok(Linear::Packed(p));
            }
            // Rows that are not whole blocks: candle's product.
            return Ok(Linear::Quantized(QMatMul::from_qtensor(q8)?));
        }
        match format {
            WeightFormat::Q8_0 if q.dtype() != GgmlDType::Q8_0 => Ok(Linear::Quantized(
                QMatMul::from_qtensor(requantize(&q, device, requantized)?)?,
            )),
            _ => Ok(Linear::Quantized(QMatMul::from_qtensor(q)?)),
        }
    }

    pub(crate) fn packed(&self) -> Option<&PackedMatrix> {
        match self {
            Linear::Packed(p) => Some(p),
            _ => None,
        }
    }

    pub(crate) fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
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

fn requantize(
    q: &QTensor,
    device: &Device,
    requantized: &mut Requantized,
) -> Result<QTensor, ModelError> {
    let start = std::time::Instant::now();
    let dense = q.dequantize(device)?;
    let q8 = QTensor::quantize(&dense, GgmlDType::Q8_0)?;
    requantized.matrices += 1;
    requantized.from.insert(format!("{:?}", q.dtype()));
    requantized.secs += start.elapsed().as_secs_f64();
    Ok(q8)
}

/// One block's weights. Norms and biases are dense f32 vectors.
pub(crate) struct Block {
    pub(crate) attn_norm: Tensor,
    pub(crate) q: Linear,
    pub(crate) k: Linear,
    pub(crate) v: Linear,
    pub(crate) o: Linear,
    /// Qwen 2's (and any family's optional) biases on Q, K, V and the
    /// attention output.
    pub(crate) q_bias: Option<Tensor>,
    pub(crate) k_bias: Option<Tensor>,
    pub(crate) v_bias: Option<Tensor>,
    pub(crate) o_bias: Option<Tensor>,
    /// Qwen 3's and Gemma 3's RMS norm over each head of Q and K.
    pub(crate) q_norm: Option<Tensor>,
    pub(crate) k_norm: Option<Tensor>,
    /// Gemma's norm of the attention's output before the residual.
    pub(crate) attn_post_norm: Option<Tensor>,
    pub(crate) ffn_norm: Tensor,
    pub(crate) gate: Linear,
    pub(crate) up: Linear,
    pub(crate) down: Linear,
    /// Gemma's norm of the MLP's output before the residual.
    pub(crate) ffn_post_norm: Option<Tensor>,
}

/// The embedding table as stored: each looked-up row dequantized.
pub(crate) struct Embeddings {
    dtype: GgmlDType,
    row_bytes: usize,
    data: Vec<u8>,
    hidden: usize,
}

impl Embeddings {
    pub(crate) fn new(q: &QTensor) -> Result<Embeddings, ModelError> {
        let (rows, hidden) = q.shape().dims2()?;
        let data = q.data()?.into_owned();
        Ok(Embeddings {
            dtype: q.dtype(),
            row_bytes: data.len() / rows.max(1),
            data,
            hidden,
        })
    }

    /// The rows of `ids`, `[ids, hidden]`, f32.
    pub(crate) fn rows(&self, ids: &[u32]) -> Result<Vec<f32>, ModelError> {
        let mut out = Vec::with_capacity(ids.len() * self.hidden);
        for &id in ids {
            let at = id as usize * self.row_bytes;
            let bytes = self.data.get(at..at + self.row_bytes).ok_or_else(|| {
                ModelError::Failed(format!("token id {id} is outside the embedding table"))
            })?;
            let row =
                ggml_file::qtensor_from_ggml(self.dtype, bytes, vec![self.hidden], &Device::Cpu)?;
            out.extend(row.dequantize(&Device::Cpu)?.to_vec1::<f32>()?);
        }
        Ok(out)
    }
}

/// Every tensor a family's GGUF may hold; any other is refused.
fn expected_tensors(config: &DecoderConfig) -> (BTreeSet<String>, BTreeSet<String>) {
    let arch = config.architecture;
    let mut required: BTreeSet<String> = ["token_embd.weight", "output_norm.weight"]
        .map(String::from)
        .into();
    let mut optional: BTreeSet<String> = ["output.weight", "output.bias", "rope_freqs.weight"]
        .map(String::from)
        .into();
    let qk_norm = matches!(arch, Architecture::Qwen3 | Architecture::Gemma3);
    let post_norms = matches!(arch, Architecture::Gemma2 | Architecture::Gemma3);
    for i in 0..config.layers {
        let mut need = vec![
            "attn_norm.weight",
            "attn_q.weight",
            "attn_k.weight",
            "attn_v.weight",
            "attn_output.weight",
            "ffn_norm.weight",
            "ffn_gate.weight",
            "ffn_up.weight",
            "ffn_down.weight",
        ];
        if qk_norm {
            need.extend(["attn_q_norm.weight", "attn_k_norm.weight"]);
        }
        if post_norms {
            need.extend(["post_attention_norm.weight", "post_ffw_norm.weight"]);
        }
        required.extend(need.iter().map(|n| format!("blk.{i}.{n}")));
        optional.extend(
            [
                "attn_q.bias",
                "attn_k.bias",
                "attn_v.bias",
                "attn_output.bias",
            ]
            .iter()
            .map(|n| format!("blk.{i}.{n}")),
        );
    }
    (required, optional)
}

/// Refuses a file with a tensor its family does not have (a fused QKV, a
/// mixture of experts, biases on the MLP, ...) or without one it needs.
pub(crate) fn check_tensors(content: &Content, config: &DecoderConfig) -> Result<(), String> {
    let (required, optional) = expected_tensors(config);
    let arch = config.architecture.name();
    if let Some(missing) = required
        .iter()
        .find(|n| !content.tensor_infos.contains_key(*n))
    {
        return Err(format!(
            "the GGUF has no tensor {missing}, which a {arch} model needs"
        ));
    }
    let mut unknown: Vec<&String> = content
        .tensor_infos
        .keys()
        .filter(|n| !required.contains(*n) && !optional.contains(*n))
        .collect();
    unknown.sort();
    if let Some(first) = unknown.first() {
        return Err(format!(
            "the GGUF holds tensor {first}{}, which sluice's {arch} does not run (a part of another architecture: a fused QKV, experts, MLP biases, ...); refusing rather than answering without it",
            if unknown.len() > 1 {
                format!(" and {} more", unknown.len() - 1)
            } else {
                String::new()
            }
        ));
    }
    Ok(())
}

/// Reads named tensors of a GGUF.
pub(crate) struct TensorReader<'a, R> {
    pub(crate) content: &'a Content,
    pub(crate) file: &'a mut R,
    pub(crate) device: &'a Device,
}

impl<R: Read + Seek> TensorReader<'_, R> {
    pub(crate) fn get(&mut self, name: &str) -> Result<QTensor, ModelError> {
        self.content
            .tensor(self.file, name, self.device)
            .map_err(|e| ModelError::Failed(format!("tensor {name}: {e}")))
    }

    pub(crate) fn has(&self, name: &str) -> bool {
        self.content.tensor_infos.contains_key(name)
    }

    /// A dense f32 vector (norm, bias), if the file has it.
    pub(crate) fn vector(&mut self, name: &str) -> Result<Option<Tensor>, ModelError> {
        if !self.has(name) {
            return Ok(None);
        }
        Ok(Some(
            self.get(name)?
                .dequantize(self.device)?
                .to_dtype(DType::F32)?,
        ))
    }

    pub(crate) fn required_vector(&mut self, name: &str) -> Result<Tensor, ModelError> {
        self.vector(name)?
            .ok_or_else(|| ModelError::Failed(format!("the GGUF has no tensor {name}")))
    }

    /// Block `i`'s weights, matrices held as `format` says.
    pub(crate) fn block(
        &mut self,
        i: usize,
        format: WeightFormat,
        packing: bool,
        requantized: &mut Requantized,
    ) -> Result<Block, ModelError> {
        let device = self.device.clone();
        let mut matrix = |this: &mut Self, part: &str| -> Result<Linear, ModelError> {
            let q = this.get(&format!("blk.{i}.{part}.weight"))?;
            Linear::new(q, format, &device, packing, requantized)
        };
        Ok(Block {
            attn_norm: self.required_vector(&format!("blk.{i}.attn_norm.weight"))?,
            q: matrix(self, "attn_q")?,
            k: matrix(self, "attn_k")?,
            v: matrix(self, "attn_v")?,
            o: matrix(self, "attn_output")?,
            q_bias: self.vector(&format!("blk.{i}.attn_q.bias"))?,
            k_bias: self.vector(&format!("blk.{i}.attn_k.bias"))?,
            v_bias: self.vector(&format!("blk.{i}.attn_v.bias"))?,
            o_bias: self.vector(&format!("blk.{i}.attn_output.bias"))?,
            q_norm: self.vector(&format!("blk.{i}.attn_q_norm.weight"))?,
            k_norm: self.vector(&format!("blk.{i}.attn_k_norm.weight"))?,
            attn_post_norm: self.vector(&format!("blk.{i}.post_attention_norm.weight"))?,
            ffn_norm: self.required_vector(&format!("blk.{i}.ffn_norm.weight"))?,
            gate: matrix(self, "ffn_gate")?,
            up: matrix(self, "ffn_up")?,
            down: matrix(self, "ffn_down")?,
            ffn_post_norm: self.vector(&format!("blk.{i}.post_ffw_norm.weight"))?,
        })
    }
}

/// Whether the kernels' packing runs here (a CPU with them).
pub(crate) fn packing_runs(device: &Device) -> bool {
    device.is_cpu() && qmatmul::available()
}
