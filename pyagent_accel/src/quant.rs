//! Kernels of `pyagent_accel.ops.quant` (weight-only integer quantization) and their
//! Python bindings (contract: `pyagent_ref.ops.quant`).
//!
//! `dequant_matmul` is the fused linear layer on packed codes (the float weight matrix is
//! never built), compiled for AVX-512/AVX2/baseline, rows in parallel for large layers.
//! For 1-3 tokens (GEMV, memory-bound) each row's words are read once per token and
//! decoded in registers: q - z exactly, times x, summed per block of codes of one group,
//! times the group's scale (`fused_dot`). For more tokens each row is decoded once into
//! float weights, (q - z) * s as `dequantize` gives them, in a buffer of one row, and
//! dotted with four tokens per read of the row. For f32 on x86-64 CPUs with AVX2 and FMA
//! both run as explicit intrinsics (`avx2`): the GEMV decodes a field in three vector
//! instructions, the GEMM decodes a tile of 16 rows x 128 columns once for every token.
//! Sums run in another order than BLAS's (and GEMV scales a block's sum instead of each
//! weight; the intrinsics fuse multiply-adds), so results differ from the reference in
//! the last bits (within the specification's tolerance).
//!
//! `quantize`, `dequantize`, `pack_int32` and `unpack_int32` follow the contract's
//! formulas step by step (correctly rounded divisions, ties to even), so they give the
//! reference's results bit for bit.
//!
//! FP8 weights (`quantize_fp8`, `dequantize_fp8`, `dequant_matmul_fp8`) reuse the KV
//! cache's fp8 codec (`attention::fp8`). The matmul never builds the float weight. For
//! f32 on x86-64 CPUs with AVX2, FMA and F16C (`avx2::fp8_rows`) 16 codes become half
//! floats by shifts and a mask and F16C widens them exactly (`avx2::fp8_halves`): the
//! GEMV (1-3 tokens) multiplies them with the tokens as they are decoded and scales each
//! row's sum once; the GEMM decodes tiles of `dequantize_fp8`'s weights (bit for bit) for
//! `avx2::tiled`, as the integer GEMM does. Elsewhere each row is decoded (`decode_row`,
//! branch-free bit placement that vectorises) into a buffer of one row, dotted with four
//! tokens per read.

use numpy::{PyArray2, PyArrayMethods, PyReadonlyArray2, PyUntypedArrayMethods};
use pyo3::prelude::*;
use rayon::prelude::*;

use crate::attention::fp8::{self as f8, Format};
use crate::elem::{dtype_of, float_array, new_array, with_elem, Compute, Elem};
use crate::float::{multiversion, Float};
use crate::py_util::{detached, slice, value_error};

/// Width of the vectorised dot products (one AVX-512 vector of f32).
const LANES: usize = 16;
/// Multiply-adds below which `dequant_matmul` stays on the calling thread.
const PARALLEL: usize = 1 << 18;
/// Output rows per task of the thread pool.
const ROW_BLOCK: usize = 16;

/// A compute type that small integers convert to exactly.
pub trait Lane: Compute {
    /// 2^m, m the mantissa width: `biased(f) - BIAS` is f exactly, for f < 2^16.
    const BIAS: Self;
    fn of_i32(v: i32) -> Self;
    /// BIAS + f, made from bits (no conversion instruction): f placed in the mantissa.
    fn biased(f: u32) -> Self;
    fn round_even(self) -> Self;
    fn to_i32(self) -> i32;
}

impl Lane for f32 {
    const BIAS: f32 = 8_388_608.0;
    #[inline(always)]
    fn biased(f: u32) -> f32 {
        f32::from_bits(0x4B00_0000 | f)
    }
    #[inline(always)]
    fn of_i32(v: i32) -> f32 {
        v as f32
    }
    #[inline(always)]
    fn round_even(self) -> f32 {
        self.round_ties_even()
    }
    #[inline(always)]
    fn to_i32(self) -> i32 {
        self as i32
    }
}

impl Lane for f64 {
    const BIAS: f64 = 4_503_599_627_370_496.0;
    #[inline(always)]
    fn biased(f: u32) -> f64 {
        f64::from_bits(0x4330_0000_0000_0000 | f as u64)
    }
    #[inline(always)]
    fn of_i32(v: i32) -> f64 {
        v as f64
    }
    #[inline(always)]
    fn round_even(self) -> f64 {
        self.round_ties_even()
    }
    #[inline(always)]
    fn to_i32(self) -> i32 {
        self as i32
    }
}

/// The codes of one row of words: field j of word k (bits [j b, (j + 1) b)) minus
/// 2^(b-1) into `codes[k * 32 / b + j]`, for the first `codes.len()` codes.
#[inline(always)]
fn decode_words<const BITS: usize>(words: &[i32], codes: &mut [i32]) {
    let per = 32 / BITS;
    let mask = (1u32 << BITS) - 1;
    let offset = 1i32 << (BITS - 1);
    let full = codes.len() / per;
    for (k, chunk) in codes.chunks_exact_mut(per).enumerate().take(full) {
        let word = words[k] as u32;
        for (j, c) in chunk.iter_mut().enumerate() {
            *c = ((word >> (j * BITS)) & mask) as i32 - offset;
        }
    }
    let done = full * per;
    for (j, c) in codes[done..].iter_mut().enumerate() {
        *c = (((words[full] as u32) >> (j * BITS)) & mask) as i32 - offset;
    }
}

fn decode(bits: usize, words: &[i32], codes: &mut [i32]) {
    match bits {
        2 => decode_words::<2>(words, codes),
        4 => decode_words::<4>(words, codes),
        _ => decode_words::<8>(words, codes),
    }
}

/// One row of the float weight: (q - z) * s per group of `codes.len() / scales.len()`
/// columns, rounded once in C.
#[inline(always)]
fn scale_row<C: Lane>(codes: &[i32], scales: &[C], zeros: Option<&[i8]>, w: &mut [C]) {
    let size = codes.len() / scales.len().max(1);
    for (g, &s) in scales.iter().enumerate() {
        let z = zeros.map_or(0, |z| z[g] as i32);
        let (q, out) = (
            &codes[g * size..(g + 1) * size],
            &mut w[g * size..(g + 1) * size],
        );
        for (o, &c) in out.iter_mut().zip(q) {
            *o = C::of_i32(c - z) * s;
        }
    }
}

/// The sum of LANES partial sums, pairwise (a tree the compiler vectorises).
#[inline(always)]
fn fold<C: Compute>(mut acc: [C; LANES]) -> C {
    let mut width = LANES / 2;
    while width > 0 {
        for l in 0..width {
            acc[l] = acc[l] + acc[l + width];
        }
        width /= 2;
    }
    acc[0]
}

/// The dots of row `w` with four token rows `x`, the row read once for the four.
#[inline(always)]
fn dot4<C: Compute>(w: &[C], x: [&[C]; 4]) -> [C; 4] {
    let n = w.len();
    let body = n - n % LANES;
    let mut acc = [[C::ZERO; LANES]; 4];
    for c in (0..body).step_by(LANES) {
        let a: &[C; LANES] = w[c..c + LANES].try_into().unwrap();
        for (v, sums) in x.iter().zip(acc.iter_mut()) {
            let v: &[C; LANES] = v[c..c + LANES].try_into().unwrap();
            for l in 0..LANES {
                sums[l] = sums[l] + a[l] * v[l];
            }
        }
    }
    let mut out = [C::ZERO; 4];
    for (j, (v, sums)) in x.iter().zip(acc).enumerate() {
        let mut sum = fold(sums);
        for i in body..n {
            sum = sum + w[i] * v[i];
        }
        out[j] = sum;
    }
    out
}

/// The dot of one row's packed words with one token, decoding on the fly: LANES words
/// at a time, field j of word l meeting `xp[j * LANES + l]` of the block (the token
/// permuted by `permute`). Each field f becomes q - z = f - 2^(b-1) - z exactly, as
/// `biased(f) - (BIAS + 2^(b-1) + z)` (no int-to-float conversion), is multiplied by x
/// and summed per lane over the block; the block's sum is then multiplied by its
/// group's scale once. Each block of LANES words lies in one group (`fusable`).
#[inline(always)]
fn fused_dot<C: Lane, const BITS: usize>(
    words: &[i32],
    scales: &[C],
    zeros: Option<&[i8]>,
    xp: &[C],
    group: usize,
) -> C {
    let per = 32 / BITS;
    let block = LANES * per;
    let mask = (1u32 << BITS) - 1;
    let offset = 1i32 << (BITS - 1);
    let mut total = C::ZERO;
    for (b, (ws, xs)) in words
        .chunks_exact(LANES)
        .zip(xp.chunks_exact(block))
        .enumerate()
    {
        let g = b * block / group;
        let s = scales[g];
        let bias = C::BIAS + C::of_i32(offset + zeros.map_or(0, |z| z[g] as i32));
        let ws: &[i32; LANES] = ws.try_into().unwrap();
        let mut part = [C::ZERO; LANES];
        for (j, xj) in xs.chunks_exact(LANES).enumerate() {
            let xj: &[C; LANES] = xj.try_into().unwrap();
            for l in 0..LANES {
                let field = ((ws[l] as u32) >> (j * BITS)) & mask;
                part[l] = part[l] + (C::biased(field) - bias) * xj[l];
            }
        }
        // folded per block: LANES sums carried across blocks stay in 128-bit registers
        total = total + fold(part) * s;
    }
    total
}

