//! Kernels of `pyagent_accel.ops.rope` (rotary position embeddings) and their Python
//! bindings (contract: `pyagent_ref.ops.rope`).
//!
//! `inv_freq` evaluates each rope type's frequencies in f64 and rounds them to f32 once
//! (the reference computes in f32; the two agree within a few f32 ulps, as the
//! specification allows). `apply_rope` follows the reference operation for operation:
//! the angle `p * inv_freq[i]` in f32, cos and sin (computed in f64 and rounded to f32,
//! so nearly always the correctly rounded value, which numpy's and torch's float32
//! cos/sin give most of the time), times `scale` in f32, rounded to the input dtype, and
//! each product and sum of the rotation in the input dtype. `apply_mrope` is the same
//! kernel with the pairs cut into sections, each turned by its own position.

// the kernels take the sections beside the positions (and `multiversion!` copies them)
#![allow(clippy::too_many_arguments)]

use numpy::{PyArray1, PyArrayMethods, PyReadonlyArray1, PyReadonlyArray2, PyUntypedArrayMethods};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use rayon::prelude::*;

use crate::elem::{dtype_of, float_array, new_array, rows, with_elem, Elem};
use crate::float::{multiversion, Float};
use crate::py_util::{detached, readonly, value_error};

// ---------------------------------------------------------------------------------
// Inverse frequencies

/// A rope type's parameters (HF `rope_scaling`), as the Python wrapper resolves them:
/// "dynamic" arrives as `Default` with its rescaled theta; "yarn" is built by `Yarn`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Scaling {
    Default,
    Linear {
        factor: f64,
    },
    Llama3 {
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_max: f64,
    },
    /// Interpolation blended into extrapolation between pair indices `low` and `high`.
    Yarn {
        factor: f64,
        low: f64,
        high: f64,
    },
}

impl Scaling {
    /// The scaling of `rope_type` with its parameters in the order the variants list them.
    pub fn new(rope_type: &str, params: &[f64]) -> Result<Scaling, String> {
        match (rope_type, params) {
            ("default", []) => Ok(Scaling::Default),
            ("linear", &[factor]) => Ok(Scaling::Linear { factor }),
            ("llama3", &[factor, low_freq_factor, high_freq_factor, original_max]) => {
                Ok(Scaling::Llama3 {
                    factor,
                    low_freq_factor,
                    high_freq_factor,
                    original_max,
                })
            }
            _ => Err(format!(
                "unknown rope type {rope_type:?} with parameters {params:?}"
            )),
        }
    }
}

/// yarn's `rope_scaling`, its defaults filled in by the Python wrapper as the reference
/// reads them (`mscale` and `mscale_all_dim` 0 when not given).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Yarn {
    pub factor: f64,
    pub original_max: f64,
    pub beta_fast: f64,
    pub beta_slow: f64,
    pub truncate: bool,
    pub attention_factor: Option<f64>,
    pub mscale: f64,
    pub mscale_all_dim: f64,
}

impl Yarn {
    /// From the wrapper's parameters [factor, original_max, beta_fast, beta_slow,
    /// truncate (0 or 1), mscale, mscale_all_dim].
    pub fn new(params: &[f64], attention_factor: Option<f64>) -> Result<Yarn, String> {
        match *params {
            [factor, original_max, beta_fast, beta_slow, truncate, mscale, mscale_all_dim] => {
                Ok(Yarn {
                    factor,
                    original_max,
                    beta_fast,
                    beta_slow,
                    truncate: truncate != 0.0,
                    attention_factor,
                    mscale,
                    mscale_all_dim,
                })
            }
            _ => Err(format!("yarn takes 7 parameters, got {params:?}")),
        }
    }

