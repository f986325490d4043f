//! The f32 kernels against the machine's ceiling, at every level this CPU
//! runs: the FMA peak (a tight loop of independent FMAs) and the packed
//! matrix product on the encoder's shapes, in GFLOP/s, on one thread and on
//! the rayon pool. Prints the CPU and a table.
//!
//!   RAYON_NUM_THREADS=2 cargo run -p sluice-kernels --example kernel_speed [ROWS]
//!
//! (the dev profile builds the kernels crate and its dependencies at
//! `opt-level = 3`, as the benchmarks do).

use std::time::Instant;

use sluice_kernels::encoder::{Activation, Bf16Kernels, F32Kernels, PackedLinear};

/// Best of `rounds` timings of `f`, in seconds.
fn best(rounds: usize, mut f: impl FnMut()) -> f64 {
    (0..rounds)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

fn values(n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5)
        .collect()
}

fn main() {
    let rows: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(2048);
    let threads = rayon::current_num_threads();
    println!("cpu: {}", sluice_kernels::cpu::describe());
    println!(
        "kernel level chosen: {} ({} rayon threads)",
        F32Kernels::current().name(),
        threads
    );
    println!();
    println!(
        "| level | FMA peak, 1 thread | FMA peak, {threads} threads | linear {rows}x384->1152 | 384->384 | 384->1536 | 1536->384 | share of peak |"
    );
    println!("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    let shapes = [(384, 1152), (384, 384), (384, 1536), (1536, 384)];
    let mut f32_peak = f64::NAN;
    for kernels in F32Kernels::all() {
        if matches!(kernels, F32Kernels::Reference) {
            continue;
        }
        let iters = 20_000_000;
        let flops = (iters * 12 * kernels.lanes() * 2) as f64;
        let one = best(3, || {
            std::hint::black_box(kernels.fma_peak(iters));
        });
        let all = best(3, || {
            rayon::broadcast(|_| std::hint::black_box(kernels.fma_peak(iters)));
        });
        let peak_all = flops * threads as f64 / all / 1e9;
        f32_peak = peak_all;
        let (cells, gflops) = linear_speed(&shapes, rows, |w, outputs, inputs, b| {
            Some(PackedLinear::new_for(kernels, w, outputs, inputs, Some(b)))
        });
        println!(
            "| {} | {:.1} | {:.1} | {} | {:.0}% |",
            kernels.name(),
            flops / one / 1e9,
            peak_all,
            cells.join(" | "),
            100.0 * gflops / peak_all
        );
    }
    // The bf16 layers (AVX512_BF16's `vdpbf16ps`, AMX tiles), against the
    // same f32 FMA peak.
    for kernels in Bf16Kernels::all() {
        let (cells, gflops) = linear_speed(&shapes, rows, |w, outputs, inputs, b| {
            PackedLinear::new_bf16_for(kernels, w, outputs, inputs, Some(b))
        });
        println!(
            "| {} weights | - | - | {} | {:.0}% of the f32 peak |",
            kernels.name(),
            cells.join(" | "),
            100.0 * gflops / f32_peak
        );
    }
    println!();
    println!(
        "GFLOP/s; linear on all {threads} threads; share of peak: the four shapes together against the FMA peak on all threads"
    );
}

/// GFLOP/s of the layers `pack` makes, per shape (`(inputs, outputs)`, as
/// table cells) and over all shapes together; shapes it refuses are skipped.
fn linear_speed(
    shapes: &[(usize, usize)],
    rows: usize,
    pack: impl Fn(&[f32], usize, usize, &[f32]) -> Option<PackedLinear>,
) -> (Vec<String>, f64) {
    let mut cells = Vec::new();
    let (mut total_flops, mut total_secs) = (0.0, 0.0);
    for &(inputs, outputs) in shapes {
        let w = values(outputs * inputs);
        let b = values(outputs);
        let x = values(rows * inputs);
        let Some(linear) = pack(&w, outputs, inputs, &b) else {
            continue;
        };
        // One output buffer reused across runs, as the encoder reuses its
        // activations' buffers (a fresh one per run would time page faults).
        let mut out = Vec::new();
        let secs = best(5, || {
            linear.forward_into(&x, rows, &mut out, Activation::None);
            std::hint::black_box(&out);
        });
        let f = 2.0 * (rows * inputs * outputs) as f64;
        total_flops += f;
        total_secs += secs;
        cells.push(format!("{:.1}", f / secs / 1e9));
    }
    (cells, total_flops / total_secs / 1e9)
}
