//! The attention kernels (contract: `pyagent_ref.ops.attention`), on validated input.
//!
//! Layout: a cache is C-contiguous (num_blocks, block_size, num_kv_heads, head_size),
//! so position j of a request lives in block `blocks[j / block_size]`, row
//! `j % block_size`. Query token i of a request with q_len tokens and seq_len positions
//! sits at position `seq_len - q_len + i` and sees the keys j with
//! `max(0, p - window + 1) <= j <= p` (`j < seq_len` in place of `j <= p` when not
//! causal) and `mask[i][j]` when the request has a mask.
//!
//! `attention` reads the cache in place (no gathered copy of K/V). One work item is a
//! (request, KV head, run of query tokens): the `group = num_heads / num_kv_heads`
//! query heads that share the KV head are its rows, so every key and value row is
//! loaded once per item and used by all of them (GQA; MQA with one KV head). An item
//! walks its keys in tiles of `TILE` positions through the block table and keeps an
//! online softmax per row: running max, running sum of exp(score - max), and the
//! running weighted sum of values, rescaled when the max grows. Scores and softmax are
//! computed in `C` (f32, or f64 for f64 queries) as the reference does; rows that see
//! no key get zeros.
//!
//! Items run in parallel (rayon) when the batch has enough work to share
//! (`PARALLEL_WORK`); a small batch stays on the calling thread. Vectors are padded to
//! a multiple of `LANES` so the dot products and weighted sums are fixed-width lane
//! loops that the compiler vectorises; a cache of the compute type whose head_size is a
//! multiple of `LANES` is read without a copy (values always, keys where a tile keeps
//! them row-major: see `Tile`); `attend_item` compiles them for AVX-512, AVX2 and
//! baseline x86-64 and picks one at run time (`crate::float::multiversion`). As in
//! `crate::float`, no build contracts `a * b + c` into an FMA, and every sum has one
//! fixed order (a tile's softmax max and sum pairwise: `reduce`), so every build gives
//! the same bits.

use std::any::TypeId;
use std::ops::{Range, RangeInclusive};

use numpy::ndarray::{ArrayView2, ArrayView3, Axis};
use rayon::prelude::*;

use crate::elem::{Compute, Elem};
use crate::float::multiversion;

/// Width of the vectorised loops (one AVX-512 vector of f32).
const LANES: usize = 16;
/// Key positions per tile.
const TILE: usize = 16;
/// Query tokens per work item of a prefill chunk (items of one request run in parallel).
const TOKENS_PER_ITEM: usize = 32;
/// Rough cost, in per-element stores, of the sum across lanes that ends a row-major dot
/// product: key tiles are transposed when rows * this >= head_size (see `Tile`).
const LANE_SUM_COST: usize = 32;
/// The reference's floor on a softmax denominator (a row with no visible key gets 0).
const MIN_SUM: f64 = 1e-30;
/// Multiply-adds (query rows x positions x head_size) below which a batch runs on the
/// calling thread: handing work to the thread pool and waiting for it costs tens of
/// microseconds (more on a busy machine), more than a decode step of a small model.
const PARALLEL_WORK: usize = 1 << 18;

/// One layer's paged KV cache, read in place.
pub struct Cache<'a, E> {
    /// (num_blocks, block_size, num_kv_heads, head_size), C order.
    pub keys: &'a [E],
    /// Same shape as `keys`.
    pub values: &'a [E],
    pub num_blocks: usize,
    pub block_size: usize,
    pub num_kv_heads: usize,
    pub head_size: usize,
}

impl<E> Cache<'_, E> {
    /// Index of the first element of (block, row, kv_head).
    #[inline(always)]
    fn row(&self, block: usize, row: usize, kv_head: usize) -> usize {
        ((block * self.block_size + row) * self.num_kv_heads + kv_head) * self.head_size
    }
}

/// One request of the flattened batch.
#[derive(Clone, Copy, Debug)]
pub struct Request<'a> {
    /// Its query tokens are first_token..first_token + q_len of the query array.
    pub first_token: usize,
    pub q_len: usize,
    /// Positions in its sequence, counting its query tokens.
    pub seq_len: usize,
    /// Its row of the block table (entries past its last block are never read).
    pub blocks: &'a [i64],
    /// Row-major (q_len, seq_len) visibility, AND-ed with the causal mask.
    pub mask: Option<&'a [bool]>,
}