    /// The ramp of `inv_freq`: interpolation takes over between the pair indices where
    /// the frequencies turn beta_fast and beta_slow times over original_max positions
    /// (floored and ceiled when `truncate`), clamped to [0, rotary_dim - 1].
    pub fn scaling(&self, rotary_dim: usize, theta: f64) -> Scaling {
        let d = rotary_dim as f64;
        let correction_dim = |rotations: f64| {
            d * (self.original_max / (rotations * 2.0 * std::f64::consts::PI)).ln()
                / (2.0 * theta.ln())
        };
        let (mut low, mut high) = (
            correction_dim(self.beta_fast),
            correction_dim(self.beta_slow),
        );
        if self.truncate {
            (low, high) = (low.floor(), high.ceil());
        }
        (low, high) = (low.max(0.0), high.min(d - 1.0));
        if low == high {
            high += 0.001; // avoid dividing by zero in the ramp
        }
        Scaling::Yarn {
            factor: self.factor,
            low,
            high,
        }
    }

    /// The cos/sin scale: attention_factor if given, else 0.1 m ln(factor) + 1 (1 for
    /// factor <= 1) with m = 1, or the ratio of that for mscale and for mscale_all_dim
    /// when both are given (non-zero).
    pub fn attention_scale(&self) -> f64 {
        let mscale = |m: f64| {
            if self.factor <= 1.0 {
                1.0
            } else {
                0.1 * m * self.factor.ln() + 1.0
            }
        };
        match self.attention_factor {
            Some(a) => a,
            None if self.mscale != 0.0 && self.mscale_all_dim != 0.0 => {
                mscale(self.mscale) / mscale(self.mscale_all_dim)
            }
            None => mscale(1.0),
        }
    }
}

/// inv_freq[i] for i < rotary_dim / 2 (`rotary_dim` even, >= 2): 1 / theta ** e_i with the
/// reference's float32 exponents e_i = f32(2i) / f32(d), changed by `scaling` as
/// `pyagent_ref.ops.rope.rope_inv_freq` documents.
pub fn inv_freq(rotary_dim: usize, theta: f64, scaling: Scaling) -> Vec<f32> {
    (0..rotary_dim / 2)
        .map(|i| {
            let exponent = ((2 * i) as f32 / rotary_dim as f32) as f64;
            let base = theta.powf(exponent);
            let inv = 1.0 / base;
            let scaled = match scaling {
                Scaling::Default => inv,
                Scaling::Linear { factor } => inv / factor,
                Scaling::Llama3 {
                    factor,
                    low_freq_factor: low,
                    high_freq_factor: high,
                    original_max,
                } => {
                    let wavelen = 2.0 * std::f64::consts::PI / inv;
                    let scaled = if wavelen > original_max / low {
                        inv / factor
                    } else {
                        inv
                    };
                    let smooth = (original_max / wavelen - low) / (high - low);
                    let medium = wavelen >= original_max / high && wavelen <= original_max / low;
                    if medium {
                        (1.0 - smooth) * scaled / factor + smooth * scaled
                    } else {
                        scaled
                    }
                }
                Scaling::Yarn { factor, low, high } => {
                    let ramp = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
                    let extrapolate = 1.0 - ramp;
                    (1.0 / (factor * base)) * (1.0 - extrapolate) + inv * extrapolate
                }
            };
            scaled as f32
        })
        .collect()
}

// ---------------------------------------------------------------------------------
// sin and cos

const FRAC_2_PI: f64 = std::f64::consts::FRAC_2_PI;
const ROUND_MAGIC: f64 = 6755399441055744.0; // 1.5 * 2**52
                                             // pi/2 = PIO2_1 + PIO2_2 + PIO2_3: the first two have 26 significant bits, so n * PIO2_1
                                             // and n * PIO2_2 are exact for |n| < 2**27 and the reduction loses nothing below that.
const PIO2_1: f64 = f64::from_bits(0x3ff9_21fb_5800_0000);
const PIO2_2: f64 = f64::from_bits(0xbe4d_de97_4000_0000);
const PIO2_3: f64 = f64::from_bits(0x3c91_a626_3314_5c07);
/// Arguments at least this large are reduced by libm instead (|n| would reach 2**27).
const REDUCE_LIMIT: f32 = 67_108_864.0; // 2**26

