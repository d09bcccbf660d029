//! Kernels of `pyagent_accel.ops.ssm` (the causal convolution of a Mamba layer with its
//! carried inputs, and one decode step of Mamba-2's recurrence) and their Python bindings
//! (contract: `pyagent_ref.ops.ssm`).
//!
//! The wrapper hands every float array over flat and C-contiguous in the compute type
//! (f32, f64 for f64 input; the widening is exact), with the shapes as integers; the
//! kernels follow the reference's order of operations term by term (a convolution adds
//! its taps oldest first onto the bias; a state step is decay * state + (delta x) B),
//! sums over the state features in order. Sequences or (sequence, head) pairs run in
//! parallel when there is enough work (`PARALLEL_WORK`).

use numpy::{PyArray1, PyReadonlyArray1};
use pyo3::prelude::*;
use rayon::prelude::*;

use crate::elem::Compute;
use crate::py_util::{detached, readonly, slice, value_error};

/// Elements written below which a call stays on the calling thread.
const PARALLEL_WORK: usize = 1 << 15;

/// silu(v) = v / (1 + exp(-v)), as the reference writes it.
#[inline(always)]
fn silu<C: Compute>(v: C) -> C {
    v / (C::ONE + (C::ZERO - v).exp_fast())
}

/// log(1 + exp(v)) = max(v, 0) + log1p(exp(-|v|)), without overflow.
#[inline(always)]
fn softplus<C: Compute>(v: C) -> C {
    let a = v.to_f64().abs();
    let m = if v > C::ZERO { v } else { C::ZERO };
    m + C::from_f64((C::from_f64(-a).exp_fast()).to_f64().ln_1p())
}

/// The convolution of `causal_conv1d`: x (tokens, ch), weight (ch, width), bias (ch,)
/// or empty, state (seqs, ch, width - 1), sequence s owning tokens starts[s] ..
/// starts[s + 1] (validated). Returns (out (tokens, ch), new_state like state).
#[allow(clippy::too_many_arguments)]
pub fn conv1d<C: Compute>(
    x: &[C],
    ch: usize,
    weight: &[C],
    width: usize,
    bias: &[C],
    state: &[C],
    starts: &[usize],
    activate: bool,
) -> (Vec<C>, Vec<C>) {
    let k = width - 1;
    let seqs = starts.len() - 1;
    let tokens = x.len().checked_div(ch).unwrap_or(0);
    let mut out = vec![C::ZERO; tokens * ch];
    let mut new_state = vec![C::ZERO; state.len()];
    // xx_s[i, c]: the k carried inputs, then the sequence's tokens
    let input = |s: usize, i: usize, c: usize| -> C {
        if i < k {
            state[(s * ch + c) * k + i]
        } else {
            x[(starts[s] + i - k) * ch + c]
        }
    };
    let run = |s: usize, rows: &mut [C], st: &mut [C]| {
        let len = starts[s + 1] - starts[s];
        for j in 0..len {
            let row = &mut rows[j * ch..(j + 1) * ch];
            for (c, o) in row.iter_mut().enumerate() {
                let mut acc = if bias.is_empty() {
                    C::ZERO
                } else {
                    C::ZERO + bias[c]
                };
                for i in 0..width {
                    acc = acc + input(s, j + i, c) * weight[c * width + i];
                }
                *o = if activate { silu(acc) } else { acc };
            }
        }
        for c in 0..ch {
            for m in 0..k {
                st[c * k + m] = input(s, len + m, c);
            }
        }
    };
    // split the outputs by sequence: rows of sequence s are out[starts[s]..starts[s + 1]]
    let mut rows: Vec<&mut [C]> = Vec::with_capacity(seqs);
    let mut rest = &mut out[..];
    for s in 0..seqs {
        let (head, tail) = rest.split_at_mut((starts[s + 1] - starts[s]) * ch);
        rows.push(head);
        rest = tail;
    }
    let states: Vec<&mut [C]> = if k == 0 {
        (0..seqs).map(|_| <&mut [C]>::default()).collect()
    } else {
        new_state.chunks_mut(ch * k).collect()
    };
    let work = tokens * ch * width;
    let jobs = rows.into_iter().zip(states).enumerate();
    if work >= PARALLEL_WORK {
        jobs.collect::<Vec<_>>()
            .into_par_iter()
            .for_each(|(s, (r, st))| run(s, r, st));
    } else {
        jobs.for_each(|(s, (r, st))| run(s, r, st));
    }
    (out, new_state)
}

