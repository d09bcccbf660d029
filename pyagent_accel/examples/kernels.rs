//! Single-thread timings of the row kernels on one 128256-entry row (no Python):
//!
//!     cargo run --release --example kernels
//!
//! `PYAGENT_ACCEL_SIMD=baseline|avx2` caps the instruction set. The side-by-side
//! comparison with the reference is `python benchmarks/bench_ops.py`.

use pyagent_accel::float::simd_level;
use pyagent_accel::philox;
use pyagent_accel::sampling::kernels as sampling;
use std::hint::black_box;
use std::time::Instant;

fn best_of<F: FnMut()>(name: &str, mut f: F) {
    let mut best = f64::MAX;
    for _ in 0..50 {
        let t0 = Instant::now();
        f();
        best = best.min(t0.elapsed().as_secs_f64());
    }
    println!("{name:<16} {:8.1} us", best * 1e6);
}

fn main() {
    let n = 128_256;
    // normal(0, 3) logits via Box-Muller on a small LCG
    let mut s = 0x9E37_79B9_7F4A_7C15u64;
    let mut unif = || {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((s >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    };
    let row: Vec<f32> = (0..n)
        .map(|_| {
            (3.0 * (-2.0 * unif().ln()).sqrt() * (std::f64::consts::TAU * unif()).cos()) as f32
        })
        .collect();
    let mut out = vec![0f32; n];
    let mut scratch = sampling::Scratch::default();
    let mut buf = Vec::new();
    let prompt: Vec<i64> = (0..300).map(|i| (i * 421) % n as i64).collect();
    let output: Vec<i64> = (0..200).map(|i| (i * 977) % n as i64).collect();
    let mut u = vec![0f64; n];
    println!("simd: {:?}, one row of {n} float32 logits", simd_level());
    best_of("temperature", || {
        black_box(sampling::temperature_row(&row, &mut out, 0.8));
    });
    best_of("top_k (k=50)", || {
        black_box(sampling::top_k_row(&row, &mut out, 50, &mut buf));
    });
    best_of("top_p (p=0.9)", || {
        black_box(sampling::top_p_row(&row, &mut out, 0.9, &mut scratch));
    });
    best_of("min_p (0.05)", || {
        black_box(sampling::min_p_row(&row, &mut out, 0.05));
    });
    best_of("penalties", || {
        black_box(sampling::penalties_row(
            &row,
            &mut out,
            &prompt,
            &output,
            1.1,
            0.2,
            0.3,
            &mut scratch,
        ));
    });
    best_of("log_softmax", || {
        black_box(sampling::log_softmax_row(&row, &mut out));
    });
    best_of("sample", || {
        let _ = black_box(sampling::sample_row(&row, 0.8, 12345, 7));
    });
    best_of("philox uniforms", || {
        philox::fill_uniforms(12345, 7, black_box(&mut u))
    });
}