/// (sin x, cos x) for |x| < REDUCE_LIMIT, branch-free so that loops over it vectorise:
/// x = n pi/2 + r with |r| <= pi/4 (three-part Cody-Waite reduction), Taylor polynomials
/// of r (truncation below 2**-60), and the quadrant n mod 4 picking and negating them.
/// Accurate to about an f64 ulp: rounded to f32, the correctly rounded value but in
/// the rarest double-rounding cases.
#[inline(always)]
pub fn sin_cos(x: f64) -> (f64, f64) {
    let t = x * FRAC_2_PI + ROUND_MAGIC;
    let n_f = t - ROUND_MAGIC;
    let n = (t.to_bits() as i64).wrapping_sub(ROUND_MAGIC.to_bits() as i64);
    let r = ((x - n_f * PIO2_1) - n_f * PIO2_2) - n_f * PIO2_3;
    let r2 = r * r;
    // sin r = r + r^3 (-1/3! + r^2 (1/5! - ...)), up to r^17
    let mut s = 1.0 / 355_687_428_096_000.0;
    s = s * r2 - 1.0 / 1_307_674_368_000.0;
    s = s * r2 + 1.0 / 6_227_020_800.0;
    s = s * r2 - 1.0 / 39_916_800.0;
    s = s * r2 + 1.0 / 362_880.0;
    s = s * r2 - 1.0 / 5_040.0;
    s = s * r2 + 1.0 / 120.0;
    s = s * r2 - 1.0 / 6.0;
    let sin_r = r + r * (r2 * s);
    // cos r = 1 - r^2/2 + r^4 (1/4! - r^2 (1/6! - ...)), up to r^18
    let mut c = 1.0 / 6_402_373_705_728_000.0;
    c = c * r2 - 1.0 / 20_922_789_888_000.0;
    c = c * r2 + 1.0 / 87_178_291_200.0;
    c = c * r2 - 1.0 / 479_001_600.0;
    c = c * r2 + 1.0 / 3_628_800.0;
    c = c * r2 - 1.0 / 40_320.0;
    c = c * r2 + 1.0 / 720.0;
    c = c * r2 - 1.0 / 24.0;
    let cos_r = (1.0 - 0.5 * r2) + (r2 * r2) * -c;
    // quadrant q = n mod 4: (sin, cos) = (s, c), (c, -s), (-s, -c), (-c, s)
    let odd = n & 1 != 0;
    let (sin_x, cos_x) = if odd { (cos_r, sin_r) } else { (sin_r, cos_r) };
    let sin_sign = if n & 2 != 0 { -1.0 } else { 1.0 };
    let cos_sign = if (n + 1) & 2 != 0 { -1.0 } else { 1.0 };
    (sin_x * sin_sign, cos_x * cos_sign)
}

// ---------------------------------------------------------------------------------
// apply_rope

/// The reference's c and s of one token for each pair: cos and sin of the f32 angle
/// `position * inv_freq[i]`, rounded to f32, times `scale` in f32, rounded to `E`.
#[inline(always)]
fn cos_sin_table<E: Elem>(
    position: f32,
    inv_freq: &[f32],
    scale: f32,
    cos: &mut [E::C],
    sin: &mut [E::C],
) {
    // |position * f| <= |position * max f| (f32 products are monotonic): one test per token
    let max_freq = inv_freq.iter().fold(0.0f32, |m, f| m.max(f.abs()));
    if !((position * max_freq).abs() < REDUCE_LIMIT) {
        return cos_sin_table_libm::<E>(position, inv_freq, scale, cos, sin);
    }
    fill_cos_sin::<E>(position, inv_freq, scale, cos, sin, sin_cos);
}

/// `cos_sin_table` for angles too large for `sin_cos` (positions past 2**26 / inv_freq),
/// with libm's full range reduction.
#[cold]
#[inline(never)]
fn cos_sin_table_libm<E: Elem>(
    position: f32,
    inv_freq: &[f32],
    scale: f32,
    cos: &mut [E::C],
    sin: &mut [E::C],
) {
    fill_cos_sin::<E>(position, inv_freq, scale, cos, sin, f64::sin_cos);
}

