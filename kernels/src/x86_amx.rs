//! The bf16 linear layer on Intel AMX tiles (Sapphire Rapids and later),
//! for the CPUs that have them: `tdpbf16ps` multiplies a 16 x 32 bf16 tile
//! of activations by a 32 x 16 tile of weights into a 16 x 16 f32 tile, 16
//! times the work of one AVX-512 `vdpbf16ps`. The weights are the ones
//! `PackedLinear::new_bf16` packs for the AVX512_BF16 kernel (32-output
//! panels of input pairs), which are already the layout a weight tile reads:
//! each 16-output half of a panel is a tile with a row stride of 128 bytes.
//!
//! Rust 1.95 has no stable AMX intrinsics, so the tile instructions are
//! inline assembly naming the tile registers directly (the compiler never
//! allocates them itself). Linux hands a process the 8 KiB of tile state
//! only after it asks (`arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA)`);
//! [`AmxBf16::get`] asks once and reports no AMX if the kernel refuses.
//!
//! The blocking is the one Intel's guides use for 8 tile registers: 4
//! accumulators (32 rows x 32 outputs), 2 activation tiles, 2 weight tiles.
//! The accumulators start from the bias (a 16-float row loaded with a zero
//! stride), so a full tile is stored straight into the output. Each step
//! prefetches the next step's 2 KiB of weights into L1: the weights stream
//! from L2, and without it the tiles waited on them (+8% on the encoder).
//! A C copy of this loop ran 3.8 TFLOP/s on one core with every operand in
//! L1, 2.7 with the weights streaming, 1.8 with the stores as well.
#![allow(unsafe_code)]

use std::arch::asm;
use std::sync::OnceLock;

use crate::layout::{Activation, LinearPanels};
use crate::x86_avx512::Avx512Bf16;

/// Proof that this process runs the bf16 linear layers on AMX tiles: the
/// AVX512_BF16 level runs (its conversions are used here), the CPU reports
/// AMX-TILE and AMX-BF16, and Linux granted the tile state.
#[derive(Clone, Copy, Debug)]
pub struct AmxBf16(Avx512Bf16);

impl AmxBf16 {
    /// Some where the layers can run on tiles (see the type).
    pub fn get() -> Option<AmxBf16> {
        let bf16 = Avx512Bf16::get()?;
        static GRANTED: OnceLock<bool> = OnceLock::new();
        GRANTED
            .get_or_init(|| cpu_has_amx_bf16() && request_tile_state())
            .then_some(AmxBf16(bf16))
    }

    /// The AVX512_BF16 level this one extends.
    pub fn avx512(self) -> Avx512Bf16 {
        self.0
    }

    /// Inputs a layer needs for the tiles: a whole number of 32-input
    /// (one tile row of bf16) steps.
    pub const INPUT_STEP: usize = 32;

