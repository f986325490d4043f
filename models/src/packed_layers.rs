//! The pieces a network on sluice's packed CPU kernels is loaded into from
//! a safetensors file (through candle's `VarBuilder`, which converts f16 and
//! bf16 to f32): layer norms, linear layers (one, or several of one input
//! width stacked into one product), and the residual add. Whisper's
//! forward (`whisper/packed.rs`) and the vision towers (`image/tower.rs`)
//! are built from them.

use candle_core::Tensor;
use candle_nn::VarBuilder;

use crate::encoder_kernels::{self as kernels, PackedLinear};

/// A tensor's values, flattened.
pub(crate) fn values(t: Tensor) -> candle_core::Result<Vec<f32>> {
    t.flatten_all()?.to_vec1::<f32>()
}

/// A layer norm with its weight, bias and epsilon.
pub(crate) struct Norm {
    weight: Vec<f32>,
    bias: Vec<f32>,
    eps: f32,
}

impl Norm {
    pub(crate) fn load(
        vb: &VarBuilder,
        eps: f32,
        name: &str,
        width: usize,
    ) -> candle_core::Result<Norm> {
        let vb = vb.pp(name);
        Ok(Norm {
            weight: values(vb.get(width, "weight")?)?,
            bias: values(vb.get(width, "bias")?)?,
            eps,
        })
    }

    /// `out = norm(x)` per row.
    pub(crate) fn apply(&self, x: &[f32], out: &mut Vec<f32>) {
        out.clear();
        out.extend_from_slice(x);
        self.apply_in_place(out);
    }

    /// `x = norm(x)` per row.
    pub(crate) fn apply_in_place(&self, x: &mut [f32]) {
        kernels::layer_norm(x, None, &self.weight, &self.bias, self.eps);
    }
}

/// A linear layer `name` (`outputs x inputs`), with its bias or zeros.
pub(crate) fn linear(
    vb: &VarBuilder,
    name: &str,
    inputs: usize,
    outputs: usize,
    bias: bool,
) -> candle_core::Result<PackedLinear> {
    let (w, b) = weight_and_bias(vb, name, inputs, outputs, bias)?;
    Ok(PackedLinear::new(&w, outputs, inputs, Some(&b)))
}

/// A linear layer's weight and its bias (zeros when it has none).
pub(crate) fn weight_and_bias(
    vb: &VarBuilder,
    name: &str,
    inputs: usize,
    outputs: usize,
    bias: bool,
) -> candle_core::Result<(Vec<f32>, Vec<f32>)> {
    let vb = vb.pp(name);
    let w = values(vb.get((outputs, inputs), "weight")?)?;
    let b = match bias {
        true => values(vb.get(outputs, "bias")?)?,
        false => vec![0.0; outputs],
    };
    Ok((w, b))
}

/// Linear layers `names` of one input width stacked into one product (their
/// outputs side by side, in order).
pub(crate) fn stacked(
    vb: &VarBuilder,
    names: &[(&str, bool)],
    width: usize,
) -> candle_core::Result<PackedLinear> {
    let (mut w, mut b) = (Vec::new(), Vec::new());
    for (name, bias) in names {
        let (wi, bi) = weight_and_bias(vb, name, width, width, *bias)?;
        w.extend(wi);
        b.extend(bi);
    }
    Ok(PackedLinear::new(&w, names.len() * width, width, Some(&b)))
}

/// `x += y`.
pub(crate) fn add(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}