/// The body of `cos_sin_table` with `sin_cos(angle) -> (sin, cos)` in f64.
#[inline(always)]
fn fill_cos_sin<E: Elem>(
    position: f32,
    inv_freq: &[f32],
    scale: f32,
    cos: &mut [E::C],
    sin: &mut [E::C],
    sin_cos: impl Fn(f64) -> (f64, f64),
) {
    let store = |v: f64| E::round(E::C::from_f64(((v as f32) * scale) as f64));
    for ((&f, c), s) in inv_freq.iter().zip(cos.iter_mut()).zip(sin.iter_mut()) {
        let (sin_a, cos_a) = sin_cos((position * f) as f64);
        (*c, *s) = (store(cos_a), store(sin_a));
    }
}

/// One pair rotated as the reference does it in the input dtype:
/// (a c - b s, b c + a s), each product and the sum rounded to `E`.
#[inline(always)]
fn rotate_pair<E: Elem>(a: E, b: E, c: E::C, s: E::C) -> (E, E) {
    let (a, b) = (a.load(), b.load());
    (
        E::store(E::round(a * c) - E::round(b * s)),
        E::store(E::round(b * c) + E::round(a * s)),
    )
}

/// One head: the first 2 * cos.len() features rotated (NeoX pairs i, i + d/2; GPT-J
/// pairs 2i, 2i + 1), the rest copied.
#[inline(always)]
fn rotate_head<E: Elem>(x: &[E], cos: &[E::C], sin: &[E::C], is_neox: bool, out: &mut [E]) {
    let d = 2 * cos.len();
    let (rot, rot_out) = (&x[..d], &mut out[..d]);
    if is_neox {
        let (xa, xb) = rot.split_at(d / 2);
        let (oa, ob) = rot_out.split_at_mut(d / 2);
        let pairs = xa.iter().zip(xb).zip(oa.iter_mut().zip(ob.iter_mut()));
        for (((&a, &b), (oa, ob)), (&c, &s)) in pairs.zip(cos.iter().zip(sin)) {
            (*oa, *ob) = rotate_pair(a, b, c, s);
        }
    } else {
        let pairs = rot.chunks_exact(2).zip(rot_out.chunks_exact_mut(2));
        for ((ab, o), (&c, &s)) in pairs.zip(cos.iter().zip(sin)) {
            (o[0], o[1]) = rotate_pair(ab[0], ab[1], c, s);
        }
    }
    out[d..].copy_from_slice(&x[d..]);
}

/// One token: every head of `heads` (each a row of head_size features) rotated into
/// the consecutive rows of `out`. The pairs are cut into consecutive sections of
/// `sections[r]` pairs, section r turning by `positions[r]` (M-RoPE; `apply_rope` is
/// one section of every pair). `table` is scratch for 2 * inv_freq.len() values.
#[inline(always)]
fn rope_token_impl<E: Elem>(
    positions: &[i64],
    sections: &[usize],
    inv_freq: &[f32],
    scale: f32,
    is_neox: bool,
    heads: &[&[E]],
    table: &mut [E::C],
    out: &mut [E],
) {
    let (cos, sin) = table.split_at_mut(inv_freq.len());
    let mut lo = 0;
    for (&position, &n) in positions.iter().zip(sections) {
        let (c, s) = (&mut cos[lo..lo + n], &mut sin[lo..lo + n]);
        cos_sin_table::<E>(position as f32, &inv_freq[lo..lo + n], scale, c, s);
        lo += n;
    }
    let head_size = out.len() / heads.len().max(1);
    for (x, o) in heads.iter().zip(out.chunks_exact_mut(head_size.max(1))) {
        rotate_head(x, cos, sin, is_neox, o);
    }
}

multiversion! {
    fn rope_token<E: Elem>(
        positions: &[i64],
        sections: &[usize],
        inv_freq: &[f32],
        scale: f32,
        is_neox: bool,
        heads: &[&[E]],
        table: &mut [E::C],
        out: &mut [E],
    ) -> () = rope_token_impl;
}

