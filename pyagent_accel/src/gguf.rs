//! Kernels of `pyagent_accel.ops.gguf` (llama.cpp's block formats Q8_0, Q4_0, Q4_K, Q6_K)
//! and their Python bindings (contract: `pyagent_ref.ops.gguf`).
//!
//! `gguf_dequantize` decodes each block with the contract's float32 operations in its
//! order (fp16 fields exact, `(d * sc) * q - dmin * m` for Q4_K, ...), so it gives the
//! reference's bits. `gguf_matmul` is fused: each output row's blocks are decoded one at a
//! time into a buffer of at most 256 weights (the values `dequantize` gives) and dotted
//! with every token's slice of x, summed in the compute type (f32, f64 for float64 x) in
//! lanes; the float weight matrix is never built. Rows run in parallel for large layers.
//! Sums run in another order than BLAS's: within the specification's tolerance.
//!
//! `gguf_quantize` is llama.cpp's reference quantizers (make_qkx2_quants for Q4_K,
//! make_qx_quants for Q6_K) with the contract's float32 steps in the same order (no
//! fused multiply-add, ties to even), blocks in parallel: the reference's bytes.

use half::f16;
use numpy::{PyArray2, PyReadonlyArray2, PyUntypedArrayMethods};
use pyo3::prelude::*;
use rayon::prelude::*;

use crate::py_util::{detached, slice, value_error};

/// Multiply-adds below which `gguf_matmul` stays on the calling thread.
const PARALLEL: usize = 1 << 18;
/// Output rows per task of the thread pool.
const ROW_BLOCK: usize = 8;

/// (block_size, type_size) of a format name.
fn sizes(fmt: &str) -> PyResult<(usize, usize)> {
    match fmt {
        "Q8_0" => Ok((32, 34)),
        "Q4_0" => Ok((32, 18)),
        "Q4_K" => Ok((256, 144)),
        "Q6_K" => Ok((256, 210)),
        _ => Err(value_error(format!(
            "fmt must be one of ('Q8_0', 'Q4_0', 'Q4_K', 'Q6_K'), got '{fmt}'"
        ))),
    }
}

fn half(b: &[u8], at: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[at], b[at + 1]])).to_f32()
}

/// Q4_K's six-bit (sc, m) of sub-block s from its 12 scale bytes.
fn k4_scale(q: &[u8], s: usize) -> (f32, f32) {
    if s < 4 {
        ((q[s] & 63) as f32, (q[s + 4] & 63) as f32)
    } else {
        let sc = (q[s + 4] & 15) | ((q[s - 4] >> 6) << 4);
        let m = (q[s + 4] >> 4) | ((q[s] >> 6) << 4);
        (sc as f32, m as f32)
    }
}

/// The weights of one block `b` (type_size bytes) into `w` (block_size floats).
fn decode_block(fmt: &str, b: &[u8], w: &mut [f32]) {
    match fmt {
        "Q8_0" => {
            let d = half(b, 0);
            for k in 0..32 {
                w[k] = d * (b[2 + k] as i8) as f32;
            }
        }
        "Q4_0" => {
            let d = half(b, 0);
            for j in 0..16 {
                w[j] = d * ((b[2 + j] & 15) as i32 - 8) as f32;
                w[j + 16] = d * ((b[2 + j] >> 4) as i32 - 8) as f32;
            }
        }
        "Q4_K" => {
            let (d, dmin) = (half(b, 0), half(b, 2));
            let (scales, qs) = (&b[4..16], &b[16..144]);
            for s in 0..8 {
                let (sc, m) = k4_scale(scales, s);
                let (scale, shift) = (d * sc, dmin * m);
                let (c, high) = (s / 2, s % 2 == 1);
                for l in 0..32 {
                    let byte = qs[32 * c + l];
                    let q = if high { byte >> 4 } else { byte & 15 };
                    w[32 * s + l] = scale * q as f32 - shift;
                }
            }
        }
        _ => {
            // Q6_K: ql 128 | qh 64 | sc 16 (int8) | d
            let d = half(b, 208);
            for k in 0..256 {
                let (h, e) = (k / 128, k % 128);
                let (t, l) = (e / 32, e % 32);
                let low = (b[64 * h + l + 32 * (t % 2)] >> (4 * (t / 2))) & 15;
                let high = (b[128 + 32 * h + l] >> (2 * t)) & 3;
                let sc = (b[192 + k / 16] as i8) as f32;
                w[k] = (d * sc) * ((low | (high << 4)) as i32 - 32) as f32;
            }
        }
    }
}