/// The shapes of a state step: sequences, heads, head_dim P, groups, state size N.
#[derive(Clone, Copy, Debug)]
pub struct Heads {
    pub seqs: usize,
    pub heads: usize,
    pub p: usize,
    pub groups: usize,
    pub n: usize,
}

/// One token of Mamba-2's recurrence per sequence (`selective_state_update`): state
/// (seqs, heads, P, N), x (seqs, heads, P), dt (seqs, heads), a (heads,), b and c
/// (seqs, groups, N), d and dt_bias (heads,) or empty. Returns (y (seqs, heads, P),
/// new_state like state).
#[allow(clippy::too_many_arguments)]
pub fn state_update<C: Compute>(
    state: &[C],
    x: &[C],
    dt: &[C],
    a: &[C],
    b: &[C],
    c: &[C],
    d: &[C],
    dt_bias: &[C],
    softplus_dt: bool,
    s: Heads,
) -> (Vec<C>, Vec<C>) {
    let (p, n) = (s.p, s.n);
    let per_group = s.heads / s.groups.max(1);
    let mut y = vec![C::ZERO; s.seqs * s.heads * p];
    let mut new = vec![C::ZERO; state.len()];
    let one = |(row, (ys, hs)): (usize, (&mut [C], &mut [C]))| {
        let (seq, h) = (row / s.heads, row % s.heads);
        let g = h / per_group;
        let mut delta = dt[row];
        if !dt_bias.is_empty() {
            delta = delta + dt_bias[h];
        }
        if softplus_dt {
            delta = softplus(delta);
        }
        let decay = (delta * a[h]).exp_fast();
        let bg = &b[(seq * s.groups + g) * n..(seq * s.groups + g + 1) * n];
        let cg = &c[(seq * s.groups + g) * n..(seq * s.groups + g + 1) * n];
        for i in 0..p {
            let xi = x[row * p + i];
            let dx = delta * xi;
            let old = &state[(row * p + i) * n..(row * p + i + 1) * n];
            let cur = &mut hs[i * n..(i + 1) * n];
            let mut acc = C::ZERO;
            for j in 0..n {
                cur[j] = decay * old[j] + dx * bg[j];
                acc = acc + cur[j] * cg[j];
            }
            ys[i] = if d.is_empty() { acc } else { acc + d[h] * xi };
        }
    };
    let rows = s.seqs * s.heads;
    if p == 0 || n == 0 {
        // nothing to step: y is D x (or zeros), the state is empty
        for row in 0..rows {
            for i in 0..p {
                y[row * p + i] = if d.is_empty() {
                    C::ZERO
                } else {
                    C::ZERO + d[row % s.heads] * x[row * p + i]
                };
            }
        }
        return (y, new);
    }
    let jobs = (0..rows).zip(y.chunks_mut(p).zip(new.chunks_mut(p * n)));
    if state.len() >= PARALLEL_WORK {
        jobs.collect::<Vec<_>>().into_par_iter().for_each(one);
    } else {
        jobs.for_each(one);
    }
    (y, new)
}

/// The step size of a token: dt (+ dt_bias), through softplus when asked.
#[inline(always)]
fn step_size<C: Compute>(dt: C, bias: Option<C>, softplus_dt: bool) -> C {
    let d = match bias {
        Some(b) => dt + b,
        None => dt,
    };
    if softplus_dt {
        softplus(d)
    } else {
        d
    }
}