/// Tokens go to the thread pool in pieces of at least this many elements (~40 us of
/// work): handing over less costs more than it saves.
const ROPE_PIECE: usize = 1 << 17;

/// `x` (num_tokens, heads, head_size) rotated into a new array; `positions` holds
/// each token's position of every section, token-major (`rope_token`).
fn rotate_array<'py, E: Elem>(
    py: Python<'py>,
    positions: &[i64],
    sections: &[usize],
    x: &Bound<'py, PyAny>,
    name: &str,
    inv_freq: &[f32],
    scale: f32,
    is_neox: bool,
) -> PyResult<Bound<'py, PyAny>> {
    let x = float_array::<E>(x, name)?;
    let shape = x.shape().to_vec();
    let &[tokens, heads, head_size] = shape.as_slice() else {
        return Err(value_error(format!(
            "{name} must have shape (num_tokens, heads, head_size), got {shape:?}"
        )));
    };
    let n_rows = sections.len();
    if n_rows == 0
        || tokens * n_rows != positions.len()
        || 2 * inv_freq.len() > head_size
        || sections.iter().sum::<usize>() != inv_freq.len()
    {
        return Err(value_error(format!(
            "{name} of shape {shape:?} does not fit {} positions of sections {sections:?} \
             and rotary dim {}",
            positions.len(),
            2 * inv_freq.len()
        )));
    }
    let x_rows = rows::<E>(&x, name)?;
    // SAFETY: every token's rows are written below before the array reaches Python.
    let out = unsafe { new_array::<E>(py, &shape) };
    let width = heads * head_size;
    if width > 0 && tokens > 0 {
        let mut out_w = out.readwrite();
        let out_data = out_w.as_slice_mut()?;
        detached(py, || {
            out_data
                .par_chunks_mut(width)
                .zip(x_rows.par_chunks(heads))
                .zip(positions.par_chunks(n_rows))
                .with_min_len((ROPE_PIECE / width).max(1))
                .for_each_init(
                    || vec![E::C::ZERO; 2 * inv_freq.len()],
                    |table, ((o, token), p)| {
                        rope_token(p, sections, inv_freq, scale, is_neox, token, table, o)
                    },
                )
        })?;
    }
    Ok(out.into_any())
}

/// int32 or int64 positions, read as int64.
fn positions_vec(positions: &Bound<'_, PyAny>) -> PyResult<Vec<i64>> {
    if let Ok(p) = positions.cast::<PyArray1<i64>>() {
        Ok(readonly(p, "positions")?.as_array().to_vec())
    } else if let Ok(p) = positions.cast::<PyArray1<i32>>() {
        Ok(readonly(p, "positions")?
            .as_array()
            .iter()
            .map(|&v| v as i64)
            .collect())
    } else {
        Err(PyTypeError::new_err(
            "positions must be a 1-D int32 or int64 numpy array",
        ))
    }
}

// ---------------------------------------------------------------------------------
// Python bindings. The wrappers in `python/pyagent_accel/ops/rope.py` have made the
// reference's checks and resolved `rope_scaling`; these check again what the kernels
// rely on, so that no input reachable from Python panics.

/// apply_rope(positions, query, key, inv_freq, scale, is_neox)
/// --
///
/// `positions` int32/int64 (num_tokens,), `query`/`key` (num_tokens, heads, head_size)
/// of any float dtype each (bfloat16 as int16 bits), `inv_freq` float32 (d / 2,): the
/// rotated (query, key), new arrays of the inputs' dtypes.
#[pyfunction]
fn apply_rope<'py>(
    py: Python<'py>,
    positions: &Bound<'py, PyAny>,
    query: &Bound<'py, PyAny>,
    key: &Bound<'py, PyAny>,
    inv_freq: PyReadonlyArray1<'py, f32>,
    scale: f64,
    is_neox: bool,
) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>)> {
    let positions = positions_vec(positions)?;
    let inv_freq = inv_freq.as_array().to_vec();
    let sections = [inv_freq.len()];
    rotate_both(
        py, &positions, &sections, query, key, &inv_freq, scale, is_neox,
    )
}

