//! The vision towers of CLIP and SigLIP on sluice's packed CPU kernels:
//! an image's pixel values (`preprocess.rs`) to its embedding, as
//! transformers' `get_image_features` gives it (`models/tests/vision_towers.rs`
//! holds both families, two shapes each, to it).
//!
//! Both cut the image into patches (the patch convolution as one product
//! over the unfolded patches), add learned positions and run pre-norm
//! transformer blocks (Q, K and V in one product; attention without a score
//! tensor, each image its own span). They differ in what they add and how
//! they pool:
//!
//! | | CLIP | SigLIP |
//! | --- | --- | --- |
//! | tokens | a class token, then the patches | the patches |
//! | before the blocks | `pre_layrnorm` | - |
//! | pooled | `post_layernorm` of the class token | `post_layernorm` of every token, then an attention-pooling head (one learned query) |
//! | embedding | `visual_projection` of the pooled (no bias) | the pooled |
//!
//! A config this does not run as transformers would (another activation,
//! another number of channels, SigLIP without its head) is refused at load
//! with what it named.

use std::path::Path;

use candle_core::{DType, Device};
use candle_nn::VarBuilder;
use serde::Deserialize;

use crate::LoadError;
use crate::encoder_kernels::{self as kernels, Activation, Heads, PackedLinear, Span};
use crate::packed_layers::{Norm, add, linear, stacked, values};
use sluice_kernels::decoder::{Gate, gate_scalar};

/// Which family a directory holds (its `model_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    Clip,
    Siglip,
}

/// The hidden activation of the blocks' MLPs (`hidden_act`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HiddenAct {
    /// `x * sigmoid(1.702 x)`: OpenAI's CLIP.
    QuickGelu,
    /// The erf GELU (`gelu`).
    Gelu,
    /// The tanh approximation (`gelu_pytorch_tanh`): SigLIP.
    GeluTanh,
}

impl HiddenAct {
    fn named(name: &str) -> Option<HiddenAct> {
        match name {
            "quick_gelu" => Some(HiddenAct::QuickGelu),
            "gelu" => Some(HiddenAct::Gelu),
            "gelu_pytorch_tanh" | "gelu_new" => Some(HiddenAct::GeluTanh),
            _ => None,
        }
    }

    /// `fc.forward` with this activation after it (the kernels apply the
    /// erf GELU on their tiles; the others on the product).
    fn forward(self, fc: &PackedLinear, x: &[f32], rows: usize, out: &mut Vec<f32>) {
        match self {
            HiddenAct::Gelu => fc.forward_into(x, rows, out, Activation::Gelu),
            HiddenAct::QuickGelu => {
                fc.forward_into(x, rows, out, Activation::None);
                for v in out.iter_mut() {
                    *v *= 1.0 / (1.0 + (-1.702 * *v).exp());
                }
            }
            HiddenAct::GeluTanh => {
                fc.forward_into(x, rows, out, Activation::None);
                for v in out.iter_mut() {
                    *v = gate_scalar(Gate::GeluTanh, *v);
                }
            }
        }
    }
}

/// The vision part of `config.json` (`vision_config` of a CLIP or SigLIP
/// model; the whole file of a vision-only one).
#[derive(Debug, Clone, Deserialize)]
pub struct VisionConfig {
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub patch_size: usize,
    pub image_size: usize,
    #[serde(default = "three")]
    pub num_channels: usize,
    pub hidden_act: String,
    #[serde(default)]
    pub layer_norm_eps: Option<f64>,
    /// SigLIP's attention-pooling head (transformers' default: on).
    #[serde(default)]
    pub vision_use_head: Option<bool>,
}

fn three() -> usize {
    3
}

#[derive(Deserialize)]
struct ConfigFile {
    model_type: String,
    #[serde(default)]
    vision_config: Option<VisionConfig>,
}

