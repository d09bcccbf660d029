//! The attention kernel against a dense attention written position by position, in
//! both key-tile layouts, and the checks that keep bad input away from the kernel.

use super::kernels::{
    attention, check_batch, write_slot_columns, write_slots, Cache, Queries, Request, Scoring,
};
use crate::elem::{Bf16, Elem};
use numpy::ndarray::{Array2, Array3};

/// A deterministic value in [-1, 1).
fn value(i: usize) -> f64 {
    ((i.wrapping_mul(2_654_435_761) % 2000) as f64) / 1000.0 - 1.0
}

/// Dense attention of one query row in f64 (window, no mask): causal, or over every key
/// when `causal` is false.
fn dense(
    q: &[f64],
    keys: &[Vec<f64>],
    values: &[Vec<f64>],
    p: usize,
    window: Option<i64>,
    causal: bool,
) -> Vec<f64> {
    let lo = window.map_or(0, |w| (p as i64 - w + 1).max(0) as usize);
    let hi = if causal { p } else { keys.len() - 1 };
    let scores: Vec<f64> = (lo..=hi)
        .map(|j| q.iter().zip(&keys[j]).map(|(a, b)| a * b).sum::<f64>() * 0.5)
        .collect();
    let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let w: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
    let sum: f64 = w.iter().sum();
    (0..q.len())
        .map(|c| (lo..=hi).map(|j| w[j - lo] * values[j][c]).sum::<f64>() / sum)
        .collect()
}

/// One request of `q_len` tokens at the end of `seq_len` positions, `group` query heads
/// per KV head, blocks in reverse order; the kernel's result against `dense`.
fn check_against_dense(q_len: usize, seq_len: usize, group: usize, d: usize, window: Option<i64>) {
    check_against_dense_causal(q_len, seq_len, group, d, window, true);
}

fn check_against_dense_causal(
    q_len: usize,
    seq_len: usize,
    group: usize,
    d: usize,
    window: Option<i64>,
    causal: bool,
) {
    let (bs, kvh) = (3, 2);
    let heads = group * kvh;
    let nb = seq_len.div_ceil(bs) + 1;
    let keys: Vec<f64> = (0..nb * bs * kvh * d).map(value).collect();
    let values: Vec<f64> = (0..nb * bs * kvh * d).map(|i| value(i + 7)).collect();
    let blocks: Vec<i64> = (0..nb as i64 - 1).rev().collect();
    let query: Vec<f64> = (0..q_len * heads * d).map(|i| value(i + 13)).collect();
    let cache = Cache {
        keys: &keys,
        values: &values,
        num_blocks: nb,
        block_size: bs,
        num_kv_heads: kvh,
        head_size: d,
    };
    let queries = Queries {
        data: &query,
        num_tokens: q_len,
        num_heads: heads,
    };
    let requests = [Request {
        first_token: 0,
        q_len,
        seq_len,
        blocks: &blocks,
        mask: None,
    }];
    let scoring = Scoring {
        scale: 0.5,
        window,
        soft_cap: None,
        alibi: None,
        causal,
    };
    check_batch(&cache, &queries, &requests, &scoring).unwrap();
    let out = attention(&cache, &queries, &requests, &scoring);
    for g in 0..kvh {
        let at = |j: usize, src: &[f64]| {
            let i = cache_index(blocks[j / bs] as usize, j % bs, g, bs, kvh, d);
            src[i..i + d].to_vec()
        };
        let k: Vec<Vec<f64>> = (0..seq_len).map(|j| at(j, &keys)).collect();
        let v: Vec<Vec<f64>> = (0..seq_len).map(|j| at(j, &values)).collect();
        for i in 0..q_len {
            for h in g * group..(g + 1) * group {
                let row = (i * heads + h) * d;
                let p = seq_len - q_len + i;
                let want = dense(&query[row..row + d], &k, &v, p, window, causal);
                for c in 0..d {
                    assert!((out[row + c] - want[c]).abs() < 1e-12, "token {i} head {h}");
                }
            }
        }
    }
}