/// Every row of `raw` (rows, blocks * type_size) decoded into `out` (rows, blocks * size).
fn dequantize_all(fmt: &str, raw: &[u8], out: &mut [f32], block: (usize, usize)) {
    let (size, type_size) = block;
    for (b, w) in raw.chunks_exact(type_size).zip(out.chunks_exact_mut(size)) {
        decode_block(fmt, b, w);
    }
}

/// A float the fused dot accumulates in (f32 or f64).
trait Acc:
    Copy + Send + Sync + Default + std::ops::Add<Output = Self> + std::ops::Mul<Output = Self>
{
    fn of(v: f32) -> Self;
}
impl Acc for f32 {
    fn of(v: f32) -> f32 {
        v
    }
}
impl Acc for f64 {
    fn of(v: f32) -> f64 {
        v as f64
    }
}

/// sum_i w[i] * x[i] in eight lanes.
fn dot<C: Acc>(w: &[f32], x: &[C]) -> C {
    let mut lanes = [C::default(); 8];
    let (wc, xc) = (w.chunks_exact(8), x.chunks_exact(8));
    let (wr, xr) = (wc.remainder(), xc.remainder());
    for (a, b) in wc.zip(xc) {
        for j in 0..8 {
            lanes[j] = lanes[j] + C::of(a[j]) * b[j];
        }
    }
    let mut acc = C::default();
    for (a, b) in wr.iter().zip(xr) {
        acc = acc + C::of(*a) * *b;
    }
    lanes.iter().fold(acc, |s, &v| s + v)
}

/// y[t, o] for the output rows `rows` (y_rows: those rows' outputs, row-major by row).
#[allow(clippy::too_many_arguments)]
fn matmul_rows<C: Acc>(
    fmt: &str,
    raw: &[u8],
    x: &[C],
    tokens: usize,
    n: usize,
    block: (usize, usize),
    first_row: usize,
    y_rows: &mut [C],
) {
    let (size, type_size) = block;
    let blocks = n / size;
    let mut w = [0f32; 256];
    for (r, out) in y_rows.chunks_exact_mut(tokens).enumerate() {
        out.fill(C::default());
        let row = &raw[(first_row + r) * blocks * type_size..][..blocks * type_size];
        for (j, b) in row.chunks_exact(type_size).enumerate() {
            decode_block(fmt, b, &mut w[..size]);
            for (t, acc) in out.iter_mut().enumerate() {
                *acc = *acc + dot(&w[..size], &x[t * n + j * size..][..size]);
            }
        }
    }
}

/// y (out, tokens), transposed by the caller.
fn matmul<C: Acc>(
    fmt: &str,
    raw: &[u8],
    x: &[C],
    tokens: usize,
    n: usize,
    out: usize,
    block: (usize, usize),
) -> Vec<C> {
    let mut y = vec![C::default(); out * tokens];
    if tokens == 0 || out == 0 {
        return y;
    }
    if out * n * tokens < PARALLEL {
        matmul_rows(fmt, raw, x, tokens, n, block, 0, &mut y);
    } else {
        y.par_chunks_mut(ROW_BLOCK * tokens)
            .enumerate()
            .for_each(|(i, chunk)| {
                matmul_rows(fmt, raw, x, tokens, n, block, i * ROW_BLOCK, chunk);
            });
    }
    y
}