/// The same dot in AVX2 + FMA intrinsics, for f32 on x86-64 CPUs that have them (else
/// `fused_dot`). It reads the permuted token pre-scaled (`permute` with `scaled`) so that
/// a field is decoded without a shift: with E the bits of 2^23 and c = 2^(b-1) + z, the
/// word OR E, AND (the field's mask OR E), reads 2^23 + f 2^(b p) for the field at bit b p
/// of its 16-bit half (fields of the high half shifted down once per word), and minus
/// 2^23 + c 2^(b p) it is (q - z) 2^(b p) exactly; times x 2^(-b p) it is (q - z) x, fused
/// into one multiply-add (so results differ from `fused_dot` in the last bits).
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{Fp8Weight, Weight, LANES};
    use std::arch::x86_64::*;

    /// The bits of 2^23 in f32.
    const E: i32 = 0x4B00_0000;

    /// Whether the CPU runs this module's kernels.
    pub fn available() -> bool {
        is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")
    }

    #[target_feature(enable = "avx2,fma")]
    fn sum(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps::<1>(s, s)))
    }

    /// `super::fused_dot` on the pre-scaled token `xs`.
    #[target_feature(enable = "avx2,fma")]
    fn dot<const BITS: usize>(
        words: &[i32],
        scales: &[f32],
        zeros: Option<&[i8]>,
        xs: &[f32],
        group: usize,
    ) -> f32 {
        let per = 32 / BITS;
        let half = 16 / BITS;
        let block = LANES * per;
        let (field, offset) = ((1i32 << BITS) - 1, 1i32 << (BITS - 1));
        let e = _mm256_set1_epi32(E);
        let mut total = _mm256_setzero_ps();
        let groups = words.chunks_exact(group / per).zip(xs.chunks_exact(group));
        for (g, (wg, xg)) in groups.enumerate() {
            let c = _mm256_set1_ps((offset + zeros.map_or(0, |z| z[g] as i32)) as f32);
            let s = _mm256_set1_ps(scales[g]);
            for (ws, xb) in wg.chunks_exact(LANES).zip(xg.chunks_exact(block)) {
                // SAFETY: ws holds LANES = 16 words, xb `block` = 16 * per floats.
                let (w0, w1) = unsafe {
                    (
                        _mm256_loadu_si256(ws.as_ptr().cast()),
                        _mm256_loadu_si256(ws.as_ptr().add(8).cast()),
                    )
                };
                // [low halves of words 0-7, of 8-15, high halves of 0-7, of 8-15], OR E
                let halves = [
                    _mm256_or_si256(w0, e),
                    _mm256_or_si256(w1, e),
                    _mm256_or_si256(_mm256_srli_epi32::<16>(w0), e),
                    _mm256_or_si256(_mm256_srli_epi32::<16>(w1), e),
                ];
                let mut acc = [_mm256_setzero_ps(); 4];
                for p in 0..half {
                    let mask = _mm256_set1_epi32((field << (BITS * p)) | E);
                    let step = _mm256_set1_ps((1 << (BITS * p)) as f32);
                    let bias = _mm256_fmadd_ps(c, step, _mm256_set1_ps(8_388_608.0));
                    for (k, (&h, a)) in halves.iter().zip(acc.iter_mut()).enumerate() {
                        // field j = (k / 2) * half + p of words 8 (k % 2) ..
                        let j = (k / 2) * half + p;
                        let v = _mm256_castsi256_ps(_mm256_and_si256(h, mask));
                        // SAFETY: j < per, so the 8 floats lie in xb.
                        let x =
                            unsafe { _mm256_loadu_ps(xb.as_ptr().add(j * LANES + 8 * (k % 2))) };
                        *a = _mm256_fmadd_ps(_mm256_sub_ps(v, bias), x, *a);
                    }
                }
                let part =
                    _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
                total = _mm256_fmadd_ps(part, s, total);
            }
        }
        sum(total)
    }

    /// `super::fused_rows` with `dot`.
    #[target_feature(enable = "avx2,fma")]
    fn rows<const BITS: usize>(
        words: &[i32],
        scales: &[f32],
        zeros: Option<&[i8]>,
        xs: &[f32],
        tokens: usize,
        yt: &mut [f32],
    ) {
        let n = xs.len() / tokens;
        let rows = yt.len() / tokens;
        let per_row = words.len() / rows;
        let groups = scales.len() / rows;
        let group = n / groups;
        for (o, out) in yt.chunks_exact_mut(tokens).enumerate() {
            let words = &words[o * per_row..(o + 1) * per_row];
            let scales = &scales[o * groups..(o + 1) * groups];
            let zeros = zeros.map(|z| &z[o * groups..(o + 1) * groups]);
            for (t, y) in out.iter_mut().enumerate() {
                *y = dot::<BITS>(words, scales, zeros, &xs[t * n..(t + 1) * n], group);
            }
        }
    }

    /// Rows of a tile (`ROWS` output rows, one 8-float vector per half).
    const ROWS: usize = 16;
    /// Columns of a tile: the weights of ROWS x KC floats (8 KiB) stay in L1 while every
    /// token meets them.
    const KC: usize = 128;

    /// tile[r * T + t] += sum over k < kc of wt[k * ROWS + r] x[t][k] (the tile's rows
    /// side by side per column, `T` tokens broadcast): ROWS x T sums in 2 T registers,
    /// each a multiply-add per column.
    #[target_feature(enable = "avx2,fma")]
    fn micro<const T: usize>(wt: &[f32], x: [&[f32]; T], tile: &mut [f32]) {
        let kc = x[0].len();
        assert!(wt.len() >= kc * ROWS && tile.len() >= ROWS * T);
        assert!(x.iter().all(|row| row.len() == kc));
        let mut acc = [[_mm256_setzero_ps(); 2]; T];
        for k in 0..kc {
            // SAFETY: k < kc and wt holds kc * ROWS floats (asserted above).
            let (w0, w1) = unsafe {
                let w = wt.as_ptr().add(k * ROWS);
                (_mm256_loadu_ps(w), _mm256_loadu_ps(w.add(8)))
            };
            for (a, row) in acc.iter_mut().zip(&x) {
                // SAFETY: each row holds kc floats (asserted above).
                let v = _mm256_set1_ps(unsafe { *row.get_unchecked(k) });
                a[0] = _mm256_fmadd_ps(w0, v, a[0]);
                a[1] = _mm256_fmadd_ps(w1, v, a[1]);
            }
        }
        let mut sums = [0f32; ROWS];
        for (t, a) in acc.iter().enumerate() {
            // SAFETY: sums holds 16 floats.
            unsafe {
                _mm256_storeu_ps(sums.as_mut_ptr(), a[0]);
                _mm256_storeu_ps(sums.as_mut_ptr().add(8), a[1]);
            }
            for (r, &v) in sums.iter().enumerate() {
                tile[r * T + t] += v;
            }
        }
    }

    /// wt[k * ROWS + r] = (q - z) s for the codes of word columns `columns` of `tw` (the
    /// words of ROWS rows side by side per column) and each row's s and 2^(b-1) + z:
    /// `dequantize`'s values (the difference exact in i32, one rounding).
    #[target_feature(enable = "avx2,fma")]
    fn decode_tile(
        bits: usize,
        tw: &[i32],
        columns: std::ops::Range<usize>,
        s: &[f32; ROWS],
        z: &[i32; ROWS],
        wt: &mut [f32],
    ) {
        let per = 32 / bits;
        let mask = _mm256_set1_epi32((1 << bits) - 1);
        assert!(tw.len() >= columns.end * ROWS && wt.len() >= columns.end * per * ROWS);
        for c in columns {
            for h in 0..2 {
                // SAFETY: c < columns.end (asserted above); s and z hold ROWS = 16 values.
                unsafe {
                    let w = _mm256_loadu_si256(tw.as_ptr().add(c * ROWS + 8 * h).cast());
                    let zv = _mm256_loadu_si256(z.as_ptr().add(8 * h).cast());
                    let sv = _mm256_loadu_ps(s.as_ptr().add(8 * h));
                    for j in 0..per {
                        let count = _mm_cvtsi32_si128((bits * j) as i32);
                        let q = _mm256_and_si256(_mm256_srl_epi32(w, count), mask);
                        let v = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(q, zv)), sv);
                        _mm256_storeu_ps(wt.as_mut_ptr().add((c * per + j) * ROWS + 8 * h), v);
                    }
                }
            }
        }
    }

    /// y rows of a block of at most ROWS rows for any number of tokens (`super::rows_impl`
    /// without `permuted`), for f32 when `available()`: for each KC columns, the rows'
    /// float weights (q - z) s, as `dequantize` gives them, decoded once into a tile that
    /// every token then meets (`tiled`).
    pub fn gemm(weight: Weight<'_, f32>, x: &[f32], tokens: usize, yt: &mut [f32]) {
        let (bits, words, scales, zeros) = (weight.bits, weight.words, weight.scales, weight.zeros);
        assert!(available());
        let rows = yt.len() / tokens;
        let n = x.len() / tokens;
        let (per_row, groups) = (words.len() / rows, scales.len() / rows);
        let group = n / groups;
        let per = 32 / bits;
        let mut tw = vec![0i32; KC * ROWS];
        let mut codes = vec![0i32; KC];
        tiled(x, tokens, yt, |k0, kc, wt| {
            if group % per == 0 {
                // the tile's words side by side per word column, then decoded 8 rows at once
                for (r, row) in words.chunks_exact(per_row).enumerate() {
                    for (c, &w) in row[k0 / per..(k0 + kc) / per].iter().enumerate() {
                        tw[c * ROWS + r] = w;
                    }
                }
                let mut c = k0;
                while c < k0 + kc {
                    let g = c / group;
                    let end = ((g + 1) * group).min(k0 + kc);
                    let mut s = [0f32; ROWS];
                    let mut z = [0i32; ROWS];
                    for r in 0..rows {
                        s[r] = scales[r * groups + g];
                        z[r] = (1 << (bits - 1)) + zeros.map_or(0, |z| z[r * groups + g] as i32);
                    }
                    let columns = (c - k0) / per..(end - k0) / per;
                    // SAFETY: the CPU has AVX2 and FMA (asserted above).
                    unsafe { decode_tile(bits, &tw, columns, &s, &z, wt) };
                    c = end;
                }
            } else {
                for r in 0..rows {
                    let row = &words[r * per_row..(r + 1) * per_row];
                    super::decode(bits, &row[k0 / per..(k0 + kc) / per], &mut codes[..kc]);
                    for (i, &q) in codes[..kc].iter().enumerate() {
                        let g = (k0 + i) / group;
                        let z = zeros.map_or(0, |z| z[r * groups + g] as i32);
                        wt[i * ROWS + r] = (q - z) as f32 * scales[r * groups + g];
                    }
                }
            }
        });
    }

    /// y rows (yt, rows x tokens) of a block of at most ROWS rows, by tiles: for each KC
    /// columns from k0, `decode(k0, kc, wt)` writes the rows' float weights side by side
    /// per column (wt[k * ROWS + r] for column k0 + k), then every token meets the tile
    /// (ROWS x 6 sums per pass of `micro`). Each column block's sums start from zero and
    /// are added to the row's total (the order of the sum). For f32 when `available()`.
    fn tiled(
        x: &[f32],
        tokens: usize,
        yt: &mut [f32],
        mut decode: impl FnMut(usize, usize, &mut [f32]),
    ) {
        assert!(available());
        let rows = yt.len() / tokens;
        assert!(rows <= ROWS);
        let n = x.len() / tokens;
        let mut wt = vec![0f32; KC * ROWS];
        let mut tile = vec![0f32; ROWS * tokens];
        for k0 in (0..n).step_by(KC) {
            let kc = KC.min(n - k0);
            decode(k0, kc, &mut wt);
            let token = |t: usize| &x[t * n + k0..t * n + k0 + kc];
            let mut t = 0;
            while t < tokens {
                let take = (tokens - t).min(6);
                let out = &mut tile[t * ROWS..(t + take) * ROWS];
                // SAFETY: the CPU has AVX2 and FMA (asserted above).
                unsafe {
                    match take {
                        6 => micro::<6>(&wt, std::array::from_fn(|i| token(t + i)), out),
                        5 => micro::<5>(&wt, std::array::from_fn(|i| token(t + i)), out),
                        4 => micro::<4>(&wt, std::array::from_fn(|i| token(t + i)), out),
                        3 => micro::<3>(&wt, std::array::from_fn(|i| token(t + i)), out),
                        2 => micro::<2>(&wt, std::array::from_fn(|i| token(t + i)), out),
                        _ => micro::<1>(&wt, [token(t)], out),
                    }
                }
                t += take;
            }
        }
        // tile: token groups of `take` tokens, each ROWS x take (row-major)
        let mut t = 0;
        while t < tokens {
            let take = (tokens - t).min(6);
            let part = &tile[t * ROWS..(t + take) * ROWS];
            for r in 0..rows {
                for i in 0..take {
                    yt[r * tokens + t + i] = part[r * take + i];
                }
            }
            t += take;
        }
    }

    /// y rows of a block of rows (`super::rows_impl`'s arguments, `permuted` scaled), for
    /// f32 when `available()`.
    pub fn gemv(weight: Weight<'_, f32>, tokens: usize, yt: &mut [f32]) {
        assert!(available());
        // SAFETY: the CPU has AVX2 and FMA (checked just above).
        unsafe {
            let (words, scales, zeros) = (weight.words, weight.scales, weight.zeros);
            let xs = weight.permuted.expect("the token in `permute`'s order");
            match weight.bits {
                2 => rows::<2>(words, scales, zeros, xs, tokens, yt),
                4 => rows::<4>(words, scales, zeros, xs, tokens, yt),
                _ => rows::<8>(words, scales, zeros, xs, tokens, yt),
            }
        }
    }

    // FP8 weights, 16 codes per instruction group and no table: byte b moved into the
    // high byte of a 16-bit lane (b << 8) is the half float of e5m2 code b's value (the
    // same layout: sign, 5 exponent bits of bias 15, 2 mantissa bits; infinities and NaNs
    // included). For e4m3fn, (b & 0x80) << 8 | (b & 0x7F) << 7 (b sign-extended to 16
    // bits, shifted left by 7, bit 14 cleared) is the half of its value times 2^-8 (4
    // exponent bits of bias 7 read with bias 15, the 3 mantissa bits on top of the
    // half's, normal and subnormal codes alike), except its NaN codes 0x7F / 0xFF (1.875
    // 2^-8 there, so detected apart: b + b wraps to 0xFE for them alone). F16C widens the
    // halves to f32 exactly: h = fp8(q) 2^-8 (e4m3fn) or fp8(q) (e5m2). The GEMM's tiles
    // take h times s 2^8 (or s), exact while finite: fp8(q) s rounded once, the weights
    // of `dequantize_fp8` bit for bit. The GEMV sums h x per row and multiplies the sum
    // by s 2^8 once (`fp8_foldable` keeps every h x a normal f32 and the sum finite).

    /// Whether the CPU runs the fp8 kernels (`fp8_rows`): AVX2, FMA and F16C.
    pub fn fp8_available() -> bool {
        available() && is_x86_feature_detected!("f16c")
    }

    /// The values h of the 16 codes `bytes`: fp8(q) 2^-8 (e4m3fn, NaN codes aside) or
    /// fp8(q) (e5m2), exact.
    #[target_feature(enable = "avx2,fma,f16c")]
    fn fp8_halves<const E5M2: bool>(bytes: __m128i) -> [__m256; 2] {
        let h = if E5M2 {
            _mm256_slli_epi16::<8>(_mm256_cvtepu8_epi16(bytes))
        } else {
            let t = _mm256_slli_epi16::<7>(_mm256_cvtepi8_epi16(bytes));
            _mm256_and_si256(t, _mm256_set1_epi16(!0x4000))
        };
        let lo = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
        [lo, _mm256_cvtph_ps(_mm256_extracti128_si256::<1>(h))]
    }

    /// 16 codes from `codes` at `at` (at + 16 <= codes.len()).
    #[target_feature(enable = "avx2,fma,f16c")]
    fn fp8_load(codes: &[u8], at: usize) -> __m128i {
        assert!(at + 16 <= codes.len());
        // SAFETY: the 16 bytes lie in `codes` (asserted above).
        unsafe { _mm_loadu_si128(codes.as_ptr().add(at).cast()) }
    }

    /// Whether any byte of `twice` (the codes' b + b, max-accumulated) is 0xFE: a code
    /// that is e4m3fn's NaN.
    #[target_feature(enable = "avx2,fma,f16c")]
    fn fp8_nan(twice: __m128i) -> bool {
        let hit = _mm_cmpeq_epi8(twice, _mm_set1_epi8(0xFEu8 as i8));
        _mm_testz_si128(hit, hit) == 0
    }

    /// s as the kernels multiply h by it, None where s 2^8 overflows (`decode_row`).
    fn fp8_factor<const E5M2: bool>(s: f32) -> Option<f32> {
        let f = if E5M2 { s } else { s * 256.0 };
        f.is_finite().then_some(f)
    }

    /// One row of codes as weights fp8(q) s (`super::decode_row`'s values): 16 codes per
    /// `fp8_halves`; a block holding a NaN code and the partial block at the end, and a
    /// row whose s 2^8 overflows, through `decode_row`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) fn fp8_decode<const E5M2: bool>(codes: &[u8], s: f32, w: &mut [f32]) {
        let Some(f) = fp8_factor::<E5M2>(s) else {
            return super::decode_row::<f32, E5M2>(codes, s, w);
        };
        let sv = _mm256_set1_ps(f);
        let body = codes.len() - codes.len() % 16;
        for (c, o) in (0..body).step_by(16).zip(w.chunks_exact_mut(16)) {
            let bytes = fp8_load(codes, c);
            if !E5M2 && fp8_nan(_mm_add_epi8(bytes, bytes)) {
                super::decode_row::<f32, E5M2>(&codes[c..c + 16], s, o);
                continue;
            }
            let [lo, hi] = fp8_halves::<E5M2>(bytes);
            // SAFETY: o holds 16 floats.
            unsafe {
                _mm256_storeu_ps(o.as_mut_ptr(), _mm256_mul_ps(lo, sv));
                _mm256_storeu_ps(o.as_mut_ptr().add(8), _mm256_mul_ps(hi, sv));
            }
        }
        super::decode_row::<f32, E5M2>(&codes[body..], s, &mut w[body..codes.len()]);
    }

    /// y rows (yt, rows x T) of T = 1-3 tokens (x: T rows of n, `fp8_foldable`) and the
    /// fp8 weight rows (the GEMV): each row's codes decoded 16 at a time (`fp8_halves`),
    /// met by every token in the same pass (4 T sums of multiply-adds, two blocks of 16 in
    /// flight), each token's sum times s 2^8 (or s) once. The partial block at a row's
    /// end as `decode_row`'s weights; a row holding a NaN code, or whose s 2^8
    /// overflows or s is below 2^-100, wholly through `decode_row` (so a NaN code makes
    /// its row's sums NaN, as the contract's weight does).
    #[target_feature(enable = "avx2,fma,f16c")]
    fn fp8_gemv<const E5M2: bool, const T: usize>(
        weight: Fp8Weight<'_>,
        x: &[f32],
        yt: &mut [f32],
    ) {
        let n = weight.in_features;
        let body = n - n % 16;
        assert!(x.len() == T * n && weight.codes.len() == yt.len() / T * n);
        for (o, (out, codes)) in yt
            .chunks_exact_mut(T)
            .zip(weight.codes.chunks_exact(n))
            .enumerate()
        {
            let s = weight.scales[if weight.scales.len() > 1 { o } else { 0 }];
            let mut exact = || {
                let mut w = vec![0f32; n];
                super::decode_row::<f32, E5M2>(codes, s, &mut w);
                for (t, y) in out.iter_mut().enumerate() {
                    *y = super::dot1(&w, &x[t * n..(t + 1) * n]);
                }
            };
            // s of magnitude >= 2^-100 (or 0): the weights fp8(q) s are normal f32, so that
            // their one rounding, which the sum skips, is relative
            let normal = s == 0.0 || s.abs() >= 2f32.powi(-100);
            let Some(f) = fp8_factor::<E5M2>(s).filter(|_| normal) else {
                exact();
                continue;
            };
            let mut acc = [[_mm256_setzero_ps(); 4]; T];
            // the 16 codes from c into sums k and k + 1 of each token
            let step = |c: usize, k: usize, acc: &mut [[__m256; 4]; T]| {
                let [lo, hi] = fp8_halves::<E5M2>(fp8_load(codes, c));
                for (t, a) in acc.iter_mut().enumerate() {
                    // SAFETY: c + 16 <= body <= n, so the 16 floats lie in token t's row.
                    let (x0, x1) = unsafe {
                        let p = x.as_ptr().add(t * n + c);
                        (_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8)))
                    };
                    a[k] = _mm256_fmadd_ps(lo, x0, a[k]);
                    a[k + 1] = _mm256_fmadd_ps(hi, x1, a[k + 1]);
                }
            };
            let mut twice = _mm256_setzero_si256();
            let mut c = 0;
            while c + 32 <= body {
                if !E5M2 {
                    // SAFETY: c + 32 <= body <= n: the 32 bytes lie in the row.
                    let b = unsafe { _mm256_loadu_si256(codes.as_ptr().add(c).cast()) };
                    twice = _mm256_max_epu8(twice, _mm256_add_epi8(b, b));
                }
                step(c, 0, &mut acc);
                step(c + 16, 2, &mut acc);
                c += 32;
            }
            let mut twice = _mm_max_epu8(
                _mm256_castsi256_si128(twice),
                _mm256_extracti128_si256::<1>(twice),
            );
            if c < body {
                if !E5M2 {
                    let b = fp8_load(codes, c);
                    twice = _mm_max_epu8(twice, _mm_add_epi8(b, b));
                }
                step(c, 0, &mut acc);
            }
            if !E5M2 && fp8_nan(twice) {
                exact();
                continue;
            }
            let tail = &mut [0f32; 16][..n - body];
            super::decode_row::<f32, E5M2>(&codes[body..], s, tail);
            for (t, (y, a)) in out.iter_mut().zip(acc).enumerate() {
                let xt = &x[t * n + body..(t + 1) * n];
                let rest: f32 = tail.iter().zip(xt).map(|(w, v)| w * v).sum();
                let both = _mm256_add_ps(_mm256_add_ps(a[0], a[1]), _mm256_add_ps(a[2], a[3]));
                *y = sum(both) * f + rest;
            }
        }
    }

    /// `super::fp8_rows_impl` on x (tokens rows of n) for f32 when `fp8_available()`:
    /// the GEMV (`fp8_gemv`) for 1-3 tokens when x is `foldable`, else by tiles
    /// (`tiled`), each row's KC codes decoded (`fp8_decode`) once for every token.
    pub fn fp8_rows(
        weight: Fp8Weight<'_>,
        x: &[f32],
        tokens: usize,
        foldable: bool,
        yt: &mut [f32],
    ) {
        assert!(fp8_available());
        let e5m2 = weight.fmt == super::f8::E5M2;
        // SAFETY: the CPU has AVX2, FMA and F16C (asserted above).
        unsafe {
            match (e5m2, if foldable { tokens } else { 0 }) {
                (false, 1) => return fp8_gemv::<false, 1>(weight, x, yt),
                (false, 2) => return fp8_gemv::<false, 2>(weight, x, yt),
                (false, 3) => return fp8_gemv::<false, 3>(weight, x, yt),
                (true, 1) => return fp8_gemv::<true, 1>(weight, x, yt),
                (true, 2) => return fp8_gemv::<true, 2>(weight, x, yt),
                (true, 3) => return fp8_gemv::<true, 3>(weight, x, yt),
                _ => {}
            }
        }
        let n = weight.in_features;
        let rows = yt.len() / tokens;
        tiled(x, tokens, yt, |k0, kc, wt| {
            let mut w = [0f32; KC];
            for r in 0..rows {
                let s = weight.scales[if weight.scales.len() > 1 { r } else { 0 }];
                let codes = &weight.codes[r * n + k0..r * n + k0 + kc];
                // SAFETY: the CPU has AVX2, FMA and F16C (asserted above).
                unsafe {
                    match e5m2 {
                        true => fp8_decode::<true>(codes, s, &mut w[..kc]),
                        false => fp8_decode::<false>(codes, s, &mut w[..kc]),
                    }
                }
                for (i, &v) in w[..kc].iter().enumerate() {
                    wt[i * ROWS + r] = v;
                }
            }
        });
    }
}

