//! sluice's CPU kernels, apart from the models that use them (`sluice-models`'
//! `encoder/packed.rs` and `decoder/`).
//!
//! - `cpu`: the instruction-set level, chosen once per process at run time
//!   (`SLUICE_CPU_KERNELS` may lower it, never raise it).
//! - `encoder`: the packed f32 matrix product, attention and GELU of the
//!   BERT encoder, with their plain-Rust references.
//! - `decoder`: the f32 pieces of a llama step between its matrix products
//!   (RMS norm, rotary embeddings, causal attention against KV caches,
//!   SwiGLU), in plain Rust but for each attention head's vector kernel.
//! - `quantized`: batched matrix products over Q4_1 / Q8_0 blocks, with
//!   their plain-Rust reference; `ggml_blocks` reads the GGUF formats they
//!   take without loss (Q4_0, Q4_1, Q4_K into the 4-bit packing; Q5_0,
//!   Q8_0 into the 8-bit one).
//! - `team`: the threads the generation step's parallel regions run on
//!   (spinning between regions instead of sleeping).
//! - `layout` and `scalar`: leaves every other module may import: the
//!   packed layouts and shapes the kernels take (`LinearPanels`,
//!   `PackedMatrix`, `QuantizedRows`, `Heads`, `Span`) and the scalar
//!   arithmetic the references and the bodies share (GELU's erf). The
//!   per-level files import them, never the dispatch in `encoder` or
//!   `quantized`, so no module imports another that imports it back.
//! - `simd`, `f32_kernels` and `quantized_kernels`: the vector operations
//!   the kernels are written over (`Simd` for f32, `Int8Simd` for 8-bit
//!   blocks), and the kernels' bodies, written once for every level.
//! - `x86_avx2` and `x86_avx512`: each level's vector operations (f32 and
//!   8-bit) and the `#[target_feature]` functions that compile the generic
//!   bodies for it, reached through a token that proves the level was
//!   detected. On other architectures `no_avx2.rs` and `no_avx512.rs`
//!   stand in: their tokens never exist.
//! - `x86_amx`: the bf16 linear layer on AMX tiles (inline assembly: Rust
//!   has no stable AMX intrinsics), where the CPU has them and Linux grants
//!   the tile state; `no_amx.rs` stands in elsewhere. With the three files
//!   above and `team`'s job hand-off, the crate's only unsafe code.
//!
//! Every kernel is tested against its reference at each level the machine
//! offers (`scripts/test` reruns the model tests at `portable`).

pub mod cpu;
pub mod decoder;
pub mod encoder;
mod f32_kernels;
mod ggml_blocks;
mod layout;
pub mod quantized;
mod quantized_kernels;
mod scalar;
mod simd;
pub mod team;
#[cfg(test)]
mod test_values;

#[cfg(target_arch = "x86_64")]
pub mod x86_amx;
#[cfg(target_arch = "x86_64")]
pub mod x86_avx2;
#[cfg(target_arch = "x86_64")]
pub mod x86_avx512;

#[cfg(not(target_arch = "x86_64"))]
#[path = "no_amx.rs"]
pub mod x86_amx;
#[cfg(not(target_arch = "x86_64"))]
#[path = "no_avx2.rs"]
pub mod x86_avx2;
#[cfg(not(target_arch = "x86_64"))]
#[path = "no_avx512.rs"]
pub mod x86_avx512;