/// The family and vision config `dir/config.json` names, or why it names
/// none this runs.
pub fn read_config(dir: &Path) -> Result<(Family, VisionConfig), LoadError> {
    let path = dir.join("config.json");
    let text = std::fs::read_to_string(&path).map_err(|source| LoadError::Read {
        path: path.clone(),
        source,
    })?;
    let not_vision = |e: serde_json::Error| {
        LoadError::Unsupported(format!(
            "{} is not a CLIP or SigLIP config: {e}",
            path.display()
        ))
    };
    let file: ConfigFile = serde_json::from_str(&text).map_err(not_vision)?;
    let family = match file.model_type.as_str() {
        "clip" | "clip_vision_model" => Family::Clip,
        "siglip" | "siglip_vision_model" => Family::Siglip,
        other => {
            return Err(LoadError::Unsupported(format!(
                "{} names model_type {other:?}; sluice's vision towers run clip, clip_vision_model, siglip and siglip_vision_model",
                path.display()
            )));
        }
    };
    let config = match file.vision_config {
        Some(config) => config,
        None => serde_json::from_str(&text).map_err(not_vision)?,
    };
    Ok((family, config))
}

struct Block {
    norm1: Norm,
    /// Queries, keys and values (each with its bias): `d -> 3d`.
    qkv: PackedLinear,
    attn_out: PackedLinear,
    norm2: Norm,
    fc1: PackedLinear,
    fc2: PackedLinear,
}

/// SigLIP's pooling: one learned query attends over the image's tokens
/// (`nn.MultiheadAttention`), then a residual MLP.
struct AttentionPool {
    /// The probe's query, projected once at load: `[d]`.
    query: Vec<f32>,
    /// Keys and values of the tokens: `d -> 2d`.
    kv: PackedLinear,
    out: PackedLinear,
    norm: Norm,
    fc1: PackedLinear,
    fc2: PackedLinear,
}

enum Pooling {
    /// CLIP: the class token, normed, projected.
    ClassToken {
        norm: Norm,
        projection: PackedLinear,
    },
    /// SigLIP: every token normed, then the head.
    Attention {
        norm: Norm,
        head: Box<AttentionPool>,
    },
}

/// A CLIP or SigLIP vision tower, loaded for the packed kernels.
pub struct VisionTower {
    family: Family,
    config: VisionConfig,
    act: HiddenAct,
    heads: Heads,
    patch: PackedLinear,
    class: Option<Vec<f32>>,
    /// `[tokens, d]`.
    positions: Vec<f32>,
    pre_norm: Option<Norm>,
    blocks: Vec<Block>,
    pooling: Pooling,
    dim: usize,
}

impl VisionTower {
    /// From `dir`'s `config.json` and `model.safetensors` (f32, f16 or
    /// bf16; run in f32).
    pub fn load(dir: &Path) -> Result<VisionTower, LoadError> {
        let (family, config) = read_config(dir)?;
        let path = dir.join("model.safetensors");
        let bytes = std::fs::read(&path).map_err(|source| LoadError::Read {
            path: path.clone(),
            source,
        })?;
        let vb = VarBuilder::from_buffered_safetensors(bytes, DType::F32, &Device::Cpu).map_err(
            |source| LoadError::Weights {
                path: path.clone(),
                source,
            },
        )?;
        VisionTower::build(&vb, family, config).map_err(|e| match e {
            Built::Unsupported(why) => LoadError::Unsupported(format!("{}: {why}", dir.display())),
            Built::Weights(source) => LoadError::Weights { path, source },
        })
    }