/// Whether `fused_dot` serves a layer: every block of LANES words in one group.
fn fusable(bits: usize, in_features: usize, groups: usize) -> bool {
    let block = LANES * 32 / bits;
    groups > 0 && (in_features / groups) % block == 0
}

/// A token (rows of `n`) in `fused_dot`'s order: within each block of LANES words, field
/// j of word l at j * LANES + l; `scaled` (the AVX2 kernel's order), field j multiplied
/// by 2^(-b p), p = j % (16 / b) its place in its 16-bit half (exact: `simd_gemv`
/// checks that no x is small enough to lose bits).
fn permute<C: Compute>(x: &[C], n: usize, bits: usize, scaled: bool) -> Vec<C> {
    let per = 32 / bits;
    let block = LANES * per;
    let factor = |j: usize| match scaled {
        true => C::from_f64(0.5f64.powi((bits * (j % (16 / bits))) as i32)),
        false => C::ONE,
    };
    let mut out = vec![C::ZERO; x.len()];
    for (src, dst) in x.chunks_exact(n).zip(out.chunks_exact_mut(n)) {
        for (sb, db) in src.chunks_exact(block).zip(dst.chunks_exact_mut(block)) {
            for j in 0..per {
                let f = factor(j);
                for l in 0..LANES {
                    db[j * LANES + l] = sb[l * per + j] * f;
                }
            }
        }
    }
    out
}