/// How a score is computed from q . k (see `paged_attention`'s contract).
pub struct Scoring<C> {
    pub scale: C,
    /// Attend to at most this many most recent positions (< 1: to none).
    pub window: Option<i64>,
    pub soft_cap: Option<C>,
    /// One slope per query head.
    pub alibi: Option<Vec<C>>,
    /// A query sees the keys up to its own position (else every key of its sequence).
    pub causal: bool,
}

impl<C: Compute> Scoring<C> {
    /// The scores of a tile's keys from their dot products with one query row of `head`:
    /// scale * dot, plus the ALiBi bias slope[head] * (j - p), then the soft cap; key jj
    /// sits `distance + jj` positions from the query, and keys outside `visible` get -inf.
    #[inline(always)]
    fn scores(
        &self,
        dots: &[C; TILE],
        head: usize,
        distance: i64,
        visible: RangeInclusive<usize>,
    ) -> [C; TILE] {
        let mut x = dots.map(|dot| dot * self.scale);
        if let Some(slopes) = &self.alibi {
            for (jj, x) in x.iter_mut().enumerate() {
                *x = *x + slopes[head] * C::from_f64((distance + jj as i64) as f64);
            }
        }
        if let Some(cap) = self.soft_cap {
            for x in &mut x {
                *x = cap * (*x / cap).tanh_();
            }
        }
        for (jj, x) in x.iter_mut().enumerate() {
            if !visible.contains(&jj) {
                *x = C::NEG_INF;
            }
        }
        x
    }

    /// The last position a query at position p of a sequence of seq_len sees.
    #[inline(always)]
    fn last_visible(&self, p: i64, seq_len: usize) -> i64 {
        if self.causal {
            p
        } else {
            seq_len as i64 - 1
        }
    }

    /// The first position a query at position p sees.
    #[inline(always)]
    fn first_visible(&self, p: i64) -> i64 {
        match self.window {
            Some(w) => p.saturating_sub(w).saturating_add(1).max(0),
            None => 0,
        }
    }
}

/// Query vectors in the compute type: (num_tokens, num_heads, head_size), C order.
pub struct Queries<'a, C> {
    pub data: &'a [C],
    pub num_tokens: usize,
    pub num_heads: usize,
}