    fn build(vb: &VarBuilder, family: Family, config: VisionConfig) -> Result<VisionTower, Built> {
        let c = &config;
        let act = HiddenAct::named(&c.hidden_act).ok_or_else(|| {
            Built::Unsupported(format!(
                "hidden_act {:?} is not one sluice runs (quick_gelu, gelu, gelu_pytorch_tanh)",
                c.hidden_act
            ))
        })?;
        if c.num_channels != 3 {
            return Err(Built::Unsupported(format!(
                "num_channels {} (sluice's images are RGB: 3)",
                c.num_channels
            )));
        }
        if c.patch_size == 0 || !c.image_size.is_multiple_of(c.patch_size) {
            return Err(Built::Unsupported(format!(
                "image_size {} is not a multiple of patch_size {}",
                c.image_size, c.patch_size
            )));
        }
        if c.num_attention_heads == 0 || !c.hidden_size.is_multiple_of(c.num_attention_heads) {
            return Err(Built::Unsupported(format!(
                "hidden_size {} does not split into {} heads",
                c.hidden_size, c.num_attention_heads
            )));
        }
        if family == Family::Siglip && c.vision_use_head == Some(false) {
            return Err(Built::Unsupported(
                "vision_use_head false: SigLIP's embedding is its attention-pooling head's output"
                    .into(),
            ));
        }
        let eps = c.layer_norm_eps.unwrap_or(match family {
            Family::Clip => 1e-5,
            Family::Siglip => 1e-6,
        }) as f32;
        let (d, p) = (c.hidden_size, c.patch_size);
        let patches = (c.image_size / p).pow(2);
        let tokens = patches + usize::from(family == Family::Clip);
        let vm = vb.pp("vision_model");
        let emb = vm.pp("embeddings");
        let patch_weight = values(emb.get((d, 3, p, p), "patch_embedding.weight")?)?;
        let patch_bias = match family {
            Family::Clip => vec![0.0; d],
            Family::Siglip => values(emb.get(d, "patch_embedding.bias")?)?,
        };
        let patch = PackedLinear::new(&patch_weight, d, 3 * p * p, Some(&patch_bias));
        let class = match family {
            Family::Clip => Some(values(emb.get(d, "class_embedding")?)?),
            Family::Siglip => None,
        };
        let positions = values(emb.get((tokens, d), "position_embedding.weight")?)?;
        let pre_norm = match family {
            Family::Clip => Some(Norm::load(&vm, eps, "pre_layrnorm", d)?),
            Family::Siglip => None,
        };
        let encoder = vm.pp("encoder");
        let blocks = (0..c.num_hidden_layers)
            .map(|i| {
                let vb = encoder.pp(format!("layers.{i}"));
                let attn = vb.pp("self_attn");
                Ok(Block {
                    norm1: Norm::load(&vb, eps, "layer_norm1", d)?,
                    qkv: stacked(
                        &attn,
                        &[("q_proj", true), ("k_proj", true), ("v_proj", true)],
                        d,
                    )?,
                    attn_out: linear(&attn, "out_proj", d, d, true)?,
                    norm2: Norm::load(&vb, eps, "layer_norm2", d)?,
                    fc1: linear(&vb, "mlp.fc1", d, c.intermediate_size, true)?,
                    fc2: linear(&vb, "mlp.fc2", c.intermediate_size, d, true)?,
                })
            })
            .collect::<candle_core::Result<Vec<_>>>()?;
        let (pooling, dim) = match family {
            Family::Clip => {
                let projection = vb.get_unchecked("visual_projection.weight")?;
                let dim = projection.dims().first().copied().unwrap_or(0);
                (
                    Pooling::ClassToken {
                        norm: Norm::load(&vm, eps, "post_layernorm", d)?,
                        projection: linear(vb, "visual_projection", d, dim, false)?,
                    },
                    dim,
                )
            }
            Family::Siglip => {
                let head = vm.pp("head");
                let attention = head.pp("attention");
                let in_weight = values(attention.get((3 * d, d), "in_proj_weight")?)?;
                let in_bias = values(attention.get(3 * d, "in_proj_bias")?)?;
                let probe = values(head.get((1, 1, d), "probe")?)?;
                let query = (0..d)
                    .map(|o| {
                        let row = &in_weight[o * d..(o + 1) * d];
                        in_bias[o] + row.iter().zip(&probe).map(|(w, x)| w * x).sum::<f32>()
                    })
                    .collect();
                let kv = PackedLinear::new(&in_weight[d * d..], 2 * d, d, Some(&in_bias[d..]));
                (
                    Pooling::Attention {
                        norm: Norm::load(&vm, eps, "post_layernorm", d)?,
                        head: Box::new(AttentionPool {
                            query,
                            kv,
                            out: linear(&attention, "out_proj", d, d, true)?,
                            norm: Norm::load(&head, eps, "layernorm", d)?,
                            fc1: linear(&head, "mlp.fc1", d, c.intermediate_size, true)?,
                            fc2: linear(&head, "mlp.fc2", c.intermediate_size, d, true)?,
                        }),
                    },
                    d,
                )
            }
        };
        Ok(VisionTower {
            family,
            act,
            heads: Heads {
                heads: c.num_attention_heads,
                head_dim: d / c.num_attention_heads,
            },
            patch,
            class,
            positions,
            pre_norm,
            blocks,
            pooling,
            dim,
            config,
        })
    }