fn cache_index(block: usize, row: usize, g: usize, bs: usize, kvh: usize, d: usize) -> usize {
    ((block * bs + row) * kvh + g) * d
}

#[test]
fn decode_rows_use_row_major_tiles_and_match_dense() {
    check_against_dense(1, 40, 1, 128, None); // 1 row * 32 < 128: row-major dots
    check_against_dense(1, 17, 2, 64, Some(5));
}

#[test]
fn prefill_rows_use_transposed_tiles_and_match_dense() {
    check_against_dense(40, 45, 3, 8, None); // two work items of one request
    check_against_dense(5, 5, 2, 20, Some(2));
}

#[test]
fn non_causal_rows_see_every_key_of_their_sequence() {
    check_against_dense_causal(45, 45, 2, 8, None, false); // an encoder's whole prompt
    check_against_dense_causal(3, 7, 1, 16, Some(4), false); // after cached keys, windowed
}

#[test]
fn check_batch_rejects_what_the_kernel_cannot_read() {
    let data = vec![0.0f32; 2 * 2 * 4]; // 2 blocks of 2 slots, 1 KV head of 4
    let cache = Cache {
        keys: &data,
        values: &data,
        num_blocks: 2,
        block_size: 2,
        num_kv_heads: 1,
        head_size: 4,
    };
    let query = vec![0.0f32; 2 * 2 * 4];
    let queries = Queries {
        data: &query,
        num_tokens: 2,
        num_heads: 2,
    };
    let scoring = Scoring {
        scale: 1.0,
        window: None,
        soft_cap: None,
        alibi: None,
        causal: true,
    };
    let blocks = [0i64, 5];
    let req = |first_token, q_len, seq_len| Request {
        first_token,
        q_len,
        seq_len,
        blocks: &blocks,
        mask: None,
    };
    let err = |r: Request<'_>| check_batch(&cache, &queries, &[r], &scoring).unwrap_err();
    assert!(err(req(0, 1, 3)).contains("block_table[0, 1] = 5"));
    assert!(err(req(1, 2, 2)).contains("past the 2 query tokens"));
    assert!(err(req(0, 2, 1)).contains("must cover"));
    assert!(err(req(0, 1, 5)).contains("does not fit"));
    assert!(check_batch(&cache, &queries, &[req(0, 1, 2), req(1, 0, 99)], &scoring).is_ok());
}

#[test]
fn write_slots_casts_and_skips_padding() {
    let src = Array3::from_shape_fn((3, 1, 2), |(t, _, c)| t as f32 + c as f32 / 4.0);
    let mut cache = vec![Bf16::default(); 4 * 2];
    write_slots(src.view(), &mut cache, &[2, -1, 0]);
    let got: Vec<f32> = cache.iter().map(|x| x.load()).collect();
    assert_eq!(got, [2.0, 2.25, 0.0, 0.0, 0.0, 0.25, 0.0, 0.0]);
    assert_eq!(Bf16::store(1.0 / 3.0).load(), 0.333_984_38);
}

#[test]
fn write_slot_columns_fills_its_columns_only() {
    let kv_c = Array2::from_shape_fn((2, 3), |(t, c)| (10 * t + c) as f64);
    let k_pe = Array2::from_shape_fn((2, 2), |(t, c)| -((10 * t + c) as f64));
    let mut cache = vec![7.0_f32; 3 * 5];
    write_slot_columns(kv_c.view(), &mut cache, 5, 0, &[2, -1]);
    write_slot_columns(k_pe.view(), &mut cache, 5, 3, &[2, -1]);
    assert_eq!(&cache[10..15], &[0.0, 1.0, 2.0, 0.0, -1.0]);
    assert!(cache[..10].iter().all(|&x| x == 7.0));
}