/// Run `head(s, h, rows of the sequence)` for every sequence s and head (or channel) h of
/// `heads`, in parallel when there is enough work; each returns its outputs of the
/// sequence's tokens (`width` values per token) and its final state (`state_len`
/// values), which are put in place: y (tokens, heads, width), states (seqs, heads,
/// state_len).
fn per_head<C: Compute, F>(
    starts: &[usize],
    heads: usize,
    width: usize,
    state_len: usize,
    work: usize,
    head: F,
) -> (Vec<C>, Vec<C>)
where
    F: Fn(usize, usize, std::ops::Range<usize>) -> (Vec<C>, Vec<C>) + Sync,
{
    let seqs = starts.len() - 1;
    let tokens = starts[seqs];
    let jobs: Vec<(usize, usize)> = (0..seqs)
        .flat_map(|s| (0..heads).map(move |h| (s, h)))
        .collect();
    let run = |&(s, h): &(usize, usize)| head(s, h, starts[s]..starts[s + 1]);
    let results: Vec<(Vec<C>, Vec<C>)> = if work >= PARALLEL_WORK {
        jobs.par_iter().map(run).collect()
    } else {
        jobs.iter().map(run).collect()
    };
    let mut y = vec![C::ZERO; tokens * heads * width];
    let mut states = vec![C::ZERO; seqs * heads * state_len];
    for (&(s, h), (ys, st)) in jobs.iter().zip(results) {
        for (j, t) in (starts[s]..starts[s + 1]).enumerate() {
            let at = (t * heads + h) * width;
            y[at..at + width].copy_from_slice(&ys[j * width..(j + 1) * width]);
        }
        let at = (s * heads + h) * state_len;
        states[at..at + state_len].copy_from_slice(&st);
    }
    (y, states)
}

/// Optional per-head (or per-channel) values: None for an empty array.
#[inline(always)]
fn opt<C: Compute>(v: &[C], i: usize) -> Option<C> {
    if v.is_empty() {
        None
    } else {
        Some(v[i])
    }
}

/// The arrays of a scan, flat in the compute type (`ssd` and `selective` say the shapes);
/// d, z and dt_bias are empty when absent.
pub struct ScanInputs<'a, C> {
    pub x: &'a [C],
    pub dt: &'a [C],
    pub a: &'a [C],
    pub b: &'a [C],
    pub c: &'a [C],
    pub state: &'a [C],
    pub d: &'a [C],
    pub z: &'a [C],
    pub dt_bias: &'a [C],
}

/// Mamba-2's scan (`ssd_scan`), token by token: x (tokens, heads, P), dt (tokens,
/// heads), a (heads,), b and c (tokens, groups, N), state (seqs, heads, P, N), sequence
/// s owning tokens starts[s] .. starts[s + 1]. The recurrence the reference evaluates in
/// the chunked dual form, here step by step (its result up to rounding), each (sequence,
/// head) on its own. Returns (y (tokens, heads, P), new_state like state).
pub fn ssd<C: Compute>(
    v: &ScanInputs<C>,
    starts: &[usize],
    s: Heads,
    softplus_dt: bool,
) -> (Vec<C>, Vec<C>) {
    let (heads, p, n) = (s.heads, s.p, s.n);
    let per_group = heads / s.groups.max(1);
    let work = starts[starts.len() - 1] * heads * p * n;
    per_head(starts, heads, p, p * n, work, |seq, h, rows| {
        let g = h / per_group;
        let at = (seq * heads + h) * p * n;
        let mut state = v.state[at..at + p * n].to_vec();
        let mut ys = vec![C::ZERO; rows.len() * p];
        for (j, t) in rows.enumerate() {
            let delta = step_size(v.dt[t * heads + h], opt(v.dt_bias, h), softplus_dt);
            let decay = (delta * v.a[h]).exp_fast();
            let bg = &v.b[(t * s.groups + g) * n..(t * s.groups + g + 1) * n];
            let cg = &v.c[(t * s.groups + g) * n..(t * s.groups + g + 1) * n];
            for i in 0..p {
                let xi = v.x[(t * heads + h) * p + i];
                let dx = delta * xi;
                let row = &mut state[i * n..(i + 1) * n];
                let mut acc = C::ZERO;
                for k in 0..n {
                    row[k] = decay * row[k] + dx * bg[k];
                    acc = acc + row[k] * cg[k];
                }
                ys[j * p + i] = match opt(v.d, h) {
                    Some(d) => acc + d * xi,
                    None => acc,
                };
            }
        }
        (ys, state)
    })
}