    pub fn family(&self) -> Family {
        self.family
    }

    pub fn config(&self) -> &VisionConfig {
        &self.config
    }

    /// The length of an embedding.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// The values one image's pixels take: 3 channels of `image_size`
    /// squared.
    pub fn pixels_per_image(&self) -> usize {
        3 * self.config.image_size * self.config.image_size
    }

    /// The embeddings of `images` images (`pixels`: each image's pixel
    /// values, channels first, one after another), `[images, dim]`: the
    /// images run together in each product, each attends only to itself.
    pub fn embed(&self, pixels: &[f32], images: usize) -> Vec<f32> {
        assert_eq!(
            pixels.len(),
            images * self.pixels_per_image(),
            "pixel values of {images} images of {} x {}",
            self.config.image_size,
            self.config.image_size
        );
        let d = self.config.hidden_size;
        let tokens = self.positions.len() / d;
        let rows = images * tokens;
        let mut x = self.tokens(pixels, images);
        if let Some(norm) = &self.pre_norm {
            norm.apply_in_place(&mut x);
        }
        let spans: Vec<Span> = (0..images)
            .map(|i| Span {
                start: i * tokens,
                len: tokens,
            })
            .collect();
        let (mut h, mut qkv, mut context, mut out, mut inner) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for block in &self.blocks {
            block.norm1.apply(&x, &mut h);
            block.qkv.forward_into(&h, rows, &mut qkv, Activation::None);
            kernels::attention_into(&qkv, &spans, self.heads, &mut context);
            block
                .attn_out
                .forward_into(&context, rows, &mut out, Activation::None);
            add(&mut x, &out);
            block.norm2.apply(&x, &mut h);
            self.act.forward(&block.fc1, &h, rows, &mut inner);
            block
                .fc2
                .forward_into(&inner, rows, &mut out, Activation::None);
            add(&mut x, &out);
        }
        match &self.pooling {
            Pooling::ClassToken { norm, projection } => {
                let mut class: Vec<f32> = x
                    .chunks_exact(tokens * d)
                    .flat_map(|t| &t[..d])
                    .copied()
                    .collect();
                norm.apply_in_place(&mut class);
                projection.forward_into(&class, images, &mut out, Activation::None);
                out
            }
            Pooling::Attention { norm, head } => {
                norm.apply_in_place(&mut x);
                self.attention_pool(head, &x, images, tokens)
            }
        }
    }