/// Whether the AVX2 GEMV (`avx2`) serves a call of `fused_dot`'s: f32 on a CPU with AVX2
/// and FMA, every x zero or of magnitude >= 2^-100 (so that x 2^(-b p), p < 16 / b, is
/// exact: a normal f32).
fn simd_gemv<C: Compute>(x: &[C]) -> bool {
    #[cfg(target_arch = "x86_64")]
    if std::any::TypeId::of::<C>() == std::any::TypeId::of::<f32>() && avx2::available() {
        let tiny = C::from_f64(2f64.powi(-100));
        return x
            .iter()
            .all(|&v| v == C::ZERO || v >= tiny || C::ZERO - v >= tiny);
    }
    let _ = x;
    false
}

/// Whether the fp8 GEMV (`avx2::fp8_rows`) may multiply each row's sum of h x by the
/// scale once (h = fp8(q) or fp8(q) 2^-8, of magnitude 2^-17 to 2^16, or 0): every x zero
/// or of magnitude in [2^-100, 2^64], so that each h x is a normal f32 (exact in a fused
/// multiply-add) and a row's sum stays finite; else the GEMM's exact weights serve.
#[cfg(target_arch = "x86_64")]
fn fp8_foldable<C: Compute>(x: &[C]) -> bool {
    let (tiny, huge) = (C::from_f64(2f64.powi(-100)), C::from_f64(2f64.powi(64)));
    x.iter().all(|&v| {
        let m = if v < C::ZERO { C::ZERO - v } else { v };
        m == C::ZERO || (m >= tiny && m <= huge)
    })
}

/// Whether `avx2::gemm` serves the calls that `fused_dot` does not: f32 on a CPU with AVX2
/// and FMA.
#[cfg(target_arch = "x86_64")]
fn tiled_gemm<C: Compute>() -> bool {
    std::any::TypeId::of::<C>() == std::any::TypeId::of::<f32>() && avx2::available()
}

/// `v` as f32 (C is f32: `simd_gemv` checked it).
#[cfg(target_arch = "x86_64")]
fn f32s<C: Compute>(v: &[C]) -> &[f32] {
    assert_eq!(std::any::TypeId::of::<C>(), std::any::TypeId::of::<f32>());
    // SAFETY: C is f32 (asserted just above).
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast(), v.len()) }
}

/// What `rows_impl` reads: the packed words and the per-group parameters of a block of
/// rows, in the compute type.
#[derive(Clone, Copy)]
pub struct Weight<'a, C> {
    pub words: &'a [i32],
    pub scales: &'a [C],
    pub zeros: Option<&'a [i8]>,
    pub bits: usize,
    pub in_features: usize,
    /// x in `fused_dot`'s order, when the layer is `fusable` and tokens are few.
    pub permuted: Option<&'a [C]>,
}

/// `rows_impl` on the permuted tokens `xp`: `fused_dot` per row and token.
#[inline(always)]
fn fused_rows<C: Lane, const BITS: usize>(
    weight: Weight<'_, C>,
    xp: &[C],
    tokens: usize,
    yt: &mut [C],
) {
    let n = weight.in_features;
    let rows = yt.len() / tokens;
    let per_row = weight.words.len() / rows.max(1);
    let groups = weight.scales.len() / rows.max(1);
    let group = n / groups;
    for (o, out) in yt.chunks_exact_mut(tokens).enumerate() {
        let words = &weight.words[o * per_row..(o + 1) * per_row];
        let scales = &weight.scales[o * groups..(o + 1) * groups];
        let zeros = weight.zeros.map(|z| &z[o * groups..(o + 1) * groups]);
        for (t, y) in out.iter_mut().enumerate() {
            *y = fused_dot::<C, BITS>(words, scales, zeros, &xp[t * n..(t + 1) * n], group);
        }
    }
}

/// y rows (one per output row of `weight`, `tokens` entries each) of x (tokens, in): with
/// `permuted`, `fused_dot` per token; else each row decoded once into float weights and
/// dotted with four tokens per read.
#[inline(always)]
fn rows_impl<C: Lane>(weight: Weight<'_, C>, x: &[C], tokens: usize, yt: &mut [C]) {
    let n = weight.in_features;
    let rows = yt.len() / tokens.max(1);
    let per_row = weight.words.len() / rows.max(1);
    let groups = weight.scales.len() / rows.max(1);
    let token = |t: usize| &x[t * n..(t + 1) * n];
    if let Some(xp) = weight.permuted {
        // one instance per width, the match outside the loops (inside them, LLVM keeps
        // the decoding in 128-bit registers)
        match weight.bits {
            2 => fused_rows::<C, 2>(weight, xp, tokens, yt),
            4 => fused_rows::<C, 4>(weight, xp, tokens, yt),
            _ => fused_rows::<C, 8>(weight, xp, tokens, yt),
        }
        return;
    }
    let mut codes = vec![0i32; n];
    let mut w = vec![C::ZERO; n];
    for (o, out) in yt.chunks_exact_mut(tokens.max(1)).enumerate() {
        decode(
            weight.bits,
            &weight.words[o * per_row..(o + 1) * per_row],
            &mut codes,
        );
        let zeros = weight.zeros.map(|z| &z[o * groups..(o + 1) * groups]);
        scale_row(
            &codes,
            &weight.scales[o * groups..(o + 1) * groups],
            zeros,
            &mut w,
        );
        let mut t = 0;
        while t + 4 <= tokens {
            let sums = dot4(&w, [token(t), token(t + 1), token(t + 2), token(t + 3)]);
            out[t..t + 4].copy_from_slice(&sums);
            t += 4;
        }
        for (i, y) in out[t..].iter_mut().enumerate() {
            *y = dot1(&w, token(t + i));
        }
    }
}

/// The dot of row `w` with one token row `x` (LANES partial sums).
#[inline(always)]
fn dot1<C: Compute>(w: &[C], x: &[C]) -> C {
    let n = w.len();
    let body = n - n % LANES;
    let mut acc = [C::ZERO; LANES];
    for c in (0..body).step_by(LANES) {
        let a: &[C; LANES] = w[c..c + LANES].try_into().unwrap();
        let v: &[C; LANES] = x[c..c + LANES].try_into().unwrap();
        for l in 0..LANES {
            acc[l] = acc[l] + a[l] * v[l];
        }
    }
    let mut sum = fold(acc);
    for i in body..n {
        sum = sum + w[i] * x[i];
    }
    sum
}