/// A tensor's blocks: (bytes, rows, blocks per row, the format's `sizes`).
type RawMatrix<'a> = (&'a [u8], usize, usize, (usize, usize));

fn raw_matrix<'a>(raw: &'a PyReadonlyArray2<'_, u8>, fmt: &str) -> PyResult<RawMatrix<'a>> {
    let block = sizes(fmt)?;
    let shape = raw.shape();
    if shape[1] == 0 || shape[1] % block.1 != 0 {
        return Err(value_error(format!(
            "raw must have shape (rows, blocks * {}) for {fmt}, got ({}, {})",
            block.1, shape[0], shape[1]
        )));
    }
    Ok((slice(raw, "raw")?, shape[0], shape[1] / block.1, block))
}

/// The float32 weight of a GGUF tensor's blocks (validated by the Python wrapper).
#[pyfunction]
fn gguf_dequantize<'py>(
    py: Python<'py>,
    raw: PyReadonlyArray2<'py, u8>,
    fmt: &str,
) -> PyResult<Bound<'py, PyArray2<f32>>> {
    let (data, rows, blocks, block) = raw_matrix(&raw, fmt)?;
    let columns = blocks * block.0;
    let fmt = fmt.to_owned();
    let out = detached(py, || {
        let mut out = vec![0f32; rows * columns];
        dequantize_all(&fmt, data, &mut out, block);
        out
    })?;
    Ok(numpy::ndarray::Array2::from_shape_vec((rows, columns), out)
        .expect("rows * columns values")
        .into_pyarray(py))
}

/// y = x @ W^T, x float32 or float64 (tokens, in), W the blocks of `raw` (out, ...); the
/// result in x's dtype.
#[pyfunction]
fn gguf_matmul<'py>(
    py: Python<'py>,
    x: &Bound<'py, PyAny>,
    raw: PyReadonlyArray2<'py, u8>,
    fmt: &str,
) -> PyResult<Bound<'py, PyAny>> {
    let (data, out, blocks, block) = raw_matrix(&raw, fmt)?;
    let fmt = fmt.to_owned();
    macro_rules! run {
        ($t:ty) => {{
            let xa = x.extract::<PyReadonlyArray2<'py, $t>>()?;
            let shape = xa.shape().to_vec();
            if shape[1] != blocks * block.0 {
                return Err(value_error(format!(
                    "raw's {blocks} {fmt} blocks a row hold {} weights, x has in_features {}",
                    blocks * block.0,
                    shape[1]
                )));
            }
            let xs = slice(&xa, "x")?;
            let (tokens, n) = (shape[0], shape[1]);
            let y = detached(py, || matmul::<$t>(&fmt, data, xs, tokens, n, out, block))?;
            let yt = numpy::ndarray::Array2::from_shape_vec((out, tokens), y)
                .expect("out * tokens values")
                .reversed_axes();
            Ok(yt
                .as_standard_layout()
                .into_owned()
                .into_pyarray(py)
                .into_any())
        }};
    }
    if x.extract::<PyReadonlyArray2<'py, f64>>().is_ok() {
        run!(f64)
    } else {
        run!(f32)
    }
}

// --- llama.cpp's reference quantizers, the contract's float32 steps in its order ---------

fn f16_bytes(v: f32) -> [u8; 2] {
    f16::from_f32(v).to_bits().to_le_bytes()
}

fn clamp_rint(v: f32, lo: f32, hi: f32) -> f32 {
    v.round_ties_even().clamp(lo, hi)
}

/// The first entry of largest magnitude (0 when all are 0).
fn first_absmax(x: &[f32]) -> f32 {
    let (mut best, mut value) = (-1f32, 0f32);
    for &v in x {
        if v.abs() > best {
            best = v.abs();
            value = v;
        }
    }
    value
}