    /// `out = activation(x W^T + b)` for `x`'s rows, `W` packed as bf16
    /// pairs (`PackedLinear::new_bf16`) with a multiple of
    /// [`Self::INPUT_STEP`] inputs; the activation runs on each 32-row block
    /// of outputs as soon as it is done.
    pub fn linear(self, w: &LinearPanels, x: &[f32], out: &mut [f32], activation: Activation) {
        let (inputs, outputs) = (w.inputs, w.outputs);
        assert!(inputs.is_multiple_of(Self::INPUT_STEP), "inputs {inputs}");
        assert_eq!(w.nr, PANEL);
        assert_eq!(
            w.bf16_panels.len(),
            outputs.div_ceil(PANEL) * inputs / 2 * PANEL
        );
        assert_eq!(w.bias.len(), outputs.div_ceil(PANEL) * PANEL);
        let rows = x.len() / inputs;
        assert_eq!(x.len(), rows * inputs);
        assert_eq!(out.len(), rows * outputs);
        // Two tiles of rows, as bf16 pairs; rows past the input stay zero.
        let pairs = inputs / 2;
        let mut block = vec![0u32; BLOCK_ROWS * pairs];
        let mut spill = [0f32; TILE * TILE];
        let tiles = Tiles::configure();
        for r0 in (0..rows).step_by(BLOCK_ROWS) {
            let live = BLOCK_ROWS.min(rows - r0);
            for (r, dst) in block.chunks_exact_mut(pairs).enumerate() {
                if r < live {
                    let src = &x[(r0 + r) * inputs..(r0 + r + 1) * inputs];
                    self.0.to_pairs(src, dst);
                } else {
                    dst.fill(0);
                }
            }
            for panel in 0..outputs.div_ceil(PANEL) {
                let weights = &w.bf16_panels[panel * pairs * PANEL..(panel + 1) * pairs * PANEL];
                let bias = &w.bias[panel * PANEL..(panel + 1) * PANEL];
                tiles.block(&block, pairs, weights, bias);
                // Accumulator (i, j): rows r0 + 16 i, outputs of the panel's
                // half j.
                for (acc, (i, j)) in [(0, 0), (0, 1), (1, 0), (1, 1)].into_iter().enumerate() {
                    let row = r0 + i * TILE;
                    let col = panel * PANEL + j * TILE;
                    if row >= rows || col >= outputs {
                        continue;
                    }
                    let (n_rows, n_cols) = (TILE.min(rows - row), TILE.min(outputs - col));
                    let at = row * outputs + col;
                    if n_rows == TILE && n_cols == TILE {
                        tiles.store(acc, &mut out[at..at + (TILE - 1) * outputs + TILE], outputs);
                    } else {
                        tiles.store(acc, &mut spill, TILE);
                        for r in 0..n_rows {
                            out[at + r * outputs..at + r * outputs + n_cols]
                                .copy_from_slice(&spill[r * TILE..r * TILE + n_cols]);
                        }
                    }
                }
            }
            if activation == Activation::Gelu {
                // The AVX-512 level runs wherever the tiles do.
                self.0
                    .avx512()
                    .gelu(&mut out[r0 * outputs..(r0 + live) * outputs]);
            }
        }
    }
}

/// Rows (and f32 columns) of a full tile; a tile row is 64 bytes.
const TILE: usize = 16;
/// Rows a block of the product covers: two tiles.
const BLOCK_ROWS: usize = 2 * TILE;
/// Outputs of a weight panel (`PackedLinear::new_bf16`'s): two tiles.
const PANEL: usize = 2 * TILE;

/// CPUID leaf 7: AMX-BF16 is EDX bit 22, AMX-TILE bit 24.
fn cpu_has_amx_bf16() -> bool {
    // CPUID leaf 7 exists on every CPU with AVX-512 (the caller's
    // `Avx512Bf16`).
    let edx = std::arch::x86_64::__cpuid_count(7, 0).edx;
    edx & (1 << 22) != 0 && edx & (1 << 24) != 0
}

/// Asks Linux for the tile data state; false where it refuses (a kernel
/// before 5.16, or a hypervisor that hides it).
#[cfg(target_os = "linux")]
fn request_tile_state() -> bool {
    const ARCH_REQ_XCOMP_PERM: libc::c_ulong = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_ulong = 18;
    // SAFETY: arch_prctl with these arguments only changes which extended
    // states the process may use.
    unsafe {
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        ) == 0
    }
}

#[cfg(not(target_os = "linux"))]
fn request_tile_state() -> bool {
    false
}

/// The tile registers of this thread, configured as 8 full tiles (16 rows
/// of 64 bytes) for as long as the value lives: tmm0-3 the accumulators,
/// tmm4-5 the activations, tmm6-7 the weights. Dropping it releases them.
/// Not `Send`: the configuration belongs to the thread.
struct Tiles(std::marker::PhantomData<*const ()>);

#[repr(C, align(64))]
struct TileConfig {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    bytes_per_row: [u16; 16],
    rows: [u8; 16],
}

impl Tiles {
    fn configure() -> Tiles {
        let mut config = TileConfig {
            palette: 1,
            start_row: 0,
            reserved: [0; 14],
            bytes_per_row: [0; 16],
            rows: [0; 16],
        };
        for t in 0..8 {
            config.bytes_per_row[t] = 64;
            config.rows[t] = TILE as u8;
        }
        // SAFETY: an `AmxBf16` (whose methods alone build `Tiles`) exists
        // only where the CPU has AMX and the process holds the tile state;
        // the configuration is a valid palette-1 one.
        unsafe {
            asm!("ldtilecfg [{}]", in(reg) &config, options(nostack, readonly));
        }
        Tiles(std::marker::PhantomData)
    }