multiversion! {
    fn rows_kernel<C: Lane>(weight: Weight<'_, C>, x: &[C], tokens: usize, yt: &mut [C]) -> ()
        = rows_impl;
}

/// The whole matmul: yt (out, tokens), rows in blocks, in parallel for large layers.
pub fn matmul<C: Lane>(weight: Weight<'_, C>, x: &[C], tokens: usize, out: usize) -> Vec<C> {
    let mut yt = vec![C::ZERO; out * tokens];
    if tokens == 0 || out == 0 {
        return yt;
    }
    let per_row = weight.words.len() / out;
    let groups = weight.scales.len() / out;
    let fused = tokens < 4 && fusable(weight.bits, weight.in_features, groups);
    let simd = fused && simd_gemv(x);
    #[cfg(target_arch = "x86_64")]
    let tiled = !fused && tiled_gemm::<C>();
    let permuted = fused.then(|| permute(x, weight.in_features, weight.bits, simd));
    let weight = Weight {
        permuted: permuted.as_deref(),
        ..weight
    };
    let block = |(b, chunk): (usize, &mut [C])| {
        let first = b * ROW_BLOCK;
        let rows = chunk.len() / tokens;
        let part = Weight {
            words: &weight.words[first * per_row..(first + rows) * per_row],
            scales: &weight.scales[first * groups..(first + rows) * groups],
            zeros: weight
                .zeros
                .map(|z| &z[first * groups..(first + rows) * groups]),
            ..weight
        };
        #[cfg(target_arch = "x86_64")]
        if simd || tiled {
            let part = Weight {
                words: part.words,
                scales: f32s(part.scales),
                zeros: part.zeros,
                bits: part.bits,
                in_features: part.in_features,
                permuted: part.permuted.map(f32s),
            };
            // SAFETY: C is f32 (`simd` and `tiled` say so), the chunk too.
            let yt = unsafe {
                std::slice::from_raw_parts_mut(chunk.as_mut_ptr().cast::<f32>(), chunk.len())
            };
            match simd {
                true => avx2::gemv(part, tokens, yt),
                false => avx2::gemm(part, f32s(x), tokens, yt),
            }
            return;
        }
        rows_kernel(part, x, tokens, chunk);
    };
    let chunks = yt.chunks_mut(ROW_BLOCK * tokens).enumerate();
    if tokens * out * weight.in_features >= PARALLEL && rayon::current_num_threads() > 1 {
        chunks.par_bridge().for_each(block);
    } else {
        chunks.for_each(block);
    }
    yt
}

/// RTN quantization of one row (contract: `quantize`), into codes, scales and zeros.
#[inline(always)]
fn quantize_row_impl<C: Lane>(
    w: &[C],
    bits: usize,
    size: usize,
    symmetric: bool,
    codes: &mut [i8],
    scales: &mut [C],
    zeros: &mut [i8],
) {
    let (qmin, qmax) = (-(1i32 << (bits - 1)), (1i32 << (bits - 1)) - 1);
    for (g, group) in w.chunks_exact(size).enumerate() {
        let (mut lo, mut hi) = (C::ZERO, C::ZERO);
        for &v in group {
            lo = if v < lo { v } else { lo };
            hi = if v > hi { v } else { hi };
        }
        let mut s = if symmetric {
            let m = if C::ZERO - lo > hi { C::ZERO - lo } else { hi };
            m / C::from_f64((qmax - qmin) as f64 / 2.0)
        } else {
            (hi - lo) / C::of_i32(qmax - qmin)
        };
        if s == C::ZERO {
            s = C::ONE;
        }
        let z = if symmetric {
            0
        } else {
            (qmin - (lo / s).round_even().to_i32()).clamp(qmin, qmax)
        };
        scales[g] = s;
        zeros[g] = z as i8;
        for (c, &v) in codes[g * size..(g + 1) * size].iter_mut().zip(group) {
            *c = ((v / s).round_even().to_i32() + z).clamp(qmin, qmax) as i8;
        }
    }
}

multiversion! {
    /// `quantize_row_impl` compiled per instruction set (the rounding to even is one
    /// instruction from SSE4.1 on, a library call in baseline x86-64).
    pub fn quantize_row<C: Lane>(
        w: &[C],
        bits: usize,
        size: usize,
        symmetric: bool,
        codes: &mut [i8],
        scales: &mut [C],
        zeros: &mut [i8],
    ) -> () = quantize_row_impl;
}

// ---------------------------------------------------------------------------------
// FP8 weights

fn fp8_format(e5m2: bool) -> Format {
    if e5m2 {
        f8::E5M2
    } else {
        f8::E4M3
    }
}

/// The f32 bits of fp8 code `q`'s value: its exponent and mantissa bits placed at the top
/// of an f32's (an f32 of the value times 2^(b - 127), b the format's bias; subnormal
/// codes land on f32 subnormals) and rebiased by one exact multiplication by
/// 2^(127 - b); the NaN (and e5m2's infinity) codes selected by masks, the sign copied.
/// Branch-free, so that a loop of it vectorises.
#[inline(always)]
fn fp8_bits<const E5M2: bool>(q: u8) -> u32 {
    let mag = (q & 0x7F) as u32;
    let (shift, rebias, room) = if E5M2 {
        (21, f32::from_bits((127 + 127 - 15) << 23), 4)
    } else {
        (20, f32::from_bits((127 + 127 - 7) << 23), 1)
    };
    let bits = (f32::from_bits(mag << shift) * rebias).to_bits();
    // special: mag >= 0x80 - room (e4m3: 0x7F NaN; e5m2: 0x7C infinity, 0x7D-0x7F NaN)
    let special = 0u32.wrapping_sub((mag + room) >> 7);
    let value = if E5M2 {
        0x7F80_0000 | ((mag & 3) << 21)
    } else {
        0x7FC0_0000
    };
    ((bits & !special) | (value & special)) | ((q as u32 & 0x80) << 24)
}

/// One row of fp8 codes as weights fp8(code) * s, rounded once in f32 (the values
/// `dequantize_fp8` gives), in C.
#[inline(always)]
fn decode_row<C: Lane, const E5M2: bool>(codes: &[u8], s: f32, w: &mut [C]) {
    let body = codes.len() - codes.len() % LANES;
    for (q, o) in codes[..body]
        .chunks_exact(LANES)
        .zip(w[..body].chunks_exact_mut(LANES))
    {
        let q: &[u8; LANES] = q.try_into().unwrap();
        let o: &mut [C; LANES] = o.try_into().unwrap();
        for l in 0..LANES {
            o[l] = C::from_elem(f32::from_bits(fp8_bits::<E5M2>(q[l])) * s);
        }
    }
    for (o, &q) in w[body..].iter_mut().zip(&codes[body..]) {
        *o = C::from_elem(f32::from_bits(fp8_bits::<E5M2>(q)) * s);
    }
}

/// What `fp8_rows_impl` reads: a block of rows' codes, their scales (one, per tensor, or
/// one per row) and the format.
#[derive(Clone, Copy)]
pub struct Fp8Weight<'a> {
    pub codes: &'a [u8],
    pub scales: &'a [f32],
    pub fmt: Format,
    pub in_features: usize,
}

#[inline(always)]
fn fp8_rows_impl<C: Lane>(weight: Fp8Weight<'_>, x: &[C], tokens: usize, yt: &mut [C]) {
    let n = weight.in_features;
    let token = |t: usize| &x[t * n..(t + 1) * n];
    let mut w = vec![C::ZERO; n];
    for (o, out) in yt.chunks_exact_mut(tokens).enumerate() {
        let s = weight.scales[if weight.scales.len() > 1 { o } else { 0 }];
        let codes = &weight.codes[o * n..(o + 1) * n];
        if weight.fmt == f8::E5M2 {
            decode_row::<C, true>(codes, s, &mut w);
        } else {
            decode_row::<C, false>(codes, s, &mut w);
        }
        let mut t = 0;
        while t + 4 <= tokens {
            let sums = dot4(&w, [token(t), token(t + 1), token(t + 2), token(t + 3)]);
            out[t..t + 4].copy_from_slice(&sums);
            t += 4;
        }
        for (i, y) in out[t..].iter_mut().enumerate() {
            *y = dot1(&w, token(t + i));
        }
    }
}

multiversion! {
    fn fp8_rows_kernel<C: Lane>(weight: Fp8Weight<'_>, x: &[C], tokens: usize, yt: &mut [C]) -> ()
        = fp8_rows_impl;
}

/// The fp8 matmul: yt (out, tokens) of x (tokens, in), rows in blocks, in parallel for
/// large layers.
pub fn fp8_matmul<C: Lane>(weight: Fp8Weight<'_>, x: &[C], tokens: usize, out: usize) -> Vec<C> {
    let mut yt = vec![C::ZERO; out * tokens];
    if tokens == 0 || out == 0 {
        return yt;
    }
    let n = weight.in_features;
    let per_row = weight.scales.len() > 1;
    #[cfg(target_arch = "x86_64")]
    let simd = tiled_gemm::<C>() && avx2::fp8_available();
    #[cfg(target_arch = "x86_64")]
    let foldable = tokens < 4 && fp8_foldable(x);
    let block = |(b, chunk): (usize, &mut [C])| {
        let first = b * ROW_BLOCK;
        let rows = chunk.len() / tokens;
        let part = Fp8Weight {
            codes: &weight.codes[first * n..(first + rows) * n],
            scales: if per_row {
                &weight.scales[first..first + rows]
            } else {
                weight.scales
            },
            ..weight
        };
        #[cfg(target_arch = "x86_64")]
        if simd {
            // SAFETY: C is f32 (`simd` says so), the chunk too.
            let yt = unsafe {
                std::slice::from_raw_parts_mut(chunk.as_mut_ptr().cast::<f32>(), chunk.len())
            };
            return avx2::fp8_rows(part, f32s(x), tokens, foldable, yt);
        }
        fp8_rows_kernel(part, x, tokens, chunk);
    };
    let chunks = yt.chunks_mut(ROW_BLOCK * tokens).enumerate();
    if tokens * out * n >= PARALLEL && rayon::current_num_threads() > 1 {
        chunks.par_bridge().for_each(block);
    } else {
        chunks.for_each(block);
    }
    yt
}

/// float32 amax |v| / max of the format, 1 where the amax is 0 (`quantize_fp8`'s scale).
fn amax_scale(values: impl Iterator<Item = f32>, fmt: Format) -> f32 {
    let amax = values.fold(0f32, |m, v| m.max(v.abs()));
    let s = amax / f8::decode(fmt.max_code, fmt);
    if s == 0.0 {
        1.0
    } else {
        s
    }
}

// ---------------------------------------------------------------------------------
// Bindings

fn check_bits(bits: usize) -> PyResult<()> {
    if matches!(bits, 2 | 4 | 8) {
        Ok(())
    } else {
        Err(value_error(format!("bits must be 2, 4 or 8, got {bits}")))
    }
}

/// The elements of a C-contiguous 2-D array with its shape.
fn matrix<'a, T: numpy::Element>(
    a: &'a PyReadonlyArray2<'_, T>,
    name: &str,
) -> PyResult<(&'a [T], usize, usize)> {
    let (r, c) = (a.shape()[0], a.shape()[1]);
    Ok((slice(a, name)?, r, c))
}

/// Float array `a` (any float dtype) converted to C, checking it has `len` elements.
fn to_compute<C: Lane>(a: &Bound<'_, PyAny>, name: &str, len: usize) -> PyResult<Vec<C>> {
    with_elem!(dtype_of(a, name)?, S => {
        let arr = float_array::<S>(a, name)?;
        let values = arr
            .as_slice()
            .map_err(|_| value_error(format!("{name} must be a C-contiguous array")))?;
        if values.len() != len {
            return Err(value_error(format!("{name} must have {len} elements, got {}", values.len())));
        }
        let mut out = vec![C::ZERO; len];
        C::widen(values, &mut out);
        Ok(out)
    })
}