/// make_qkx2_quants(32, 15, x, w, -1, 0.1, 20): (scale, the_min, codes).
fn qkx2(x: &[f32], w: &[f32], codes: &mut [f32]) -> (f32, f32) {
    let n = x.len();
    let (mut lo, mut hi, mut sum_w, mut sum_x) = (x[0], x[0], w[0], w[0] * x[0]);
    for i in 1..n {
        lo = lo.min(x[i]);
        hi = hi.max(x[i]);
        sum_w += w[i];
        sum_x += w[i] * x[i];
    }
    if lo > 0.0 {
        lo = 0.0;
    }
    if hi == lo {
        codes.fill(0.0);
        return (0.0, -lo);
    }
    let span = hi - lo;
    let iscale = 15f32 / span;
    let mut scale = 1f32 / iscale;
    for i in 0..n {
        codes[i] = clamp_rint(iscale * (x[i] - lo), 0.0, 15.0);
    }
    let mut best = 0f32;
    for i in 0..n {
        let diff = scale * codes[i] + lo - x[i];
        best += w[i] * (diff * diff);
    }
    let mut trial = [0f32; 32];
    for step in 0..21 {
        let numerator = (-1f32 + 0.1f32 * step as f32) + 15f32;
        let is = numerator / span;
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0f32, 0f32, 0f32);
        for i in 0..n {
            trial[i] = clamp_rint(is * (x[i] - lo), 0.0, 15.0);
            let wl = w[i] * trial[i];
            sum_l += wl;
            sum_l2 += wl * trial[i];
            sum_xl += wl * x[i];
        }
        let det = sum_w * sum_l2 - sum_l * sum_l;
        if det <= 0.0 {
            continue;
        }
        let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
        let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
        if this_min > 0.0 {
            this_min = 0.0;
            this_scale = sum_xl / if sum_l2 > 0.0 { sum_l2 } else { 1.0 };
        }
        let mut error = 0f32;
        for i in 0..n {
            let diff = this_scale * trial[i] + this_min - x[i];
            error += w[i] * (diff * diff);
        }
        if error < best {
            codes.copy_from_slice(&trial[..n]);
            best = error;
            scale = this_scale;
            lo = this_min;
        }
    }
    (scale, -lo)
}

/// make_qx_quants(16, 32, x, rmse_type 1): (scale, codes + 32).
fn qx(x: &[f32], codes: &mut [f32]) -> f32 {
    let top = first_absmax(x);
    if top.abs() < 1e-15f32 {
        codes.fill(0.0);
        return 0.0;
    }
    let sums = |q: &[f32]| {
        let (mut lx, mut l2) = (0f32, 0f32);
        for i in 0..x.len() {
            let wi = x[i] * x[i];
            lx += wi * x[i] * q[i];
            l2 += wi * q[i] * q[i];
        }
        (lx, l2)
    };
    let iscale = -32f32 / top;
    for i in 0..x.len() {
        codes[i] = clamp_rint(iscale * x[i], -32.0, 31.0);
    }
    let (lx, l2) = sums(codes);
    let mut scale = if l2 > 0.0 { lx / l2 } else { 0.0 };
    let mut best = scale * lx;
    let mut trial = [0f32; 16];
    for step in (-9i32..0).chain(1..10) {
        let is = -(32f32 + 0.1f32 * step as f32) / top;
        for i in 0..x.len() {
            trial[i] = clamp_rint(is * x[i], -32.0, 31.0);
        }
        let (lx, l2) = sums(&trial[..x.len()]);
        if l2 > 0.0 && lx * lx > best * l2 {
            codes.copy_from_slice(&trial[..x.len()]);
            scale = lx / l2;
            best = scale * lx;
        }
    }
    for c in codes.iter_mut() {
        *c += 32.0;
    }
    scale
}

