//! Scalar arithmetic the plain-Rust references and the vector bodies
//! share, so both compute the same approximation. A leaf.

/// Coefficients of erf's rational approximation (Abramowitz and Stegun
/// 7.1.26, absolute error below 1.5e-7).
pub(crate) const ERF_P: f32 = 0.327_591_1;
pub(crate) const ERF_A: [f32; 5] = [
    0.254_829_6,
    -0.284_496_74,
    1.421_413_7,
    -1.453_152_1,
    1.061_405_4,
];

/// The erf GELU with the approximation the SIMD kernel uses.
pub fn gelu_scalar(x: f32) -> f32 {
    let z = (x * std::f32::consts::FRAC_1_SQRT_2).abs();
    let t = 1.0 / (1.0 + ERF_P * z);
    let poly = ERF_A.iter().rev().fold(0f32, |acc, a| acc * t + a) * t;
    let erf = 1.0 - poly * (-z * z).exp();
    0.5 * x * (1.0 + erf.copysign(x))
}

/// `sqrt(2 / pi)`, tanh-GELU's constant.
pub(crate) const SQRT_2_OVER_PI: f32 = 0.797_884_6;

/// The activation of a gated MLP's gate (`act(gate) * up`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gate {
    /// `silu(g) = g / (1 + exp(-g))` (SwiGLU: Llama, Qwen).
    Silu,
    /// tanh's GELU approximation, `0.5 g (1 + tanh(sqrt(2 / pi) (g +
    /// 0.044715 g^3)))` (GeGLU: Gemma), computed as `g / (1 + exp(-2u))`.
    GeluTanh,
}

/// `act(g)` in plain Rust: the references' and the vector tails'.
pub fn gated(act: Gate, g: f32) -> f32 {
    let k = match act {
        Gate::Silu => g,
        Gate::GeluTanh => g * (2.0 * SQRT_2_OVER_PI + 2.0 * SQRT_2_OVER_PI * 0.044_715 * g * g),
    };
    g / (1.0 + (-k).exp())
}