/// Mamba-1's scan (`selective_scan`), token by token: x, dt and z (tokens, channels), a
/// (channels, N), b and c (tokens, N), state (seqs, channels, N). Returns (y (tokens,
/// channels), new_state like state).
pub fn selective<C: Compute>(
    v: &ScanInputs<C>,
    starts: &[usize],
    channels: usize,
    n: usize,
    softplus_dt: bool,
) -> (Vec<C>, Vec<C>) {
    let work = starts[starts.len() - 1] * channels * n;
    per_head(starts, channels, 1, n, work, |seq, ch, rows| {
        let at = (seq * channels + ch) * n;
        let mut state = v.state[at..at + n].to_vec();
        let a = &v.a[ch * n..(ch + 1) * n];
        let mut ys = Vec::with_capacity(rows.len());
        for t in rows {
            let delta = step_size(v.dt[t * channels + ch], opt(v.dt_bias, ch), softplus_dt);
            let xi = v.x[t * channels + ch];
            let dx = delta * xi;
            let (bt, ct) = (&v.b[t * n..(t + 1) * n], &v.c[t * n..(t + 1) * n]);
            let mut acc = C::ZERO;
            for k in 0..n {
                state[k] = (delta * a[k]).exp_fast() * state[k] + dx * bt[k];
                acc = acc + state[k] * ct[k];
            }
            if let Some(d) = opt(v.d, ch) {
                acc = acc + d * xi;
            }
            if !v.z.is_empty() {
                let z = v.z[t * channels + ch];
                acc = acc * silu(z);
            }
            ys.push(acc);
        }
        (ys, state)
    })
}

/// A flat C-contiguous array of compute values, or None for an empty optional one.
fn flat<'py, C: Compute>(
    v: &Bound<'py, PyAny>,
    name: &str,
) -> PyResult<numpy::PyReadonlyArray1<'py, C>> {
    let arr = v
        .cast::<PyArray1<C>>()
        .map_err(|_| value_error(format!("{name} must be a 1-D array of the compute dtype")))?;
    readonly(arr, name)
}

fn check_len(name: &str, got: usize, want: usize) -> PyResult<()> {
    if got != want {
        return Err(value_error(format!(
            "{name} must hold {want} values, got {got}"
        )));
    }
    Ok(())
}

/// ssm_conv1d(x, weight, bias, state, query_start_loc, channels, width, silu)
/// --
///
/// Flat f32 (or f64: every array alike) x (tokens * channels), weight (channels *
/// width), bias (channels, or empty), state (seqs * channels * (width - 1)); int64
/// query_start_loc (seqs + 1) rising from 0 to tokens. (out, new_state), flat.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn ssm_conv1d<'py>(
    py: Python<'py>,
    x: &Bound<'py, PyAny>,
    weight: &Bound<'py, PyAny>,
    bias: &Bound<'py, PyAny>,
    state: &Bound<'py, PyAny>,
    query_start_loc: PyReadonlyArray1<'py, i64>,
    channels: usize,
    width: usize,
    silu: bool,
) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>)> {
    fn run<'py, C: Compute>(
        py: Python<'py>,
        args: [&Bound<'py, PyAny>; 4],
        qsl: &[i64],
        ch: usize,
        width: usize,
        silu: bool,
    ) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>)> {
        let [x, w, b, st] = args;
        let (x, w, b, st) = (
            flat::<C>(x, "x")?,
            flat::<C>(w, "weight")?,
            flat::<C>(b, "bias")?,
            flat::<C>(st, "conv_state")?,
        );
        let (x, w, b, st) = (
            slice(&x, "x")?,
            slice(&w, "weight")?,
            slice(&b, "bias")?,
            slice(&st, "conv_state")?,
        );
        if width < 1 || ch == 0 && !x.is_empty() {
            return Err(value_error(
                "width must be >= 1 and channels > 0".to_string(),
            ));
        }
        let tokens = x.len().checked_div(ch).unwrap_or(0);
        let seqs = qsl.len().saturating_sub(1);
        check_len("x", x.len(), tokens * ch)?;
        check_len("weight", w.len(), ch * width)?;
        if !b.is_empty() {
            check_len("bias", b.len(), ch)?;
        }
        check_len("conv_state", st.len(), seqs * ch * (width - 1))?;
        let mut starts = Vec::with_capacity(qsl.len());
        for (i, &q) in qsl.iter().enumerate() {
            let ok = q >= 0 && q as u64 <= tokens as u64 && (i == 0 || q >= qsl[i - 1]);
            if !ok || (i == 0 && q != 0) || (i + 1 == qsl.len() && q as usize != tokens) {
                return Err(value_error(format!(
                    "query_start_loc must rise from 0 to the {tokens} tokens, got {qsl:?}"
                )));
            }
            starts.push(q as usize);
        }
        if starts.is_empty() {
            return Err(value_error("query_start_loc must not be empty".to_string()));
        }
        let (out, new) = detached(py, || conv1d(x, ch, w, width, b, st, &starts, silu))?;
        Ok((
            PyArray1::from_vec(py, out).into_any(),
            PyArray1::from_vec(py, new).into_any(),
        ))
    }
    let qsl = slice(&query_start_loc, "query_start_loc")?;
    let args = [x, weight, bias, state];
    if x.cast::<PyArray1<f64>>().is_ok() {
        run::<f64>(py, args, qsl, channels, width, silu)
    } else {
        run::<f32>(py, args, qsl, channels, width, silu)
    }
}