/// One block of float32 weights `x` into `out` (type_size bytes).
fn encode_block(fmt: &str, x: &[f32], out: &mut [u8]) {
    match fmt {
        "Q8_0" => {
            let d = x.iter().fold(0f32, |m, v| m.max(v.abs())) / 127f32;
            let id = if d == 0.0 { 0.0 } else { 1f32 / d };
            out[..2].copy_from_slice(&f16_bytes(d));
            for k in 0..32 {
                out[2 + k] = ((x[k] * id).round() as i8) as u8;
            }
        }
        "Q4_0" => {
            let d = first_absmax(x) / -8f32;
            let id = if d == 0.0 { 0.0 } else { 1f32 / d };
            out[..2].copy_from_slice(&f16_bytes(d));
            let q = |k: usize| (x[k] * id + 8.5f32).floor().clamp(0.0, 15.0) as u8;
            for j in 0..16 {
                out[2 + j] = q(j) | (q(j + 16) << 4);
            }
        }
        "Q4_K" => encode_q4_k(x, out),
        _ => encode_q6_k(x, out),
    }
}

fn encode_q4_k(x: &[f32], out: &mut [u8]) {
    let (mut scales, mut mins, mut codes) = ([0f32; 8], [0f32; 8], [0f32; 256]);
    for s in 0..8 {
        let sub = &x[32 * s..32 * s + 32];
        let mut sum_x2 = 0f32;
        for &v in sub {
            sum_x2 += v * v;
        }
        let av_x = (sum_x2 / 32f32).sqrt();
        let mut w = [0f32; 32];
        for i in 0..32 {
            w[i] = av_x + sub[i].abs();
        }
        (scales[s], mins[s]) = qkx2(sub, &w, &mut codes[32 * s..32 * s + 32]);
    }
    let positive = |v: &[f32; 8]| {
        let m = v.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
        if m > 0.0 {
            m
        } else {
            0.0
        }
    };
    let (max_scale, max_min) = (positive(&scales), positive(&mins));
    let inv_scale = if max_scale > 0.0 {
        63f32 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63f32 / max_min } else { 0.0 };
    let sc: Vec<u8> = scales
        .iter()
        .map(|&v| clamp_rint(inv_scale * v, 0.0, 63.0) as u8)
        .collect();
    let m: Vec<u8> = mins
        .iter()
        .map(|&v| clamp_rint(inv_min * v, 0.0, 63.0) as u8)
        .collect();
    let (d16, dmin16) = (f16_bytes(max_scale / 63f32), f16_bytes(max_min / 63f32));
    out[0..2].copy_from_slice(&d16);
    out[2..4].copy_from_slice(&dmin16);
    let (d, dmin) = (half(out, 0), half(out, 2));
    for s in 0..8 {
        let (ds, shift) = (d * sc[s] as f32, dmin * m[s] as f32);
        if ds != 0.0 {
            for i in 32 * s..32 * s + 32 {
                codes[i] = clamp_rint((x[i] + shift) / ds, 0.0, 15.0);
            }
        }
    }
    for s in 0..4 {
        out[4 + s] = sc[s] | ((sc[s + 4] >> 4) << 6);
        out[8 + s] = m[s] | ((m[s + 4] >> 4) << 6);
        out[12 + s] = (sc[s + 4] & 15) | ((m[s + 4] & 15) << 4);
    }
    for c in 0..4 {
        for l in 0..32 {
            out[16 + 32 * c + l] = codes[64 * c + l] as u8 | ((codes[64 * c + 32 + l] as u8) << 4);
        }
    }
}

fn encode_q6_k(x: &[f32], out: &mut [u8]) {
    let (mut scales, mut codes) = ([0f32; 16], [0f32; 256]);
    for s in 0..16 {
        scales[s] = qx(&x[16 * s..16 * s + 16], &mut codes[16 * s..16 * s + 16]);
    }
    let top = first_absmax(&scales);
    out.fill(0);
    if top.abs() < 1e-15f32 {
        return;
    }
    let iscale = -128f32 / top;
    out[208..210].copy_from_slice(&f16_bytes(1f32 / iscale));
    let d = half(out, 208);
    for s in 0..16 {
        let sc = (iscale * scales[s]).round_ties_even().min(127.0) as i32;
        out[192 + s] = sc as i8 as u8;
        let ds = d * sc as f32;
        if ds != 0.0 {
            for i in 16 * s..16 * s + 16 {
                codes[i] = clamp_rint(x[i] / ds, -32.0, 31.0) + 32.0;
            }
        }
    }
    for h in 0..2 {
        for l in 0..32 {
            let q = |t: usize| codes[128 * h + 32 * t + l] as u8;
            out[64 * h + l] = (q(0) & 15) | ((q(2) & 15) << 4);
            out[64 * h + 32 + l] = (q(1) & 15) | ((q(3) & 15) << 4);
            out[128 + 32 * h + l] =
                (q(0) >> 4) | ((q(1) >> 4) << 2) | ((q(2) >> 4) << 4) | ((q(3) >> 4) << 6);
        }
    }
}