/// Checks everything `attention` relies on (beyond the slices' lengths matching the
/// shapes given), so that no index goes out of bounds: the error names the argument.
pub fn check_batch<E, C>(
    cache: &Cache<'_, E>,
    queries: &Queries<'_, C>,
    requests: &[Request<'_>],
    scoring: &Scoring<C>,
) -> Result<(), String> {
    let (bs, kvh, d) = (cache.block_size, cache.num_kv_heads, cache.head_size);
    let cache_len = cache.num_blocks * bs * kvh * d;
    if cache.keys.len() != cache_len || cache.values.len() != cache_len {
        return Err("key_cache and value_cache must have the same shape".into());
    }
    if queries.data.len() != queries.num_tokens * queries.num_heads * d {
        return Err("query must have the cache's head_size".into());
    }
    if kvh == 0 || queries.num_heads % kvh != 0 {
        return Err(format!(
            "query heads ({}) must be a multiple of the cache's KV heads ({kvh})",
            queries.num_heads
        ));
    }
    if let Some(slopes) = &scoring.alibi {
        if slopes.len() != queries.num_heads {
            return Err(format!(
                "alibi_slopes must have shape ({},), got ({},)",
                queries.num_heads,
                slopes.len()
            ));
        }
    }
    for (r, req) in requests.iter().enumerate() {
        if req.q_len == 0 {
            continue;
        }
        if req.first_token + req.q_len > queries.num_tokens {
            return Err(format!(
                "request {r}: query tokens {}..{} past the {} query tokens",
                req.first_token,
                req.first_token + req.q_len,
                queries.num_tokens
            ));
        }
        if req.seq_len < req.q_len {
            return Err(format!(
                "request {r}: seq_len {} must cover its {} query tokens",
                req.seq_len, req.q_len
            ));
        }
        if bs == 0 {
            return Err("key_cache must have a block_size >= 1".into());
        }
        let used = req.seq_len.div_ceil(bs);
        if used > req.blocks.len() {
            return Err(format!(
                "request {r}: seq_len {} does not fit {} blocks of {bs}",
                req.seq_len,
                req.blocks.len()
            ));
        }
        if let Some(c) = req.blocks[..used]
            .iter()
            .position(|&b| b < 0 || b as u64 >= cache.num_blocks as u64)
        {
            return Err(format!(
                "block_table[{r}, {c}] = {} is not a block of the cache ({} blocks)",
                req.blocks[c], cache.num_blocks
            ));
        }
        if req.mask.is_some_and(|m| m.len() != req.q_len * req.seq_len) {
            return Err(format!(
                "custom_masks[{r}] must have shape (q_len, seq_len) = ({}, {})",
                req.q_len, req.seq_len
            ));
        }
    }
    Ok(())
}

/// Paged attention (causal or not) of a validated batch (`check_batch`): a (num_tokens,
/// num_heads, head_size) C-order result in `C`; tokens no request owns get zeros.
pub fn attention<E: Elem, C: Compute>(
    cache: &Cache<'_, E>,
    queries: &Queries<'_, C>,
    requests: &[Request<'_>],
    scoring: &Scoring<C>,
) -> Vec<C> {
    let (heads, d) = (queries.num_heads, cache.head_size);
    let group = heads / cache.num_kv_heads;
    let items: Vec<(usize, usize, Range<usize>)> = requests
        .iter()
        .enumerate()
        .flat_map(|(r, req)| {
            (0..cache.num_kv_heads).flat_map(move |g| {
                (0..req.q_len)
                    .step_by(TOKENS_PER_ITEM)
                    .map(move |i| (r, g, i..(i + TOKENS_PER_ITEM).min(req.q_len)))
            })
        })
        .collect();
    let run = |(r, g, tokens): &(usize, usize, Range<usize>)| {
        attend_item(cache, queries, &requests[*r], *g, tokens.clone(), scoring)
    };
    let work = requests.iter().map(|r| r.q_len * r.seq_len).sum::<usize>() * heads * d;
    let results: Vec<Vec<C>> = if work < PARALLEL_WORK {
        items.iter().map(run).collect()
    } else {
        items.par_iter().map(run).collect()
    };
    let mut out = vec![C::ZERO; queries.num_tokens * heads * d];
    for ((r, g, tokens), rows) in items.iter().zip(&results) {
        for (ti, i) in tokens.clone().enumerate() {
            let t = requests[*r].first_token + i;
            let at = (t * heads + g * group) * d;
            out[at..at + group * d].copy_from_slice(&rows[ti * group * d..][..group * d]);
        }
    }
    out
}

multiversion! {
    /// `attend_item_imp` compiled for AVX-512, AVX2 and baseline x86-64, picked at run time.
    fn attend_item<E: Elem, C: Compute>(
        cache: &Cache<'_, E>,
        queries: &Queries<'_, C>,
        req: &Request<'_>,
        kv_head: usize,
        tokens: Range<usize>,
        scoring: &Scoring<C>,
    ) -> Vec<C> = attend_item_imp;
}

/// One work item: query tokens `tokens` of `req` (indices within the request), with the
/// query heads of KV head `kv_head`. Returns their outputs as rows (token, head in
/// group) of head_size values, normalised.
#[inline(always)]
fn attend_item_imp<E: Elem, C: Compute>(
    cache: &Cache<'_, E>,
    queries: &Queries<'_, C>,
    req: &Request<'_>,
    kv_head: usize,
    tokens: Range<usize>,
    scoring: &Scoring<C>,
) -> Vec<C> {
    let (heads, d) = (queries.num_heads, cache.head_size);
    let dp = d.next_multiple_of(LANES);
    let group = heads / cache.num_kv_heads;
    let rows = tokens.len() * group;

    // The item's query rows, zero-padded to dp.
    let mut q = vec![C::ZERO; rows * dp];
    for (ti, i) in tokens.clone().enumerate() {
        let t = req.first_token + i;
        for k in 0..group {
            let h = kv_head * group + k;
            let src = &queries.data[(t * heads + h) * d..][..d];
            q[(ti * group + k) * dp..][..d].copy_from_slice(src);
        }
    }
    let position = |i: usize| (req.seq_len - req.q_len + i) as i64;
    let first_key = scoring.first_visible(position(tokens.start));
    let last_key = scoring.last_visible(position(tokens.end - 1), req.seq_len);

    let mut tile = Tile::new(cache, rows * LANE_SUM_COST >= d);
    let mut max = vec![C::NEG_INF; rows];
    let mut sum = vec![C::ZERO; rows];
    let mut acc = vec![C::ZERO; rows * dp];
    let mut j0 = first_key;
    while j0 <= last_key {
        let n = (last_key - j0 + 1).min(TILE as i64) as usize;
        tile.load(cache, req.blocks, kv_head, j0 as usize, n);
        for (ti, i) in tokens.clone().enumerate() {
            let p = position(i);
            let lo = scoring.first_visible(p).max(j0);
            let hi = scoring.last_visible(p, req.seq_len).min(j0 + n as i64 - 1);
            if lo > hi {
                continue;
            }
            let (first, last) = ((lo - j0) as usize, (hi - j0) as usize);
            let mask = req.mask.map(|m| &m[i * req.seq_len + lo as usize..]);
            for k in 0..group {
                let m = ti * group + k;
                let dots = tile.dots(&q[m * dp..][..dp], first..last + 1);
                let mut scores = scoring.scores(&dots, kv_head * group + k, j0 - p, first..=last);
                if let Some(mask) = mask {
                    for (s, &seen) in scores[first..=last].iter_mut().zip(mask) {
                        if !seen {
                            *s = C::NEG_INF;
                        }
                    }
                }
                let row = &mut acc[m * dp..][..dp];
                tile.accumulate(&scores, &mut max[m], &mut sum[m], row);
            }
        }
        j0 += TILE as i64;
    }

    let mut out = vec![C::ZERO; rows * d];
    let floor = C::from_f64(MIN_SUM);
    for m in 0..rows {
        let denominator = if sum[m] > floor { sum[m] } else { floor };
        for (o, &a) in out[m * d..][..d].iter_mut().zip(&acc[m * dp..][..d]) {
            *o = a / denominator;
        }
    }
    out
}

/// The keys and values of up to TILE consecutive positions of one KV head, as rows of
/// `dp` values in `C` (head_size values, then zeros).
///
/// A cache of `C` with head_size a multiple of LANES is read in place: the tile only
/// notes where each position's row starts (a decode step reads each key and value
/// once, so a copy would cost as much as the arithmetic). Any other cache is converted
/// into the tile's buffers. Keys take one of two layouts for the dot products q . k_j.
/// Row-major: one dot product per key, ending in a sum across lanes; best when few
/// query rows share the tile (decode). Transposed (dp rows of TILE: element c of every
/// key side by side): the scores of all TILE keys build up in one vector, q[c] times
/// row c, without a sum across lanes; the transposition costs a scattered write per
/// element, repaid when many rows share the tile (prefill: rows * LANE_SUM_COST >=
/// head_size).
struct Tile<'c, C> {
    /// The key cache as `C`, read in place (row-major keys only), else None.
    key_cache: Option<&'c [C]>,
    /// The value cache as `C`, read in place, else None.
    value_cache: Option<&'c [C]>,
    transposed: bool,
    dp: usize,
    /// Positions in the tile.
    n: usize,
    /// Where each position's row starts in the caches.
    at: [usize; TILE],
    /// Converted keys (TILE rows of dp, or dp rows of TILE when transposed) and values
    /// (TILE rows of dp), when not read in place.
    keys: Vec<C>,
    values: Vec<C>,
}

impl<'c, C: Compute> Tile<'c, C> {
    fn new<E: Elem>(cache: &Cache<'c, E>, transposed: bool) -> Self {
        let dp = cache.head_size.next_multiple_of(LANES);
        let in_place = |x| {
            (dp == cache.head_size)
                .then(|| as_compute::<E, C>(x))
                .flatten()
        };
        let key_cache = if transposed {
            None
        } else {
            in_place(cache.keys)
        };
        let value_cache = in_place(cache.values);
        let buffer = |cache: Option<&[C]>| match cache {
            Some(_) => Vec::new(),
            None => vec![C::ZERO; TILE * dp],
        };
        Tile {
            keys: buffer(key_cache),
            values: buffer(value_cache),
            key_cache,
            value_cache,
            transposed,
            dp,
            n: 0,
            at: [0; TILE],
        }
    }

    /// Loads positions start..start + n (n <= TILE) of a request of `blocks`.
    #[inline(always)]
    fn load<E: Elem>(
        &mut self,
        cache: &Cache<'_, E>,
        blocks: &[i64],
        kv_head: usize,
        start: usize,
        n: usize,
    ) {
        let (bs, d, dp) = (cache.block_size, cache.head_size, self.dp);
        let (mut block, mut row) = (start / bs, start % bs);
        self.n = n;
        for jj in 0..n {
            let at = cache.row(blocks[block] as usize, row, kv_head);
            self.at[jj] = at;
            let key = &cache.keys[at..at + d];
            if self.transposed {
                for (column, &x) in self.keys.chunks_exact_mut(TILE).zip(key) {
                    column[jj % TILE] = C::from_elem(x);
                }
            } else if self.key_cache.is_none() {
                load_row(key, &mut self.keys[jj * dp..][..d]);
            }
            if self.value_cache.is_none() {
                load_row(&cache.values[at..at + d], &mut self.values[jj * dp..][..d]);
            }
            row += 1;
            if row == bs {
                row = 0;
                block += 1;
            }
        }
    }

    /// Row-major key jj (dp values).
    #[inline(always)]
    fn key(&self, jj: usize) -> &[C] {
        match self.key_cache {
            Some(keys) => &keys[self.at[jj]..][..self.dp],
            None => &self.keys[jj * self.dp..][..self.dp],
        }
    }

    /// Value jj (dp values).
    #[inline(always)]
    fn value(&self, jj: usize) -> &[C] {
        match self.value_cache {
            Some(values) => &values[self.at[jj]..][..self.dp],
            None => &self.values[jj * self.dp..][..self.dp],
        }
    }

    /// q . k_jj for the tile's keys jj in `range` (other lanes: unspecified).
    #[inline(always)]
    fn dots(&self, q: &[C], range: Range<usize>) -> [C; TILE] {
        let mut out = [C::ZERO; TILE];
        if self.transposed {
            // four independent sums (c mod 4), so the additions do not wait on each other
            let mut part = [[C::ZERO; TILE]; 4];
            for (c4, q4) in q.chunks_exact(4).enumerate() {
                for (i, &qc) in q4.iter().enumerate() {
                    let k: &[C; TILE] =
                        self.keys[(4 * c4 + i) * TILE..][..TILE].try_into().unwrap();
                    for l in 0..TILE {
                        part[i][l] = part[i][l] + qc * k[l];
                    }
                }
            }
            for l in 0..TILE {
                out[l] = (part[0][l] + part[1][l]) + (part[2][l] + part[3][l]);
            }
        } else {
            for jj in range {
                out[jj] = dot(q, self.key(jj));
            }
        }
        out
    }

    /// Online softmax step of one row over the tile: `scores` (-inf where not visible)
    /// update the row's running max, sum and weighted sum of the values (`acc`, dp).
    #[inline(always)]
    fn accumulate(&self, scores: &[C; TILE], max: &mut C, sum: &mut C, acc: &mut [C]) {
        let tile_max = reduce(*scores, |a, b| if b > a { b } else { a });
        if tile_max == C::NEG_INF {
            return; // nothing visible in this tile
        }
        if tile_max > *max {
            if *max != C::NEG_INF {
                let f = (*max - tile_max).exp_fast();
                *sum = *sum * f;
                for a in acc.iter_mut() {
                    *a = *a * f;
                }
            }
            *max = tile_max;
        }
        let mut w = [C::ZERO; TILE];
        for jj in 0..TILE {
            w[jj] = (scores[jj] - *max).exp_fast();
        }
        *sum = *sum + reduce(w, |a, b| a + b);
        for c in (0..self.dp).step_by(LANES) {
            let mut a: [C; LANES] = acc[c..c + LANES].try_into().unwrap();
            for (jj, &wj) in w[..self.n].iter().enumerate() {
                let v: &[C; LANES] = self.value(jj)[c..c + LANES].try_into().unwrap();
                for l in 0..LANES {
                    a[l] = a[l] + wj * v[l];
                }
            }
            acc[c..c + LANES].copy_from_slice(&a);
        }
    }
}

/// `x` as a slice of `C` when E is C (read in place), else None.
fn as_compute<E: Elem, C: Compute>(x: &[E]) -> Option<&[C]> {
    // SAFETY: E and C are the same type (checked first).
    (TypeId::of::<E>() == TypeId::of::<C>())
        .then(|| unsafe { std::slice::from_raw_parts(x.as_ptr().cast(), x.len()) })
}

/// q . k over rows padded to a multiple of LANES: LANES partial sums, then their sum.
#[inline(always)]
fn dot<C: Compute>(q: &[C], k: &[C]) -> C {
    let mut acc = [C::ZERO; LANES];
    for c in (0..q.len()).step_by(LANES) {
        let a: &[C; LANES] = q[c..c + LANES].try_into().unwrap();
        let b: &[C; LANES] = k[c..c + LANES].try_into().unwrap();
        for l in 0..LANES {
            acc[l] = acc[l] + a[l] * b[l];
        }
    }
    acc.iter().fold(C::ZERO, |s, &x| s + x)
}

/// `op` over the N values, pairwise: the upper half onto the lower half until one value
/// is left (a fixed order, and a few vector operations rather than a chain of N - 1).
#[inline(always)]
fn reduce<C: Copy, const N: usize>(mut x: [C; N], op: impl Fn(C, C) -> C) -> C {
    let mut half = N / 2;
    while half > 0 {
        for l in 0..half {
            x[l] = op(x[l], x[l + half]);
        }
        half /= 2;
    }
    x[0]
}

/// `dst[c] = src[c]` in `C` for the `src.len()` values: a loop over whole vectors that
/// the compiler keeps inline (a key or value row is too short to pay for a memcpy call).
#[inline(always)]
fn load_row<E: Elem, C: Compute>(src: &[E], dst: &mut [C]) {
    let whole = src.len() / LANES * LANES;
    for (d, s) in dst[..whole]
        .chunks_exact_mut(LANES)
        .zip(src[..whole].chunks_exact(LANES))
    {
        for l in 0..LANES {
            d[l] = C::from_elem(s[l]);
        }
    }
    for (d, &s) in dst[whole..].iter_mut().zip(&src[whole..]) {
        *d = C::from_elem(s);
    }
}

/// Writes row t of `src` (num_tokens, num_kv_heads, head_size) into slot `slots[t]` of
/// `cache` (num_slots rows of num_kv_heads * head_size), cast to the cache's type
/// (`Elem::cast`), for
/// every t with a slot >= 0, in token order (a repeated slot keeps the last token's).
/// The caller checks that src has the cache's row shape and one token per slot, and
/// that every slot is < num_slots.
pub fn write_slots<S: Elem, D: Elem>(src: ArrayView3<'_, S>, cache: &mut [D], slots: &[i64]) {
    let row_len = src.shape()[1] * src.shape()[2];
    for (t, &slot) in slots.iter().enumerate() {
        if slot < 0 {
            continue;
        }
        let dst = &mut cache[slot as usize * row_len..][..row_len];
        let row = src.index_axis(Axis(0), t);
        match row.as_slice() {
            // a contiguous row: a loop over a slice (a copy when S is D)
            Some(row) => dst.iter_mut().zip(row).for_each(|(o, &x)| *o = x.cast()),
            None => dst
                .iter_mut()
                .zip(row.iter())
                .for_each(|(o, &x)| *o = x.cast()),
        }
    }
}

/// Write row t of `src` (num_tokens, width) into columns offset..offset + width of row
/// slot_mapping[t] of `cache` (num_slots rows of `row_len`), cast to the cache's type,
/// for every t with a slot >= 0 (MLA's latent: kv_c at offset 0, k_pe after it). The
/// caller checks that offset + width <= row_len, one token per slot and every slot <
/// num_slots.
pub fn write_slot_columns<S: Elem, D: Elem>(
    src: ArrayView2<'_, S>,
    cache: &mut [D],
    row_len: usize,
    offset: usize,
    slots: &[i64],
) {
    let width = src.shape()[1];
    for (t, &slot) in slots.iter().enumerate() {
        if slot < 0 {
            continue;
        }
        let dst = &mut cache[slot as usize * row_len + offset..][..width];
        let row = src.index_axis(Axis(0), t);
        match row.as_slice() {
            Some(row) => dst.iter_mut().zip(row).for_each(|(o, &x)| *o = x.cast()),
            None => dst
                .iter_mut()
                .zip(row.iter())
                .for_each(|(o, &x)| *o = x.cast()),
        }
    }
}
