//! Stands in for `x86_avx512.rs` on other architectures: the token has no
//! value, so the kernels take another level.

use crate::layout::{Heads, LinearPanels};
use crate::layout::{PackedMatrix, QuantizedRows};
use crate::scalar::Gate;

/// Never made: no AVX-512 here.
#[derive(Clone, Copy, Debug)]
pub enum Avx512 {}

impl Avx512 {
    pub fn get() -> Option<Avx512> {
        None
    }

    pub fn linear(self, _: &LinearPanels, _: &[f32], _: &mut [f32]) {
        match self {}
    }

    pub fn linear_few(self, _: &LinearPanels, _: std::ops::Range<usize>, _: &[f32], _: &mut [f32]) {
        match self {}
    }

    pub fn attend(self, _: &[f32], _: usize, _: Heads, _: usize, _: &mut [f32]) {
        match self {}
    }

    pub fn gelu(self, _: &mut [f32]) {
        match self {}
    }

    pub fn layer_norm(self, _: &mut [f32], _: Option<&[f32]>, _: &[f32], _: &[f32], _: f32) {
        match self {}
    }

    pub fn gated(self, _: Gate, _: &[f32], _: &[f32], _: &mut [f32]) {
        match self {}
    }

    pub fn decode_attend(self, _: &[f32], _: &[f32], _: &[f32], _: &mut Vec<f32>, _: &mut [f32]) {
        match self {}
    }

    pub fn fma_peak(self, _: usize) -> f32 {
        match self {}
    }
}

/// Never made: no AVX-512 here.
#[derive(Clone, Copy, Debug)]
pub enum Avx512Bw {}

/// Never made: no AVX-512 here.
#[derive(Clone, Copy, Debug)]
pub enum Avx512Vnni {}

impl Avx512Bw {
    pub fn get() -> Option<Avx512Bw> {
        None
    }

    pub fn quantized_rows(
        self,
        _: &PackedMatrix,
        _: &QuantizedRows,
        _: usize,
        _: usize,
        _: &mut crate::team::Columns,
    ) {
        match self {}
    }
}

impl Avx512Vnni {
    pub fn get() -> Option<Avx512Vnni> {
        None
    }

    pub fn quantized_rows(
        self,
        _: &PackedMatrix,
        _: &QuantizedRows,
        _: usize,
        _: usize,
        _: &mut crate::team::Columns,
    ) {
        match self {}
    }
}

/// Never made: no AVX-512 here.
#[derive(Clone, Copy, Debug)]
pub enum Avx512Bf16 {}

impl Avx512Bf16 {
    pub fn get() -> Option<Avx512Bf16> {
        None
    }

    pub fn linear(self, _: &LinearPanels, _: &[f32], _: &mut [f32]) {
        match self {}
    }
}