/// llama.cpp's reference quantization of float32 rows (validated by the Python wrapper).
#[pyfunction]
fn gguf_quantize<'py>(
    py: Python<'py>,
    weight: PyReadonlyArray2<'py, f32>,
    fmt: &str,
) -> PyResult<Bound<'py, PyArray2<u8>>> {
    let (size, type_size) = sizes(fmt)?;
    let shape = weight.shape().to_vec();
    if shape[1] == 0 || shape[1] % size != 0 {
        return Err(value_error(format!(
            "weight rows must be whole {fmt} blocks, got {shape:?}"
        )));
    }
    let x = slice(&weight, "weight")?;
    let (rows, row_bytes) = (shape[0], shape[1] / size * type_size);
    let fmt = fmt.to_owned();
    let out = detached(py, || {
        let mut out = vec![0u8; rows * row_bytes];
        out.par_chunks_mut(type_size)
            .zip(x.par_chunks(size))
            .for_each(|(o, b)| encode_block(&fmt, b, o));
        out
    })?;
    Ok(
        numpy::ndarray::Array2::from_shape_vec((rows, row_bytes), out)
            .expect("rows * row_bytes values")
            .into_pyarray(py),
    )
}

use numpy::IntoPyArray;

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(gguf_quantize, m)?)?;
    m.add_function(wrap_pyfunction!(gguf_dequantize, m)?)?;
    m.add_function(wrap_pyfunction!(gguf_matmul, m)?)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_hand_made_blocks() {
        let h = f16::from_f32(0.5).to_bits().to_le_bytes();
        let mut q4 = vec![h[0], h[1]];
        q4.extend(std::iter::repeat_n(0x97u8, 16)); // low 7, high 9
        let mut w = [0f32; 32];
        decode_block("Q4_0", &q4, &mut w);
        assert_eq!(&w[..16], &[-0.5; 16]);
        assert_eq!(&w[16..], &[0.5; 16]);
        let mut q8 = vec![h[0], h[1]];
        q8.extend((0..32).map(|i| (i as i8 - 16) as u8));
        decode_block("Q8_0", &q8, &mut w);
        assert_eq!(w[0], -8.0);
        assert_eq!(w[31], 7.5);
    }

    #[test]
    fn matmul_is_x_times_the_decoded_rows() {
        let d = f16::from_f32(0.25).to_bits().to_le_bytes();
        let mut raw = Vec::new();
        for r in 0..3u8 {
            raw.extend([d[0], d[1]]);
            raw.extend(
                (0..32u8)
                    .map(|k| ((k + r) % 16) | (((k * 3 + r) % 16) << 4))
                    .take(16),
            );
        }
        let x: Vec<f32> = (0..64).map(|i| (i as f32 - 30.0) / 8.0).collect();
        let y = matmul::<f32>("Q4_0", &raw, &x, 2, 32, 3, (32, 18));
        let mut w = vec![0f32; 96];
        dequantize_all("Q4_0", &raw, &mut w, (32, 18));
        for o in 0..3 {
            for t in 0..2 {
                let want: f32 = (0..32).map(|i| w[o * 32 + i] * x[t * 32 + i]).sum();
                assert!((y[o * 2 + t] - want).abs() < 1e-4);
            }
        }
    }
}
