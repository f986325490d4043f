//! Stands in for `x86_avx512.rs` on other architectures: the token has no
//! value, so the kernels take another level.

use crate::encoder::{Heads, PackedLinear};

/// Never made: no AVX-512 here.
#[derive(Clone, Copy, Debug)]
pub enum Avx512 {}

impl Avx512 {
    pub fn get() -> Option<Avx512> {
        None
    }

    pub fn linear(self, _: &PackedLinear, _: &[f32], _: &mut [f32]) {
        match self {}
    }

    pub fn attend(self, _: &[f32], _: usize, _: Heads, _: &mut [f32]) {
        match self {}
    }

    pub fn gelu(self, _: &mut [f32]) {
        match self {}
    }

    pub fn fma_peak(self, _: usize) -> f32 {
        match self {}
    }
}