/// query and key rotated (`rotate_array`).
fn rotate_both<'py>(
    py: Python<'py>,
    positions: &[i64],
    sections: &[usize],
    query: &Bound<'py, PyAny>,
    key: &Bound<'py, PyAny>,
    inv_freq: &[f32],
    scale: f64,
    is_neox: bool,
) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>)> {
    let scale = scale as f32;
    let rotate = |x: &Bound<'py, PyAny>, name: &str| {
        with_elem!(dtype_of(x, name)?, E => {
            rotate_array::<E>(py, positions, sections, x, name, inv_freq, scale, is_neox)
        })
    };
    Ok((rotate(query, "query")?, rotate(key, "key")?))
}

/// apply_mrope(positions, query, key, inv_freq, sections, scale, is_neox)
/// --
///
/// `positions` int64 (len(sections), num_tokens), C-contiguous; pair i of section r
/// turns by positions[r, token] * inv_freq[i]; otherwise `apply_rope`.
#[pyfunction]
fn apply_mrope<'py>(
    py: Python<'py>,
    positions: PyReadonlyArray2<'py, i64>,
    query: &Bound<'py, PyAny>,
    key: &Bound<'py, PyAny>,
    inv_freq: PyReadonlyArray1<'py, f32>,
    sections: Vec<usize>,
    scale: f64,
    is_neox: bool,
) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>)> {
    let rows = positions.as_array();
    if rows.nrows() != sections.len() {
        return Err(value_error(format!(
            "positions must have {} rows (one per section), got {}",
            sections.len(),
            rows.nrows()
        )));
    }
    let token_major: Vec<i64> = rows.t().iter().copied().collect();
    let inv_freq = inv_freq.as_array().to_vec();
    rotate_both(
        py,
        &token_major,
        &sections,
        query,
        key,
        &inv_freq,
        scale,
        is_neox,
    )
}