/// ssm_state_update(state, x, dt, a, b, c, d, dt_bias, dt_softplus, seqs, heads, p, groups, n)
/// --
///
/// Flat f32 (or f64: every array alike) arrays of the shapes of `state_update` (D and
/// dt_bias empty when absent); groups divides heads. (y, new_state), flat.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn ssm_state_update<'py>(
    py: Python<'py>,
    state: &Bound<'py, PyAny>,
    x: &Bound<'py, PyAny>,
    dt: &Bound<'py, PyAny>,
    a: &Bound<'py, PyAny>,
    b: &Bound<'py, PyAny>,
    c: &Bound<'py, PyAny>,
    d: &Bound<'py, PyAny>,
    dt_bias: &Bound<'py, PyAny>,
    dt_softplus: bool,
    seqs: usize,
    heads: usize,
    p: usize,
    groups: usize,
    n: usize,
) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>)> {
    fn run<'py, C: Compute>(
        py: Python<'py>,
        arrays: [&Bound<'py, PyAny>; 8],
        softplus_dt: bool,
        s: Heads,
    ) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>)> {
        let names = ["state", "x", "dt", "A", "B", "C", "D", "dt_bias"];
        let mut held = Vec::with_capacity(8);
        for (v, name) in arrays.iter().zip(names) {
            held.push(flat::<C>(v, name)?);
        }
        let mut views: Vec<&[C]> = Vec::with_capacity(8);
        for (h, name) in held.iter().zip(names) {
            views.push(slice(h, name)?);
        }
        if s.groups == 0 || s.heads % s.groups != 0 {
            return Err(value_error(format!(
                "groups ({}) must divide the {} heads",
                s.groups, s.heads
            )));
        }
        let rows = s.seqs * s.heads;
        let want = [
            rows * s.p * s.n,
            rows * s.p,
            rows,
            s.heads,
            s.seqs * s.groups * s.n,
            s.seqs * s.groups * s.n,
        ];
        for (i, &w) in want.iter().enumerate() {
            check_len(names[i], views[i].len(), w)?;
        }
        for i in [6, 7] {
            if !views[i].is_empty() {
                check_len(names[i], views[i].len(), s.heads)?;
            }
        }
        let v = &views;
        let (y, new) = detached(py, || {
            state_update(
                v[0],
                v[1],
                v[2],
                v[3],
                v[4],
                v[5],
                v[6],
                v[7],
                softplus_dt,
                s,
            )
        })?;
        Ok((
            PyArray1::from_vec(py, y).into_any(),
            PyArray1::from_vec(py, new).into_any(),
        ))
    }
    let arrays = [state, x, dt, a, b, c, d, dt_bias];
    let shape = Heads {
        seqs,
        heads,
        p,
        groups,
        n,
    };
    if x.cast::<PyArray1<f64>>().is_ok() {
        run::<f64>(py, arrays, dt_softplus, shape)
    } else {
        run::<f32>(py, arrays, dt_softplus, shape)
    }
}

