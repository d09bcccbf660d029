//! Timings of the fused dequant-matmul on Qwen3-0.6B's up projection (1024 -> 3072, int4
//! codes in groups of 128, symmetric) for 1 and 4 tokens (no Python):
//!
//!     cargo run --release --example quant_gemv
//!
//! `RAYON_NUM_THREADS=1` times one core; `PYAGENT_ACCEL_SIMD=baseline|avx2` caps the
//! instruction set. The side-by-side comparison is `python benchmarks/bench_ops.py`.

use pyagent_accel::quant::{matmul, Weight};
use std::hint::black_box;
use std::time::Instant;

fn main() {
    let (out, n, bits) = (3072usize, 1024usize, 4usize);
    let words: Vec<i32> = (0..out * n * bits / 32)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761) as i32)
        .collect();
    let scales = vec![0.01f32; out * n / 128];
    let x: Vec<f32> = (0..n).map(|i| (i as f32).sin()).collect();
    for tokens in [1usize, 4] {
        let xs: Vec<f32> = x.iter().cycle().take(n * tokens).copied().collect();
        let weight = Weight {
            words: &words,
            scales: &scales,
            zeros: None,
            bits,
            in_features: n,
            permuted: None,
        };
        let mut best = f64::MAX;
        for _ in 0..50 {
            let t0 = Instant::now();
            black_box(matmul(weight, &xs, tokens, out));
            best = best.min(t0.elapsed().as_secs_f64());
        }
        println!(
            "{out} x {n} int4, {tokens} token(s): best of 50 {:.3} ms",
            best * 1e3
        );
    }
}