/// rope_inv_freq(rotary_dim, theta, rope_type, params, attention_factor=None)
/// --
///
/// The float32 inverse frequencies of `rope_type` ("default", "linear", "llama3" or
/// "yarn") with the parameters `Scaling` (yarn: `Yarn::new`) lists for it, and the
/// cos/sin scale (1 but for yarn).
#[pyfunction]
#[pyo3(signature = (rotary_dim, theta, rope_type, params, attention_factor=None))]
fn rope_inv_freq<'py>(
    py: Python<'py>,
    rotary_dim: usize,
    theta: f64,
    rope_type: &str,
    params: Vec<f64>,
    attention_factor: Option<f64>,
) -> PyResult<(Bound<'py, PyArray1<f32>>, f64)> {
    if rotary_dim < 2 || rotary_dim % 2 != 0 {
        return Err(value_error(format!(
            "rotary_dim must be even and >= 2, got {rotary_dim}"
        )));
    }
    let (scaling, scale) = if rope_type == "yarn" {
        let yarn = Yarn::new(&params, attention_factor).map_err(value_error)?;
        (yarn.scaling(rotary_dim, theta), yarn.attention_scale())
    } else {
        (Scaling::new(rope_type, &params).map_err(value_error)?, 1.0)
    };
    let values = detached(py, || inv_freq(rotary_dim, theta, scaling))?;
    Ok((PyArray1::from_vec(py, values), scale))
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(apply_rope, m)?)?;
    m.add_function(wrap_pyfunction!(apply_mrope, m)?)?;
    m.add_function(wrap_pyfunction!(rope_inv_freq, m)?)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::elem::Bf16;
    use half::bf16;

    #[test]
    fn sin_cos_is_within_an_ulp_of_libm() {
        let mut worst = 0.0f64;
        let mut x = -2.0e6f64;
        while x < 2.0e6 {
            let (s, c) = sin_cos(x);
            worst = worst.max((s - x.sin()).abs()).max((c - x.cos()).abs());
            x += 0.731;
        }
        assert!(worst < 4e-16, "worst error {worst:e}");
        for x in [
            0.0,
            -0.0,
            1e-300,
            std::f64::consts::FRAC_PI_4,
            std::f64::consts::PI,
        ] {
            let (s, c) = sin_cos(x);
            assert!(
                (s - x.sin()).abs() <= 1.2e-16 && (c - x.cos()).abs() <= 1.2e-16,
                "{x}"
            );
        }
    }

    #[test]
    fn sin_cos_rounds_float32_angles_correctly() {
        // float32 angles as apply_rope makes them: the f32 result is the rounded libm value
        let mut mismatches = 0;
        for p in 0..4096 {
            for f in [1.0f32, 0.7498942, 0.1, 0.0133352, 1e-4] {
                let angle = (p as f32 * f) as f64;
                let (s, c) = sin_cos(angle);
                mismatches += (s as f32 != angle.sin() as f32) as u32;
                mismatches += (c as f32 != angle.cos() as f32) as u32;
            }
        }
        assert_eq!(mismatches, 0);
    }

    #[test]
    fn huge_angles_use_libm() {
        let inv = [1.0f32, 0.25];
        let (mut cos, mut sin) = ([0.0f64; 2], [0.0f64; 2]);
        for p in [1.0e8f32, -3.0e9, 6.0e7] {
            cos_sin_table::<f64>(p, &inv, 1.0, &mut cos, &mut sin);
            for i in 0..2 {
                let angle = (p * inv[i]) as f64;
                assert_eq!(
                    (cos[i], sin[i]),
                    ((angle.cos() as f32) as f64, (angle.sin() as f32) as f64)
                );
            }
        }
    }

    #[test]
    fn default_inv_freq_is_theta_power() {
        let inv = inv_freq(8, 10000.0, Scaling::Default);
        let want = [1.0, 0.1, 0.01, 0.001];
        for (g, w) in inv.iter().zip(want) {
            assert!((*g as f64 - w).abs() <= 1e-7 * w, "{g} vs {w}");
        }
        let linear = inv_freq(8, 10000.0, Scaling::Linear { factor: 4.0 });
        assert_eq!(linear, inv.iter().map(|v| v / 4.0).collect::<Vec<_>>());
    }

    #[test]
    fn llama3_keeps_high_and_divides_low_frequencies() {
        let scaling = Scaling::new("llama3", &[8.0, 1.0, 4.0, 512.0]).unwrap();
        let base = inv_freq(64, 500000.0, Scaling::Default);
        let inv = inv_freq(64, 500000.0, scaling);
        for (b, v) in base.iter().zip(&inv) {
            let wavelen = 2.0 * std::f32::consts::PI / b;
            if wavelen < 128.0 {
                assert_eq!(v, b);
            } else if wavelen > 512.0 {
                assert!((v - b / 8.0).abs() <= 1e-6 * b);
            } else {
                assert!(*v <= *b && *v >= b / 8.0);
            }
        }
    }

    #[test]
    fn yarn_blends_interpolation_into_extrapolation() {
        let base = inv_freq(16, 10000.0, Scaling::Default);
        let inv = inv_freq(
            16,
            10000.0,
            Scaling::Yarn {
                factor: 4.0,
                low: 2.0,
                high: 5.0,
            },
        );
        assert_eq!(&inv[..3], &base[..3]); // ramp 0: extrapolation
        for i in 5..8 {
            assert!((inv[i] - base[i] / 4.0).abs() <= 1e-7 * base[i]); // ramp 1: interpolation
        }
        assert!(inv[3] < base[3] && inv[3] > base[3] / 4.0);
    }

    #[test]
    fn yarn_bounds_and_scale_follow_the_reference() {
        // d = 64, theta 1e4, original 4096: correction dims 10.47 (beta 32) and 22.51 (beta 1)
        let yarn = Yarn::new(&[8.0, 4096.0, 32.0, 1.0, 1.0, 0.0, 0.0], None).unwrap();
        let Scaling::Yarn { low, high, .. } = yarn.scaling(64, 10000.0) else {
            panic!("not yarn")
        };
        assert_eq!((low, high), (10.0, 23.0));
        assert_eq!(yarn.attention_scale(), 0.1 * 8f64.ln() + 1.0);
        let ratio = Yarn::new(&[8.0, 4096.0, 32.0, 1.0, 0.0, 1.0, 0.5], None).unwrap();
        let want = (0.1 * 8f64.ln() + 1.0) / (0.05 * 8f64.ln() + 1.0);
        assert_eq!(ratio.attention_scale(), want);
        assert_eq!(
            Yarn::new(&[8.0; 7], Some(0.7)).unwrap().attention_scale(),
            0.7
        );
    }

    #[test]
    fn unknown_scalings_are_errors() {
        assert!(Scaling::new("dynamic", &[2.0]).is_err());
        assert!(Scaling::new("yarn", &[4.0, 2.0, 5.0]).is_err()); // built by `Yarn`
        assert!(Scaling::new("linear", &[]).is_err());
        assert_eq!(Scaling::new("default", &[]), Ok(Scaling::Default));
    }

    #[test]
    fn rotation_matches_the_formula_and_keeps_the_rest() {
        let inv = [1.0f32, 0.5];
        let x: Vec<f64> = vec![1.0, 2.0, 3.0, 4.0, 5.0];
        for is_neox in [true, false] {
            let mut out = vec![0.0; 5];
            let mut table = vec![0.0; 4];
            rope_token(&[3], &[2], &inv, 1.0, is_neox, &[&x], &mut table, &mut out);
            let (ia, ib) = if is_neox {
                ([0, 1], [2, 3])
            } else {
                ([0, 2], [1, 3])
            };
            for i in 0..2 {
                let angle = (3.0f32 * inv[i]) as f64;
                let (c, s) = ((angle.cos() as f32) as f64, (angle.sin() as f32) as f64);
                let (a, b) = (x[ia[i]], x[ib[i]]);
                assert_eq!(out[ia[i]], a * c - b * s);
                assert_eq!(out[ib[i]], b * c + a * s);
            }
            assert_eq!(out[4], 5.0);
        }
    }

    #[test]
    fn sections_turn_by_their_own_positions() {
        let inv = [1.0f32, 0.5, 0.25];
        let x: Vec<f64> = (1..=6).map(|v| v as f64).collect();
        let mut table = vec![0.0; 6];
        let mut mixed = vec![0.0; 6];
        rope_token(
            &[2, 5],
            &[1, 2],
            &inv,
            1.0,
            true,
            &[&x],
            &mut table,
            &mut mixed,
        );
        for (position, pairs) in [(2, 0..1), (5, 1..3)] {
            let mut plain = vec![0.0; 6];
            rope_token(
                &[position],
                &[3],
                &inv,
                1.0,
                true,
                &[&x],
                &mut table,
                &mut plain,
            );
            for i in pairs {
                assert_eq!((mixed[i], mixed[i + 3]), (plain[i], plain[i + 3]));
            }
        }
    }

    #[test]
    fn bf16_rounds_cos_sin_and_every_product() {
        let inv = [0.3f32];
        let to_bf16 = |v: f32| Bf16(bf16::from_f32(v).to_bits()); // rounded by the oracle
        let x = [to_bf16(1.5), to_bf16(-0.75)];
        let mut out = [Bf16(0); 2];
        let mut table = [0.0f32; 2];
        rope_token(&[7], &[1], &inv, 1.0, true, &[&x], &mut table, &mut out);
        let r = |v: f32| bf16::from_f32(v).to_f32();
        let angle = 7.0f32 * 0.3;
        let (c, s) = (
            r((angle as f64).cos() as f32),
            r((angle as f64).sin() as f32),
        );
        let (a, b) = (1.5f32, -0.75f32);
        assert_eq!(out[0], to_bf16(r(a * c) - r(b * s)));
        assert_eq!(out[1], to_bf16(r(b * c) + r(a * s)));
    }
}