    /// The first tokens of `images` images: their patches (and CLIP's class
    /// token first) with the positions added, `[images * tokens, d]`.
    fn tokens(&self, pixels: &[f32], images: usize) -> Vec<f32> {
        let (d, p, side) = (
            self.config.hidden_size,
            self.config.patch_size,
            self.config.image_size,
        );
        let grid = side / p;
        let patches = grid * grid;
        // Row (image, gy, gx) holds channel, then row ky, then column kx
        // of its patch: the convolution weight's `[d, 3, p, p]` order.
        let mut unfolded = vec![0f32; images * patches * 3 * p * p];
        for (row_index, row) in unfolded.chunks_exact_mut(3 * p * p).enumerate() {
            let (image, patch) = (row_index / patches, row_index % patches);
            let (gy, gx) = (patch / grid, patch % grid);
            let base = &pixels[image * 3 * side * side..(image + 1) * 3 * side * side];
            for (c, channel) in row.chunks_exact_mut(p * p).enumerate() {
                for (ky, line) in channel.chunks_exact_mut(p).enumerate() {
                    let from = c * side * side + (gy * p + ky) * side + gx * p;
                    line.copy_from_slice(&base[from..from + p]);
                }
            }
        }
        let mut embedded = Vec::new();
        self.patch
            .forward_into(&unfolded, images * patches, &mut embedded, Activation::None);
        let tokens = self.positions.len() / d;
        let mut x = Vec::with_capacity(images * tokens * d);
        for image in embedded.chunks_exact(patches * d) {
            let start = x.len();
            if let Some(class) = &self.class {
                x.extend_from_slice(class);
            }
            x.extend_from_slice(image);
            add(&mut x[start..], &self.positions);
        }
        x
    }

    /// SigLIP's head over each image's normed tokens: one query attending
    /// over them, its output projected, then `+ mlp(norm(.))`.
    fn attention_pool(
        &self,
        head: &AttentionPool,
        x: &[f32],
        images: usize,
        tokens: usize,
    ) -> Vec<f32> {
        let d = self.config.hidden_size;
        let Heads { heads, head_dim } = self.heads;
        let scale = 1.0 / (head_dim as f32).sqrt();
        let mut kv = Vec::new();
        head.kv
            .forward_into(x, images * tokens, &mut kv, Activation::None);
        let mut pooled = vec![0f32; images * d];
        let mut scores = vec![0f32; tokens];
        for (image, out) in pooled.chunks_exact_mut(d).enumerate() {
            let kv = &kv[image * tokens * 2 * d..(image + 1) * tokens * 2 * d];
            for h in 0..heads {
                let q = &head.query[h * head_dim..(h + 1) * head_dim];
                for (t, s) in scores.iter_mut().enumerate() {
                    let k = &kv[t * 2 * d + h * head_dim..][..head_dim];
                    *s = scale * q.iter().zip(k).map(|(a, b)| a * b).sum::<f32>();
                }
                let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let mut total = 0.0;
                for s in scores.iter_mut() {
                    *s = (*s - max).exp();
                    total += *s;
                }
                let o = &mut out[h * head_dim..(h + 1) * head_dim];
                for (t, s) in scores.iter().enumerate() {
                    let v = &kv[t * 2 * d + d + h * head_dim..][..head_dim];
                    for (o, v) in o.iter_mut().zip(v) {
                        *o += s / total * v;
                    }
                }
            }
        }
        let mut attended = Vec::new();
        head.out
            .forward_into(&pooled, images, &mut attended, Activation::None);
        let mut h = Vec::new();
        head.norm.apply(&attended, &mut h);
        let (mut inner, mut mlp) = (Vec::new(), Vec::new());
        self.act.forward(&head.fc1, &h, images, &mut inner);
        head.fc2
            .forward_into(&inner, images, &mut mlp, Activation::None);
        add(&mut attended, &mlp);
        attended
    }
}

/// What building a tower from weights ran into.
enum Built {
    Unsupported(String),
    Weights(candle_core::Error),
}

impl From<candle_core::Error> for Built {
    fn from(e: candle_core::Error) -> Self {
        Built::Weights(e)
    }
}