/// The sequences' first tokens from a validated int64 query_start_loc rising from 0 to
/// `tokens`; ValueError otherwise.
fn starts_of(qsl: &[i64], tokens: usize) -> PyResult<Vec<usize>> {
    let rises = qsl.windows(2).all(|w| w[0] <= w[1]);
    if qsl.is_empty() || qsl[0] != 0 || qsl[qsl.len() - 1] != tokens as i64 || !rises {
        return Err(value_error(format!(
            "query_start_loc must rise from 0 to the {tokens} tokens, got {qsl:?}"
        )));
    }
    Ok(qsl.iter().map(|&q| q as usize).collect())
}

/// Borrow the named flat arrays of one compute type and check their lengths (`want`:
/// None for an optional array, which may be empty or of its length).
fn run_scan<'py, C: Compute, F>(
    py: Python<'py>,
    arrays: &[(&Bound<'py, PyAny>, &str, usize, bool)],
    kernel: F,
) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>)>
where
    F: FnOnce(&[&[C]]) -> (Vec<C>, Vec<C>) + Send,
{
    let mut held = Vec::with_capacity(arrays.len());
    for &(v, name, _, _) in arrays {
        held.push(flat::<C>(v, name)?);
    }
    let mut views: Vec<&[C]> = Vec::with_capacity(arrays.len());
    for (h, &(_, name, want, optional)) in held.iter().zip(arrays) {
        let view = slice(h, name)?;
        if !(optional && view.is_empty()) {
            check_len(name, view.len(), want)?;
        }
        views.push(view);
    }
    let (y, new) = detached(py, || kernel(&views))?;
    Ok((
        PyArray1::from_vec(py, y).into_any(),
        PyArray1::from_vec(py, new).into_any(),
    ))
}

/// ssm_ssd_scan(x, dt, a, b, c, state, query_start_loc, d, dt_bias, dt_softplus, heads, p, groups, n)
/// --
///
/// Flat f32 (or f64: every array alike) arrays of the shapes of `ssd` (D and dt_bias
/// empty when absent); groups divides heads. (y, new_state), flat.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn ssm_ssd_scan<'py>(
    py: Python<'py>,
    x: &Bound<'py, PyAny>,
    dt: &Bound<'py, PyAny>,
    a: &Bound<'py, PyAny>,
    b: &Bound<'py, PyAny>,
    c: &Bound<'py, PyAny>,
    state: &Bound<'py, PyAny>,
    query_start_loc: PyReadonlyArray1<'py, i64>,
    d: &Bound<'py, PyAny>,
    dt_bias: &Bound<'py, PyAny>,
    dt_softplus: bool,
    heads: usize,
    p: usize,
    groups: usize,
    n: usize,
) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>)> {
    if groups == 0 || heads % groups != 0 {
        return Err(value_error(format!(
            "groups ({groups}) must divide the {heads} heads"
        )));
    }
    let qsl = slice(&query_start_loc, "query_start_loc")?;
    let seqs = qsl.len().saturating_sub(1);
    let tokens = *qsl.last().unwrap_or(&0) as usize;
    let starts = starts_of(qsl, tokens)?;
    let shape = Heads {
        seqs,
        heads,
        p,
        groups,
        n,
    };
    let arrays = [
        (x, "x", tokens * heads * p, false),
        (dt, "dt", tokens * heads, false),
        (a, "A", heads, false),
        (b, "B", tokens * groups * n, false),
        (c, "C", tokens * groups * n, false),
        (state, "state", seqs * heads * p * n, false),
        (d, "D", heads, true),
        (dt_bias, "dt_bias", heads, true),
    ];
    fn kernel<C: Compute>(v: &[&[C]], starts: &[usize], s: Heads, sp: bool) -> (Vec<C>, Vec<C>) {
        let inputs = ScanInputs {
            x: v[0],
            dt: v[1],
            a: v[2],
            b: v[3],
            c: v[4],
            state: v[5],
            d: v[6],
            z: &[],
            dt_bias: v[7],
        };
        ssd(&inputs, starts, s, sp)
    }
    if x.cast::<PyArray1<f64>>().is_ok() {
        run_scan::<f64, _>(py, &arrays, |v| kernel(v, &starts, shape, dt_softplus))
    } else {
        run_scan::<f32, _>(py, &arrays, |v| kernel(v, &starts, shape, dt_softplus))
    }
}