    /// tmm0-3 = bias + the block's 32 rows (`block`, `pairs` u32 each) times
    /// the panel's 32 outputs (`weights`: `pairs` rows of 32 u32).
    fn block(&self, block: &[u32], pairs: usize, weights: &[u32], bias: &[f32]) {
        assert_eq!(block.len(), BLOCK_ROWS * pairs);
        assert_eq!(weights.len(), pairs * PANEL);
        assert_eq!(bias.len(), PANEL);
        assert!(pairs.is_multiple_of(TILE));
        let (a, b, c) = (block.as_ptr(), weights.as_ptr(), bias.as_ptr());
        let a_stride = pairs * 4;
        let b_stride = PANEL * 4;
        // SAFETY: every load below reads 16 rows of 64 bytes inside the
        // slices asserted above: activation tiles at `a + 16 i pairs + 16 s`
        // (rows of `a_stride`), weight tiles at `b + 16 s PANEL + 16 j` (rows
        // of `b_stride`), and the bias's two halves 16 times over (stride 0).
        // The prefetches touch the next step's weights, inside `weights`
        // too (and a prefetch never faults).
        unsafe {
            asm!(
                "tileloadd tmm0, [{c} + {zero}*1]",
                "tileloadd tmm1, [{c1} + {zero}*1]",
                "tileloadd tmm2, [{c} + {zero}*1]",
                "tileloadd tmm3, [{c1} + {zero}*1]",
                c = in(reg) c,
                c1 = in(reg) c.add(TILE),
                zero = in(reg) 0usize,
                options(nostack, readonly),
            );
            for step in 0..pairs / TILE {
                let a0 = a.add(step * TILE);
                let a1 = a0.add(TILE * pairs);
                let b0 = b.add(step * TILE * PANEL);
                if step + 1 < pairs / TILE {
                    // The next step's weights (2 KiB, contiguous) into L1.
                    let next = b0.add(TILE * PANEL).cast::<i8>();
                    for line in 0..TILE * PANEL * 4 / 64 {
                        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                            next.add(line * 64),
                        );
                    }
                }
                asm!(
                    "tileloadd tmm4, [{a0} + {sa}*1]",
                    "tileloadd tmm6, [{b0} + {sb}*1]",
                    "tdpbf16ps tmm0, tmm4, tmm6",
                    "tileloadd tmm7, [{b1} + {sb}*1]",
                    "tdpbf16ps tmm1, tmm4, tmm7",
                    "tileloadd tmm5, [{a1} + {sa}*1]",
                    "tdpbf16ps tmm2, tmm5, tmm6",
                    "tdpbf16ps tmm3, tmm5, tmm7",
                    a0 = in(reg) a0,
                    a1 = in(reg) a1,
                    b0 = in(reg) b0,
                    b1 = in(reg) b0.add(TILE),
                    sa = in(reg) a_stride,
                    sb = in(reg) b_stride,
                    options(nostack, readonly),
                );
            }
        }
    }

    /// Stores accumulator `acc` (0-3) into `out`: 16 rows of 16 floats,
    /// `stride` floats apart.
    fn store(&self, acc: usize, out: &mut [f32], stride: usize) {
        assert!(acc < 4 && stride >= TILE);
        assert!(out.len() >= (TILE - 1) * stride + TILE);
        let (p, s) = (out.as_mut_ptr(), stride * 4);
        // SAFETY: 16 rows of 64 bytes, `s` bytes apart, inside `out`
        // (asserted above).
        unsafe {
            match acc {
                0 => {
                    asm!("tilestored [{p} + {s}*1], tmm0", p = in(reg) p, s = in(reg) s, options(nostack))
                }
                1 => {
                    asm!("tilestored [{p} + {s}*1], tmm1", p = in(reg) p, s = in(reg) s, options(nostack))
                }
                2 => {
                    asm!("tilestored [{p} + {s}*1], tmm2", p = in(reg) p, s = in(reg) s, options(nostack))
                }
                _ => {
                    asm!("tilestored [{p} + {s}*1], tmm3", p = in(reg) p, s = in(reg) s, options(nostack))
                }
            }
        }
    }
}

impl Drop for Tiles {
    fn drop(&mut self) {
        // SAFETY: releases the configuration `configure` loaded.
        unsafe { asm!("tilerelease", options(nostack, nomem)) }
    }
}