/// `quantize`'s result: codes, scales, and zeros (None when symmetric).
type Quantized<'py> = (
    Bound<'py, PyAny>,
    Bound<'py, PyAny>,
    Option<Bound<'py, PyAny>>,
);

/// quantize(weight, bits, group_size, symmetric)
/// --
///
/// `weight` (out, in) C-contiguous of any float dtype, finite; group_size divides in.
/// Returns (codes int8, scales in the compute type, zeros int8 or None).
#[pyfunction]
fn quantize<'py>(
    py: Python<'py>,
    weight: &Bound<'py, PyAny>,
    bits: usize,
    group_size: usize,
    symmetric: bool,
) -> PyResult<Quantized<'py>> {
    check_bits(bits)?;
    with_elem!(dtype_of(weight, "weight")?, E => {
        let arr = float_array::<E>(weight, "weight")?;
        let shape = arr.shape().to_vec();
        if shape.len() != 2 || group_size == 0 || shape[1] % group_size != 0 {
            return Err(value_error(format!(
                "weight must be 2-D with group_size {group_size} dividing its columns, got {shape:?}"
            )));
        }
        let values = arr.as_slice().map_err(|_| value_error("weight must be C-contiguous"))?;
        let (rows, n) = (shape[0], shape[1]);
        let groups = n / group_size;
        let mut codes = vec![0i8; rows * n];
        let mut scales = vec![<E as Elem>::C::ZERO; rows * groups];
        let mut zeros = vec![0i8; rows * groups];
        detached(py, || {
            let mut w = vec![<E as Elem>::C::ZERO; n];
            for r in 0..rows {
                <E as Elem>::C::widen(&values[r * n..(r + 1) * n], &mut w);
                quantize_row(
                    &w,
                    bits,
                    group_size,
                    symmetric,
                    &mut codes[r * n..(r + 1) * n],
                    &mut scales[r * groups..(r + 1) * groups],
                    &mut zeros[r * groups..(r + 1) * groups],
                );
            }
        })?;
        let codes = numpy::PyArray1::from_vec(py, codes).reshape([rows, n])?;
        let scales = numpy::PyArray1::from_vec(py, scales).reshape([rows, groups])?;
        let zeros = if symmetric {
            None
        } else {
            Some(numpy::PyArray1::from_vec(py, zeros).reshape([rows, groups])?.into_any())
        };
        Ok((codes.into_any(), scales.into_any(), zeros))
    })
}

/// dequantize(codes, scales, zeros)
/// --
///
/// `codes` int8 (out, in), `scales` (out, groups) of any float dtype, `zeros` None or
/// int8 (out, groups), all C-contiguous: the weight in the scales' compute type.
#[pyfunction]
fn dequantize<'py>(
    py: Python<'py>,
    codes: PyReadonlyArray2<'py, i8>,
    scales: &Bound<'py, PyAny>,
    zeros: Option<PyReadonlyArray2<'py, i8>>,
) -> PyResult<Bound<'py, PyAny>> {
    let (q, rows, n) = matrix(&codes, "codes")?;
    let z = match &zeros {
        Some(z) => Some(slice(z, "zeros")?),
        None => None,
    };
    fn run<'py, C: Lane + Elem>(
        py: Python<'py>,
        q: &[i8],
        scales: &Bound<'py, PyAny>,
        z: Option<&[i8]>,
        rows: usize,
        n: usize,
    ) -> PyResult<Bound<'py, PyAny>> {
        let shape = scales.cast::<numpy::PyUntypedArray>()?.shape().to_vec();
        let groups = if shape.len() == 2 { shape[1] } else { 0 };
        if shape.len() != 2 || shape[0] != rows || groups == 0 || n % groups != 0 {
            return Err(value_error(format!(
                "scales must have shape ({rows}, groups dividing {n}), got {shape:?}"
            )));
        }
        if z.is_some_and(|z| z.len() != rows * groups) {
            return Err(value_error("zeros must have scales' shape"));
        }
        let s = to_compute::<C>(scales, "scales", rows * groups)?;
        // SAFETY: every element is written below.
        let out = unsafe { new_array::<C>(py, &[rows, n]) };
        {
            let mut w = out.readwrite();
            let wd = w.as_slice_mut()?;
            detached(py, || {
                let mut codes = vec![0i32; n];
                for r in 0..rows {
                    for (c, &v) in codes.iter_mut().zip(&q[r * n..(r + 1) * n]) {
                        *c = v as i32;
                    }
                    let zr = z.map(|z| &z[r * groups..(r + 1) * groups]);
                    scale_row(
                        &codes,
                        &s[r * groups..(r + 1) * groups],
                        zr,
                        &mut wd[r * n..(r + 1) * n],
                    );
                }
            })?;
        }
        Ok(out.into_any())
    }
    if dtype_of(scales, "scales")? == crate::elem::Dtype::F64 {
        run::<f64>(py, q, scales, z, rows, n)
    } else {
        run::<f32>(py, q, scales, z, rows, n)
    }
}

/// pack_int32(codes, bits)
/// --
///
/// `codes` int8 (rows, n) C-contiguous, each in the b-bit range: int32 (rows, ceil(n / k)).
#[pyfunction]
fn pack_int32<'py>(
    py: Python<'py>,
    codes: PyReadonlyArray2<'py, i8>,
    bits: usize,
) -> PyResult<Bound<'py, PyArray2<i32>>> {
    check_bits(bits)?;
    let (q, rows, n) = matrix(&codes, "codes")?;
    let per = 32 / bits;
    let words = n.div_ceil(per);
    let half = 1i32 << (bits - 1);
    if let Some(&bad) = q
        .iter()
        .find(|&&c| (c as i32) < -half || (c as i32) >= half)
    {
        return Err(value_error(format!(
            "codes holds {bad}, outside the {bits}-bit range"
        )));
    }
    let mut out = vec![0i32; rows * words];
    detached(py, || {
        for r in 0..rows {
            let row = &q[r * n..(r + 1) * n];
            for (k, word) in out[r * words..(r + 1) * words].iter_mut().enumerate() {
                let mut value = 0u32;
                for (j, &c) in row[k * per..((k + 1) * per).min(n)].iter().enumerate() {
                    value |= ((c as i32 + half) as u32) << (j * bits);
                }
                *word = value as i32;
            }
        }
    })?;
    numpy::PyArray1::from_vec(py, out).reshape([rows, words])
}

/// unpack_int32(packed, bits, size)
/// --
///
/// `packed` int32 (rows, words) C-contiguous, size filling exactly `words` words: int8
/// (rows, size).
#[pyfunction]
fn unpack_int32<'py>(
    py: Python<'py>,
    packed: PyReadonlyArray2<'py, i32>,
    bits: usize,
    size: usize,
) -> PyResult<Bound<'py, PyArray2<i8>>> {
    check_bits(bits)?;
    let (p, rows, words) = matrix(&packed, "packed")?;
    if size.div_ceil(32 / bits) != words {
        return Err(value_error(format!(
            "size {size} does not fill {words} words"
        )));
    }
    let mut out = vec![0i8; rows * size];
    detached(py, || {
        let mut codes = vec![0i32; size];
        for r in 0..rows {
            decode(bits, &p[r * words..(r + 1) * words], &mut codes);
            for (o, &c) in out[r * size..(r + 1) * size].iter_mut().zip(&codes) {
                *o = c as i8;
            }
        }
    })?;
    numpy::PyArray1::from_vec(py, out).reshape([rows, size])
}

/// dequant_matmul(x, packed, scales, zeros, bits)
/// --
///
/// `x` (tokens, in) of any float dtype, `packed` int32 (out, in * bits / 32), `scales`
/// (out, groups) of any float dtype, `zeros` None or int8 (out, groups), all
/// C-contiguous: y (tokens, out) of x's dtype.
#[pyfunction]
fn dequant_matmul<'py>(
    py: Python<'py>,
    x: &Bound<'py, PyAny>,
    packed: PyReadonlyArray2<'py, i32>,
    scales: &Bound<'py, PyAny>,
    zeros: Option<PyReadonlyArray2<'py, i8>>,
    bits: usize,
) -> PyResult<Bound<'py, PyAny>> {
    check_bits(bits)?;
    let (p, out_features, words) = matrix(&packed, "packed")?;
    let z = match &zeros {
        Some(z) => Some(slice(z, "zeros")?),
        None => None,
    };
    with_elem!(dtype_of(x, "x")?, E => {
        let xa = float_array::<E>(x, "x")?;
        let shape = xa.shape().to_vec();
        let per = 32 / bits;
        if shape.len() != 2 || shape[1] % per != 0 || words != shape[1] / per {
            return Err(value_error(format!(
                "dequant_matmul shapes disagree: x {shape:?}, packed ({out_features}, {words}), {bits} bits"
            )));
        }
        let (tokens, n) = (shape[0], shape[1]);
        let sshape = scales.cast::<numpy::PyUntypedArray>()?.shape().to_vec();
        let groups = if sshape.len() == 2 { sshape[1] } else { 0 };
        if sshape.len() != 2 || sshape[0] != out_features || groups == 0 || n % groups != 0 {
            return Err(value_error(format!(
                "scales must have shape ({out_features}, groups dividing {n}), got {sshape:?}"
            )));
        }
        if z.is_some_and(|z| z.len() != out_features * groups) {
            return Err(value_error("zeros must have scales' shape"));
        }
        let s = to_compute::<<E as Elem>::C>(scales, "scales", out_features * groups)?;
        let xd = xa.as_slice().map_err(|_| value_error("x must be C-contiguous"))?;
        // SAFETY: every element is written below.
        let out = unsafe { new_array::<E>(py, &[tokens, out_features]) };
        {
            let mut w = out.readwrite();
            let yd = w.as_slice_mut()?;
            detached(py, || {
                let mut xs = vec![<E as Elem>::C::ZERO; xd.len()];
                <E as Elem>::C::widen(xd, &mut xs);
                let weight = Weight { words: p, scales: &s, zeros: z, bits, in_features: n, permuted: None };
                let yt = matmul(weight, &xs, tokens, out_features);
                for t in 0..tokens {
                    for o in 0..out_features {
                        yd[t * out_features + o] = E::store(yt[o * tokens + t]);
                    }
                }
            })?;
        }
        Ok(out.into_any())
    })
}

