//! Stands in for `x86_amx.rs` on other architectures: the token has no
//! value, so the bf16 layers never run on tiles.

use crate::layout::LinearPanels;

/// Never made: no AMX here.
#[derive(Clone, Copy, Debug)]
pub enum AmxBf16 {}

impl AmxBf16 {
    pub const INPUT_STEP: usize = 32;

    pub fn get() -> Option<AmxBf16> {
        None
    }

    pub fn avx512(self) -> crate::x86_avx512::Avx512Bf16 {
        match self {}
    }

    pub fn linear(self, _: &LinearPanels, _: &[f32], _: &mut [f32], _: crate::layout::Activation) {
        match self {}
    }
}