/// ssm_selective_scan(x, dt, a, b, c, state, query_start_loc, d, z, dt_bias, dt_softplus, channels, n)
/// --
///
/// Flat f32 (or f64: every array alike) arrays of the shapes of `selective` (D, z and
/// dt_bias empty when absent). (y, new_state), flat.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
fn ssm_selective_scan<'py>(
    py: Python<'py>,
    x: &Bound<'py, PyAny>,
    dt: &Bound<'py, PyAny>,
    a: &Bound<'py, PyAny>,
    b: &Bound<'py, PyAny>,
    c: &Bound<'py, PyAny>,
    state: &Bound<'py, PyAny>,
    query_start_loc: PyReadonlyArray1<'py, i64>,
    d: &Bound<'py, PyAny>,
    z: &Bound<'py, PyAny>,
    dt_bias: &Bound<'py, PyAny>,
    dt_softplus: bool,
    channels: usize,
    n: usize,
) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyAny>)> {
    let qsl = slice(&query_start_loc, "query_start_loc")?;
    let seqs = qsl.len().saturating_sub(1);
    let tokens = *qsl.last().unwrap_or(&0) as usize;
    let starts = starts_of(qsl, tokens)?;
    let arrays = [
        (x, "x", tokens * channels, false),
        (dt, "dt", tokens * channels, false),
        (a, "A", channels * n, false),
        (b, "B", tokens * n, false),
        (c, "C", tokens * n, false),
        (state, "state", seqs * channels * n, false),
        (d, "D", channels, true),
        (z, "z", tokens * channels, true),
        (dt_bias, "dt_bias", channels, true),
    ];
    fn kernel<C: Compute>(
        v: &[&[C]],
        starts: &[usize],
        ch: usize,
        n: usize,
        sp: bool,
    ) -> (Vec<C>, Vec<C>) {
        let inputs = ScanInputs {
            x: v[0],
            dt: v[1],
            a: v[2],
            b: v[3],
            c: v[4],
            state: v[5],
            d: v[6],
            z: v[7],
            dt_bias: v[8],
        };
        selective(&inputs, starts, ch, n, sp)
    }
    if x.cast::<PyArray1<f64>>().is_ok() {
        run_scan::<f64, _>(py, &arrays, |v| {
            kernel(v, &starts, channels, n, dt_softplus)
        })
    } else {
        run_scan::<f32, _>(py, &arrays, |v| {
            kernel(v, &starts, channels, n, dt_softplus)
        })
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(ssm_conv1d, m)?)?;
    m.add_function(wrap_pyfunction!(ssm_state_update, m)?)?;
    m.add_function(wrap_pyfunction!(ssm_ssd_scan, m)?)?;
    m.add_function(wrap_pyfunction!(ssm_selective_scan, m)?)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conv_continues_from_the_carried_inputs() {
        // one channel, width 3: out[j] = w0 xx[j] + w1 xx[j + 1] + w2 xx[j + 2]
        let x = [1.0f64, 2.0, 3.0];
        let w = [100.0, 10.0, 1.0];
        let state = [5.0, 7.0];
        let (out, new) = conv1d(&x, 1, &w, 3, &[], &state, &[0, 3], false);
        assert_eq!(out, vec![571.0, 712.0, 123.0]);
        assert_eq!(new, vec![2.0, 3.0]);
        // split in two calls, the second from the first's state: the same
        let (a, sa) = conv1d(&x[..1], 1, &w, 3, &[], &state, &[0, 1], false);
        let (b, sb) = conv1d(&x[1..], 1, &w, 3, &[], &sa, &[0, 2], false);
        assert_eq!([a, b].concat(), out);
        assert_eq!(sb, new);
    }

    #[test]
    fn an_empty_sequence_keeps_its_state() {
        let (out, new) = conv1d(
            &[4.0f32],
            1,
            &[1.0, 1.0],
            2,
            &[0.5],
            &[9.0, 8.0],
            &[0, 0, 1],
            false,
        );
        assert_eq!(out, vec![12.5]);
        assert_eq!(new, vec![9.0, 4.0]);
    }

    #[test]
    fn a_state_step_decays_adds_and_reads_out() {
        // one sequence, two heads sharing one group, P = 1, N = 2
        let shape = Heads {
            seqs: 1,
            heads: 2,
            p: 1,
            groups: 1,
            n: 2,
        };
        let state = [1.0f64, 2.0, 3.0, 4.0];
        let (y, new) = state_update(
            &state,
            &[1.0, 2.0],
            &[0.5, 1.0],
            &[0.0, -1.0],
            &[1.0, 0.0],
            &[1.0, 1.0],
            &[10.0, 0.0],
            &[],
            false,
            shape,
        );
        let e = (-1.0f64).exp();
        assert_eq!(new[..2], [1.5, 2.0]);
        assert!((new[2] - (3.0 * e + 2.0)).abs() < 1e-15 && (new[3] - 4.0 * e).abs() < 1e-15);
        assert!((y[0] - 13.5).abs() < 1e-15);
        assert!((y[1] - (new[2] + new[3])).abs() < 1e-15);
    }

    #[test]
    fn a_scan_is_state_updates_one_token_at_a_time() {
        // one sequence of three tokens, two heads in one group, P = 2, N = 2
        let shape = Heads {
            seqs: 1,
            heads: 2,
            p: 2,
            groups: 1,
            n: 2,
        };
        let x: Vec<f64> = (0..12).map(|i| (i as f64 - 5.0) / 4.0).collect();
        let dt = [0.3, -0.2, 0.5, 0.1, -0.4, 0.2];
        let (a, d, bias) = ([-0.5, -1.5], [0.5, -1.0], [0.1, 0.2]);
        let b: Vec<f64> = (0..6).map(|i| (i as f64) / 3.0 - 1.0).collect();
        let c: Vec<f64> = (0..6).map(|i| 1.0 - (i as f64) / 5.0).collect();
        let state: Vec<f64> = (0..8).map(|i| i as f64 / 8.0).collect();
        let inputs = ScanInputs {
            x: &x,
            dt: &dt,
            a: &a,
            b: &b,
            c: &c,
            state: &state,
            d: &d,
            z: &[],
            dt_bias: &bias,
        };
        let (y, end) = ssd(&inputs, &[0, 3], shape, true);
        let mut h = state.clone();
        let one = Heads { seqs: 1, ..shape };
        for t in 0..3 {
            let (yt, next) = state_update(
                &h,
                &x[t * 4..t * 4 + 4],
                &dt[t * 2..t * 2 + 2],
                &a,
                &b[t * 2..t * 2 + 2],
                &c[t * 2..t * 2 + 2],
                &d,
                &bias,
                true,
                one,
            );
            assert_eq!(yt, y[t * 4..t * 4 + 4].to_vec());
            h = next;
        }
        assert_eq!(h, end);
    }

    #[test]
    fn mamba1_is_ssd_with_one_decay_per_channel() {
        // one group, P = 1: the two scans are the same recurrence
        let x = [1.0f64, -2.0, 0.5, 3.0];
        let dt = [0.2, 0.4, 0.6, 0.8];
        let b = [1.0, 0.5, -1.0, 2.0];
        let c = [0.5, 1.0, 2.0, -1.0];
        let state = [0.1, 0.2, 0.3, 0.4];
        let m1 = ScanInputs {
            x: &x,
            dt: &dt,
            a: &[-1.0, -1.0, -2.0, -2.0],
            b: &b,
            c: &c,
            state: &state,
            d: &[],
            z: &[],
            dt_bias: &[],
        };
        let m2 = ScanInputs {
            a: &[-1.0, -2.0],
            ..m1
        };
        let (y1, s1) = selective(&m1, &[0, 2], 2, 2, false);
        let (y2, s2) = ssd(
            &m2,
            &[0, 2],
            Heads {
                seqs: 1,
                heads: 2,
                p: 1,
                groups: 1,
                n: 2,
            },
            false,
        );
        assert_eq!((y1, s1), (y2, s2));
    }
}