/// quantize_fp8(weight, e5m2, per_channel)
/// --
///
/// `weight` (out, in) C-contiguous of any float dtype, finite, in >= 1: (codes uint8
/// (out, in), scales float32 (out, 1) per channel or (1, 1)).
#[pyfunction]
fn quantize_fp8<'py>(
    py: Python<'py>,
    weight: &Bound<'py, PyAny>,
    e5m2: bool,
    per_channel: bool,
) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>)> {
    let fmt = fp8_format(e5m2);
    with_elem!(dtype_of(weight, "weight")?, E => {
        let arr = float_array::<E>(weight, "weight")?;
        let shape = arr.shape().to_vec();
        if shape.len() != 2 || shape[1] == 0 {
            return Err(value_error(format!("weight must be 2-D with columns, got {shape:?}")));
        }
        let values = arr.as_slice().map_err(|_| value_error("weight must be C-contiguous"))?;
        let (rows, n) = (shape[0], shape[1]);
        let mut codes = vec![0u8; rows * n];
        let srows = if per_channel { rows } else { 1 };
        let mut scales = vec![1f32; srows];
        detached(py, || {
            let w: Vec<f32> = values.iter().map(|v| v.to_f32()).collect();
            if per_channel {
                for (s, row) in scales.iter_mut().zip(w.chunks_exact(n)) {
                    *s = amax_scale(row.iter().copied(), fmt);
                }
            } else {
                scales[0] = amax_scale(w.iter().copied(), fmt);
            }
            for (r, (row, out)) in w.chunks_exact(n).zip(codes.chunks_exact_mut(n)).enumerate() {
                let s = scales[if per_channel { r } else { 0 }];
                for (c, &v) in out.iter_mut().zip(row) {
                    *c = f8::encode(v / s, fmt);
                }
            }
        })?;
        let codes = numpy::PyArray1::from_vec(py, codes).reshape([rows, n])?;
        let scales = numpy::PyArray1::from_vec(py, scales).reshape([srows, 1])?;
        Ok((codes.into_any(), scales.into_any()))
    })
}

/// dequantize_fp8(codes, scales, e5m2)
/// --
///
/// `codes` uint8 (out, in), `scales` (1, 1) or (out, 1) of any float dtype, C-contiguous:
/// the float32 weight fp8(code) * scale.
#[pyfunction]
fn dequantize_fp8<'py>(
    py: Python<'py>,
    codes: PyReadonlyArray2<'py, u8>,
    scales: &Bound<'py, PyAny>,
    e5m2: bool,
) -> PyResult<Bound<'py, PyArray2<f32>>> {
    let fmt = fp8_format(e5m2);
    let (q, rows, n) = matrix(&codes, "codes")?;
    let len = scales.cast::<numpy::PyUntypedArray>()?.len();
    if len != 1 && len != rows {
        return Err(value_error(format!(
            "scales must have 1 or {rows} entries, got {len}"
        )));
    }
    let s = to_compute::<f32>(scales, "scales", len)?;
    let mut out = vec![0f32; rows * n];
    detached(py, || {
        for (r, (row, dst)) in q
            .chunks_exact(n.max(1))
            .zip(out.chunks_exact_mut(n.max(1)))
            .enumerate()
        {
            let scale = s[if len == 1 { 0 } else { r }];
            for (d, &c) in dst.iter_mut().zip(row) {
                *d = f8::decode(c, fmt) * scale;
            }
        }
    })?;
    numpy::PyArray1::from_vec(py, out).reshape([rows, n])
}

/// dequant_matmul_fp8(x, codes, scales, e5m2, input_scale, dynamic)
/// --
///
/// `x` (tokens, in) of any float dtype, `codes` uint8 (out, in), `scales` (1, 1) or
/// (out, 1) of any float dtype, all C-contiguous; `input_scale` the static activation
/// scale or None, `dynamic` None, "tensor" or "token" (the dynamic activation scale's
/// extent): y (tokens, out) of x's dtype.
#[pyfunction]
fn dequant_matmul_fp8<'py>(
    py: Python<'py>,
    x: &Bound<'py, PyAny>,
    codes: PyReadonlyArray2<'py, u8>,
    scales: &Bound<'py, PyAny>,
    e5m2: bool,
    input_scale: Option<f64>,
    dynamic: Option<&str>,
) -> PyResult<Bound<'py, PyAny>> {
    let fmt = fp8_format(e5m2);
    let (q, out_features, n) = matrix(&codes, "codes")?;
    let len = scales.cast::<numpy::PyUntypedArray>()?.len();
    if len != 1 && len != out_features {
        return Err(value_error(format!(
            "scales must have 1 or {out_features} entries, got {len}"
        )));
    }
    let s = to_compute::<f32>(scales, "scales", len)?;
    with_elem!(dtype_of(x, "x")?, E => {
        let xa = float_array::<E>(x, "x")?;
        let shape = xa.shape().to_vec();
        if shape.len() != 2 || shape[1] != n {
            return Err(value_error(format!(
                "dequant_matmul_fp8 shapes disagree: x {shape:?}, codes ({out_features}, {n})"
            )));
        }
        let tokens = shape[0];
        let xd = xa.as_slice().map_err(|_| value_error("x must be C-contiguous"))?;
        // SAFETY: every element is written below.
        let out = unsafe { new_array::<E>(py, &[tokens, out_features]) };
        {
            let mut w = out.readwrite();
            let yd = w.as_slice_mut()?;
            detached(py, || {
                type C = <E as Elem>::C;
                let mut xs = vec![C::ZERO; xd.len()];
                // the activations' scale per token: static, dynamic per tensor or per token
                let per_token: Vec<f32> = match (input_scale, dynamic) {
                    (Some(v), _) => vec![v as f32; tokens],
                    (None, Some("tensor")) => {
                        vec![amax_scale(xd.iter().map(|v| v.to_f32()), fmt); tokens]
                    }
                    (None, Some(_)) => xd
                        .chunks_exact(n.max(1))
                        .map(|row| amax_scale(row.iter().map(|v| v.to_f32()), fmt))
                        .collect(),
                    (None, None) => Vec::new(),
                };
                if per_token.is_empty() {
                    C::widen(xd, &mut xs);
                }
                for (t, &s_x) in per_token.iter().enumerate() {
                    let sc = C::from_f64(s_x as f64);
                    for (d, v) in xs[t * n..(t + 1) * n].iter_mut().zip(&xd[t * n..(t + 1) * n]) {
                        let code = f8::encode(v.to_f32() / s_x, fmt);
                        *d = C::from_f64(f8::decode(code, fmt) as f64) * sc;
                    }
                }
                let weight = Fp8Weight { codes: q, scales: &s, fmt, in_features: n };
                let yt = fp8_matmul(weight, &xs, tokens, out_features);
                for t in 0..tokens {
                    for o in 0..out_features {
                        yd[t * out_features + o] = E::store(yt[o * tokens + t]);
                    }
                }
            })?;
        }
        Ok(out.into_any())
    })
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(quantize_fp8, m)?)?;
    m.add_function(wrap_pyfunction!(dequantize_fp8, m)?)?;
    m.add_function(wrap_pyfunction!(dequant_matmul_fp8, m)?)?;
    m.add_function(wrap_pyfunction!(quantize, m)?)?;
    m.add_function(wrap_pyfunction!(dequantize, m)?)?;
    m.add_function(wrap_pyfunction!(pack_int32, m)?)?;
    m.add_function(wrap_pyfunction!(unpack_int32, m)?)?;
    m.add_function(wrap_pyfunction!(dequant_matmul, m)?)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_each_field_minus_the_offset() {
        // int4: codes 0..8 stored as 8..16 -> nibbles 8, 9, ..., 15
        let word = 0xFEDC_BA98u32 as i32;
        let mut codes = [0i32; 8];
        decode(4, &[word], &mut codes);
        assert_eq!(codes, [0, 1, 2, 3, 4, 5, 6, 7]);
        let mut three = [0i32; 3];
        decode(8, &[0x0180_FF00u32 as i32], &mut three);
        assert_eq!(three, [-128, 127, 0]);
    }

    #[test]
    fn matmul_is_x_times_the_dequantized_rows() {
        // 2 rows, 16 int4 codes each (2 words), 2 groups of 8; 5 tokens (a partial block)
        let codes: Vec<i32> = (0..32).map(|i| (i * 7 % 16) - 8).collect();
        let mut words = vec![0i32; 4];
        for (i, &c) in codes.iter().enumerate() {
            words[i / 8] |= (((c + 8) as u32) << ((i % 8) * 4)) as i32;
        }
        let scales = [0.5f64, 0.25, 2.0, 1.0];
        let zeros = [1i8, -2, 0, 3];
        let x: Vec<f64> = (0..5 * 16).map(|i| (i as f64 * 0.37).sin()).collect();
        let weight = Weight {
            words: &words,
            scales: &scales,
            zeros: Some(&zeros),
            bits: 4,
            in_features: 16,
            permuted: None,
        };
        let yt = matmul(weight, &x, 5, 2);
        for o in 0..2 {
            for t in 0..5 {
                let want: f64 = (0..16)
                    .map(|i| {
                        let g = o * 2 + i / 8;
                        (codes[o * 16 + i] - zeros[g] as i32) as f64 * scales[g] * x[t * 16 + i]
                    })
                    .sum();
                assert!((yt[o * 5 + t] - want).abs() < 1e-12, "{o} {t}");
            }
        }
    }

    #[test]
    fn fused_gemv_equals_the_decoded_rows() {
        // int4 and int8, 3 rows of 256 columns in groups of 128: tokens 1 (fused) and 4
        for bits in [4usize, 8] {
            let (n, rows, per) = (256usize, 3usize, 32 / bits);
            let words: Vec<i32> = (0..rows * n / per)
                .map(|i| (i as u32).wrapping_mul(2_654_435_761) as i32)
                .collect();
            let scales = [0.5f32, 0.25, 2.0, 1.0, 0.125, 3.0];
            let zeros = [1i8, -2, 0, 3, -1, 2];
            let x: Vec<f32> = (0..4 * n).map(|i| (i as f32 * 0.37).sin()).collect();
            let weight = Weight {
                words: &words,
                scales: &scales,
                zeros: Some(&zeros),
                bits,
                in_features: n,
                permuted: None,
            };
            assert!(fusable(bits, n, 2));
            let one = matmul(weight, &x[..n], 1, rows);
            let four = matmul(weight, &x, 4, rows);
            for o in 0..rows {
                let got = one[o];
                let want = four[o * 4];
                assert!(
                    (got - want).abs() <= 1e-4 * want.abs().max(1.0),
                    "{bits} {o}"
                );
            }
        }
    }

    /// (words, scales, zeros, x) of a random layer: `rows` x `n` codes of `bits`, groups
    /// of `group`, `tokens` tokens.
    fn layer(
        bits: usize,
        rows: usize,
        n: usize,
        group: usize,
        tokens: usize,
    ) -> (Vec<i32>, Vec<f32>, Vec<i8>, Vec<f32>) {
        let mut state = 0x2545_F491_4F6C_DD1Du64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let words = (0..rows * n * bits / 32).map(|_| next() as i32).collect();
        let groups = rows * n / group;
        let scales = (0..groups)
            .map(|_| (next() % 1000) as f32 / 997.0 + 0.01)
            .collect();
        let half = 1i64 << (bits - 1);
        let zeros = (0..groups)
            .map(|_| ((next() % (2 * half as u64)) as i64 - half) as i8)
            .collect();
        let x = (0..tokens * n)
            .map(|_| (next() % 2001) as f32 / 1000.0 - 1.0)
            .collect();
        (words, scales, zeros, x)
    }

    #[test]
    fn every_kernel_is_within_the_tolerance_of_the_exact_sum() {
        // the AVX2 GEMV (1-3 tokens, blocks in one group) and tiled GEMM (a partial tile of
        // rows, a partial column block, groups across words, 1-13 tokens), and the
        // portable kernels, against the sum in f64 of the dequantized weights
        let cases = [
            (4usize, 21usize, 256usize, 128usize),
            (8, 19, 320, 320),
            (2, 5, 512, 256),
            (4, 17, 200, 4),
            (8, 3, 136, 68),
        ];
        for (bits, rows, n, group) in cases {
            for tokens in [1usize, 2, 3, 4, 7, 13] {
                let (words, scales, zeros, x) = layer(bits, rows, n, group, tokens);
                let groups = n / group;
                let mut codes = vec![0i32; rows * n];
                for r in 0..rows {
                    let per_row = n * bits / 32;
                    let row = &words[r * per_row..(r + 1) * per_row];
                    decode(bits, row, &mut codes[r * n..(r + 1) * n]);
                }
                let weight = Weight {
                    words: &words,
                    scales: &scales,
                    zeros: Some(&zeros),
                    bits,
                    in_features: n,
                    permuted: None,
                };
                let mut portable = vec![0f32; rows * tokens];
                rows_kernel(weight, &x, tokens, &mut portable);
                let mut results = vec![matmul(weight, &x, tokens, rows), portable];
                if tokens < 4 && fusable(bits, n, groups) {
                    let xp = permute(&x, n, bits, false);
                    let mut fused = vec![0f32; rows * tokens];
                    let permuted = Weight {
                        permuted: Some(&xp),
                        ..weight
                    };
                    rows_kernel(permuted, &x, tokens, &mut fused);
                    results.push(fused);
                }
                for o in 0..rows {
                    for t in 0..tokens {
                        let (mut want, mut mag) = (0f64, 0f64);
                        for i in 0..n {
                            let g = o * groups + i / group;
                            let w = (codes[o * n + i] - zeros[g] as i32) as f32 * scales[g];
                            want += w as f64 * x[t * n + i] as f64;
                            mag += (w as f64 * x[t * n + i] as f64).abs();
                        }
                        for (k, got) in results.iter().enumerate() {
                            let err = (got[o * tokens + t] as f64 - want).abs();
                            assert!(
                                err <= 2e-6 * mag,
                                "{bits} {n} {group} {tokens} {k}: {o} {t}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn tiny_x_takes_the_exact_path() {
        // x below 2^-100 would lose bits scaled by 2^-12 in the AVX2 GEMV: not taken
        let x = [f32::from_bits(1), 1.0];
        assert!(!simd_gemv(&x));
        assert!(!simd_gemv(&[1e-35f32]));
        assert!(!simd_gemv(&[1.0f64]));
        #[cfg(target_arch = "x86_64")]
        assert_eq!(simd_gemv(&[0.0f32, -1e-20, 3.0]), avx2::available());
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn fp8_gemv_folds_the_scale_only_for_x_in_range() {
        assert!(fp8_foldable(&[0.0f32, -1e-20, 3.0, 1e19]));
        assert!(!fp8_foldable(&[1.0f32, 1e-35]));
        assert!(!fp8_foldable(&[f32::from_bits(1)]));
        assert!(!fp8_foldable(&[1.0f32, -1e20]));
        assert!(!fp8_foldable(&[f32::NAN]));
    }

    #[test]
    fn quantize_row_follows_the_formula() {
        let w = [0.0f32, 1.5, -3.0, 0.75];
        let (mut codes, mut scales, mut zeros) = ([0i8; 4], [0f32; 1], [0i8; 1]);
        quantize_row(&w, 4, 4, true, &mut codes, &mut scales, &mut zeros);
        assert_eq!(scales[0], 3.0 / 7.5);
        // 1.5 / 0.4 = 3.75 -> 4; -3 / 0.4 rounds to -7.5 in f32, a tie -> -8 (even)
        assert_eq!(codes, [0, 4, -8, 2]);
        quantize_row(
            &[0.0f32; 4],
            4,
            2,
            false,
            &mut codes,
            &mut [0f32; 2],
            &mut [0i8; 2],
        );
        assert_eq!(codes, [-8; 4]);
    }

    #[test]
    fn fp8_matmul_is_x_times_the_scaled_codes() {
        // 3 rows of 20 codes (a partial LANES block), per-row scales; 1 and 5 tokens
        let n = 20;
        let codes: Vec<u8> = (0..3 * n).map(|i| ((i * 37) % 256) as u8 & 0xF7).collect();
        let scales = [0.5f32, 0.125, 3.0];
        let x: Vec<f64> = (0..5 * n).map(|i| (i as f64 * 0.37).sin()).collect();
        let weight = Fp8Weight {
            codes: &codes,
            scales: &scales,
            fmt: f8::E4M3,
            in_features: n,
        };
        for tokens in [1usize, 5] {
            let yt = fp8_matmul(weight, &x, tokens, 3);
            for o in 0..3 {
                for t in 0..tokens {
                    let want: f64 = (0..n)
                        .map(|i| {
                            let w = f8::decode(codes[o * n + i], f8::E4M3) * scales[o];
                            w as f64 * x[t * n + i]
                        })
                        .sum();
                    assert!((yt[o * tokens + t] - want).abs() < 1e-9, "{o} {t}");
                }
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn fp8_simd_decode_is_every_codes_value_times_the_scale() {
        // all 256 codes of both formats (NaN codes in blocks of their own and among
        // others, a partial block at the end), scales normal, subnormal and 2^121 (s 2^8
        // overflows), bit for bit
        if !avx2::fp8_available() {
            return;
        }
        let mut codes: Vec<u8> = (0..=255).collect();
        codes.extend((0..=255u8).rev().step_by(3));
        for s in [1.0f32, 0.37, 3.0e-5, 1.0e-40, 2f32.powi(121), 0.0] {
            for fmt in [f8::E4M3, f8::E5M2] {
                let mut w = vec![0f32; codes.len()];
                // SAFETY: fp8_available() (checked above).
                unsafe {
                    match fmt == f8::E5M2 {
                        true => avx2::fp8_decode::<true>(&codes, s, &mut w),
                        false => avx2::fp8_decode::<false>(&codes, s, &mut w),
                    }
                }
                for (&c, &got) in codes.iter().zip(&w) {
                    let want = f8::decode(c, fmt) * s;
                    assert!(
                        got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                        "{c:#x} {s} {}: {got} {want}",
                        fmt.bias
                    );
                }
            }
        }
    }

    #[test]
    fn fp8_kernels_agree_with_the_portable_rows() {
        // the AVX2 GEMV (1-3 tokens) and tiled GEMM against the portable kernel on f32: a
        // partial tile of rows, partial blocks of 16 and of KC columns, per-row and
        // per-tensor scales; a row holding e4m3fn's NaN code gives NaN, e5m2's infinity
        // infinity (or NaN against a zero x)
        for (fmt, rows, n) in [
            (f8::E4M3, 21usize, 300usize),
            (f8::E5M2, 19, 129),
            (f8::E4M3, 3, 7),
        ] {
            let mut codes: Vec<u8> = (0..rows * n)
                .map(|i| ((i * 73 + i / 7) % 256) as u8)
                .map(|c| {
                    if f8::decode(c, fmt).is_finite() {
                        c
                    } else {
                        c & 0x3F
                    }
                })
                .collect();
            codes[n + n / 2] = if fmt == f8::E5M2 { 0x7C } else { 0xFF };
            for per_row in [true, false] {
                let scales: Vec<f32> = (0..if per_row { rows } else { 1 })
                    .map(|r| 0.01 + r as f32 * 0.37)
                    .collect();
                let weight = Fp8Weight {
                    codes: &codes,
                    scales: &scales,
                    fmt,
                    in_features: n,
                };
                for tokens in [1usize, 2, 3, 4, 7, 13] {
                    let mut x: Vec<f32> = (0..tokens * n)
                        .map(|i| ((i as f32) * 0.61).sin() * 3.0)
                        .collect();
                    if per_row {
                        x[n / 3] = 1e-35; // not `fp8_foldable`: tiles for 1-3 tokens too
                    }
                    let mut want = vec![0f32; rows * tokens];
                    fp8_rows_kernel(weight, &x, tokens, &mut want);
                    let got = fp8_matmul(weight, &x, tokens, rows);
                    for o in 0..rows {
                        let mag: f32 = (0..n)
                            .map(|i| {
                                (f8::decode(codes[o * n + i], fmt)
                                    * scales[if per_row { o } else { 0 }])
                                .abs()
                                    * 3.0
                            })
                            .sum();
                        for t in 0..tokens {
                            let (g, w) = (got[o * tokens + t], want[o * tokens + t]);
                            let same = g == w || (g.is_nan() && w.is_nan());
                            let tol = 2.0 * n as f32 * f32::EPSILON * mag;
                            assert!(
                                same || (g - w).abs() <= tol,
                                "{} {o} {t} {tokens}: {g} {w}",
                                fmt.bias
                            );
                            if o == 1 {
                                assert!(!g.is_finite(), "{} {t} {tokens}: {g}", fmt.bias);
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn decode_row_is_every_codes_value_times_the_scale() {
        let codes: Vec<u8> = (0..=255).collect();
        for s in [1.0f32, 0.37, 3.0e-5] {
            let (mut w4, mut w5) = (vec![0f32; 256], vec![0f32; 256]);
            decode_row::<f32, false>(&codes, s, &mut w4);
            decode_row::<f32, true>(&codes, s, &mut w5);
            for (c, (a, b)) in w4.iter().zip(&w5).enumerate() {
                let (wa, wb) = (
                    f8::decode(c as u8, f8::E4M3) * s,
                    f8::decode(c as u8, f8::E5M2) * s,
                );
                assert!(
                    a.to_bits() == wa.to_bits() || (a.is_nan() && wa.is_nan()),
                    "e4m3 {c}"
                );
                assert!(
                    b.to_bits() == wb.to_bits() || (b.is_nan() && wb.is_nan()),
                    "e5m2 {c}"
                );
            }
        }
    }
}
