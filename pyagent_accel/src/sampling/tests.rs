//! Unit tests of the sampling kernels and helpers against brute-force versions.

use super::kernels::sample_row;
use super::row_scan::{first_error, pairwise_sum, scan, RowStatus};
use super::select::{kth_largest, top_p_threshold};
use crate::philox;

fn lcg(seed: &mut u64) -> f64 {
    *seed = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    ((*seed >> 11) as f64) / (1u64 << 53) as f64
}

/// `n` normal(0, scale) values (Box-Muller on the LCG), as f32.
fn normal_row(n: usize, scale: f64, seed: u64) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            let (u1, u2) = (lcg(&mut s).max(1e-300), lcg(&mut s));
            (scale * (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32
        })
        .collect()
}
#[test]
fn pairwise_sum_small_and_large() {
    let v: Vec<f64> = (0..1000).map(|i| i as f64).collect();
    assert_eq!(pairwise_sum(&v), 499500.0);
    assert_eq!(pairwise_sum::<f64>(&[]), -0.0);
    assert_eq!(pairwise_sum(&[1.0f32, 2.0, 3.0]), 6.0);
}

/// numpy's `pairwise_sum`, transcribed with its recursion: the oracle of the iterative one.
fn numpy_pairwise(a: &[f32]) -> f32 {
    let n = a.len();
    if n < 8 {
        return a.iter().fold(-0.0, |s, &x| s + x);
    }
    if n <= 128 {
        let mut r: [f32; 8] = a[..8].try_into().unwrap();
        let mut i = 8;
        while i < n - n % 8 {
            for j in 0..8 {
                r[j] += a[i + j];
            }
            i += 8;
        }
        let mut res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for &x in &a[i..] {
            res += x;
        }
        return res;
    }
    let n2 = n / 2 - (n / 2) % 8;
    numpy_pairwise(&a[..n2]) + numpy_pairwise(&a[n2..])
}

#[test]
fn pairwise_sum_walks_numpys_recursion() {
    let row = normal_row(20000, 3.0, 7);
    for n in (0..300).chain([511, 512, 1000, 1024, 3072, 4097, 12345, 20000]) {
        let got = pairwise_sum(&row[..n]);
        assert_eq!(got.to_bits(), numpy_pairwise(&row[..n]).to_bits(), "n={n}");
    }
}

#[test]
fn kth_largest_matches_sort() {
    for (n, k) in [
        (100, 1),
        (5000, 50),
        (5000, 1),
        (5000, 4999),
        (20000, 7),
        (20000, 600),
    ] {
        let row = normal_row(n, 3.0, n as u64 + k as u64);
        let mut sorted = row.clone();
        sorted.sort_by(|a, b| b.total_cmp(a));
        let mut buf = Vec::new();
        assert_eq!(kth_largest(&row, k, &mut buf), sorted[k - 1], "n={n} k={k}");
    }
    // many ties: falls back to the full selection
    let row: Vec<f32> = (0..10000).map(|i| (i % 3) as f32).collect();
    let mut buf = Vec::new();
    assert_eq!(kth_largest(&row, 10, &mut buf), 2.0);
    assert_eq!(kth_largest(&row, 4000, &mut buf), 1.0);
}

#[test]
fn top_p_threshold_matches_sorted_cumsum() {
    for (n, scale, p) in [
        (1000, 1.0, 0.9),
        (30000, 3.0, 0.9),
        (30000, 5.0, 0.5),
        (100, 0.0, 0.3),
    ] {
        let row: Vec<f64> = normal_row(n, scale, 7).iter().map(|&x| x as f64).collect();
        let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = row.iter().map(|&x| (x - m).exp()).collect();
        let s: f64 = e.iter().sum();
        let probs: Vec<f64> = e.iter().map(|v| v / s).collect();
        let mut sorted = probs.clone();
        sorted.sort_by(|a, b| b.total_cmp(a));
        let mut acc = 0.0;
        let mut want = None;
        for &v in &sorted {
            acc += v;
            if acc >= p {
                want = Some(v);
                break;
            }
        }
        let (mut cands, mut keys, mut hist) = (Vec::new(), Vec::new(), Vec::new());
        let pmax = sorted[0];
        assert_eq!(
            top_p_threshold(&probs, pmax, p, &mut keys, &mut hist, &mut cands),
            want,
            "n={n}"
        );
    }
}

#[test]
fn sample_matches_brute_force() {
    for seed in 0..20i64 {
        let row = normal_row(3000, 2.0, seed as u64);
        let mut u = vec![0.0; row.len()];
        philox::fill_uniforms(seed, 3, &mut u);
        let mut best = (f64::NEG_INFINITY, 0usize);
        for (i, (&x, &ui)) in row.iter().zip(&u).enumerate() {
            let s = x as f64 - (-(ui.ln())).ln();
            if s > best.0 {
                best = (s, i);
            }
        }
        assert_eq!(sample_row(&row, 1.0, seed, 3), Ok(best.1 as i64));
    }
    assert_eq!(sample_row(&[1.0f32, 3.0, 3.0], 0.0, 0, 0), Ok(1));
    assert_eq!(
        sample_row(&[1.0f32, f32::NAN], 1.0, 0, 0),
        Err(RowStatus::NanOrInf)
    );
    assert_eq!(
        sample_row(&[f32::NEG_INFINITY; 3], 1.0, 0, 0),
        Err(RowStatus::AllMasked)
    );
}

#[test]
fn scan_statuses() {
    assert_eq!(scan(&[1.0f64, f64::INFINITY]).0, RowStatus::NanOrInf);
    assert_eq!(scan(&[f64::NEG_INFINITY; 40]).0, RowStatus::AllMasked);
    assert_eq!(scan(&[-1.0f64, f64::NEG_INFINITY]), (RowStatus::Ok, -1.0));
    assert_eq!(
        first_error(&[RowStatus::Ok, RowStatus::AllMasked, RowStatus::NanOrInf]),
        Some((2, RowStatus::NanOrInf))
    );
}

// --- filters --------------------------------------------------------------------------

use super::filters::{allowed_row, bad_words_row, cutoff_row, no_repeat_row, typical_row, Cutoff};

fn kept(out: &[f64]) -> Vec<bool> {
    out.iter().map(|v| v.is_finite()).collect()
}

#[test]
fn typical_keeps_the_tokens_nearest_the_entropy() {
    // p = (0.7, 0.2, 0.1): H = 0.8018, distances 0.445, 0.808, 1.501
    let row: Vec<f64> = [0.7f64, 0.2, 0.1].iter().map(|p| p.ln()).collect();
    let mut out = vec![0.0; 3];
    for (mass, want) in [
        (0.5, [true, false, false]),
        (0.8, [true, true, false]),
        (1.0, [true, true, true]),
    ] {
        assert_eq!(typical_row(&row, &mut out, mass), RowStatus::Ok);
        assert_eq!(kept(&out), want, "typical_p {mass}");
    }
    // equal logits are kept together
    let row = [1.0, 1.0, 1.0, -4.0];
    let mut out = vec![0.0; 4];
    typical_row(&row, &mut out, 0.1);
    assert_eq!(kept(&out), [true, true, true, false]);
}

#[test]
fn cutoffs_are_strict_and_keep_the_max() {
    let row: Vec<f64> = [0.25f64, 0.25, 0.25, 0.125, 0.125]
        .iter()
        .map(|p| p.ln())
        .collect();
    let mut out = vec![0.0; 5];
    cutoff_row(&row, &mut out, Cutoff::Epsilon(0.5));
    assert_eq!(kept(&out), [true, true, true, false, false]);
    cutoff_row(&row, &mut out, Cutoff::Epsilon(0.0));
    assert_eq!(out, row);
    // p = (0.5, 0.499, 0.001): sqrt(0.04) * exp(-H) > 0.001
    let row: Vec<f64> = [0.5f64, 0.499, 0.001].iter().map(|p| p.ln()).collect();
    let mut out = vec![0.0; 3];
    cutoff_row(&row, &mut out, Cutoff::Eta(0.04));
    assert_eq!(kept(&out), [true, true, false]);
}

#[test]
fn token_masks() {
    let row = [1.0f64, 2.0, 3.0, 4.0, 5.0, 6.0];
    let mut out = vec![0.0; 6];
    allowed_row(&row, &mut out, &[2, -1, 0, 2]);
    assert_eq!(kept(&out), [true, false, true, false, false, false]);
    allowed_row(&row, &mut out, &[-1, -1]);
    assert_eq!(out, row);
    let words = [2, 3, 4, 3, 5, -1, 1, 2, -1, 0, -1, -1];
    bad_words_row(&row, &mut out, &[1, 2, 3, -1], &words, 3);
    assert_eq!(kept(&out), [false, true, true, true, false, false]);
    no_repeat_row(&row, &mut out, &[1, 2, 1, 3, 1, -1], 2);
    assert_eq!(kept(&out), [true, true, false, false, true, true]);
    no_repeat_row(&row, &mut out, &[1, 2, 1, 3, 1, -1], 0);
    assert_eq!(out, row);
}

use super::dry::{dry_repeats, dry_row, Dry};
use super::filters::{mirostat_update_row, xtc_row, Xtc};

/// DRY's repeats by brute force: for each i < n - 1, the common suffix of s[..= i] and s
/// that contains no breaker, credited to s[i + 1] (breakers excluded).
fn brute_dry(s: &[i64], breakers: &[i64], allowed: usize) -> Vec<(i64, usize)> {
    let n = s.len();
    let mut best: Vec<(i64, usize)> = Vec::new();
    for i in 0..n.saturating_sub(1) {
        let mut m = 0;
        while m <= i && s[i - m] == s[n - 1 - m] && !breakers.contains(&s[i - m]) {
            m += 1;
        }
        let follower = s[i + 1];
        if m >= allowed && !breakers.contains(&follower) {
            match best.iter_mut().find(|e| e.0 == follower) {
                Some(e) => e.1 = e.1.max(m),
                None => best.push((follower, m)),
            }
        }
    }
    best.sort_unstable();
    best
}

#[test]
fn dry_repeats_match_brute_force() {
    let mut seed = 5u64;
    for trial in 0..500 {
        let len = (lcg(&mut seed) * 30.0) as usize;
        let alphabet = 1 + trial % 4;
        let s: Vec<i64> = (0..len)
            .map(|_| (lcg(&mut seed) * alphabet as f64) as i64)
            .collect();
        let breakers: Vec<i64> = if trial % 3 == 0 { vec![0] } else { vec![] };
        for allowed in 1..4 {
            assert_eq!(
                dry_repeats(&s, &breakers, allowed),
                brute_dry(&s, &breakers, allowed),
                "{s:?} breakers {breakers:?} allowed {allowed}"
            );
        }
    }
}

#[test]
fn dry_penalises_and_clamps() {
    let row = [0.0f32, 1.0, 2.0, f32::NEG_INFINITY];
    let mut out = vec![0.0f32; 4];
    let dry = Dry {
        multiplier: 1.0,
        base: 2.0,
        allowed_length: 1,
        penalty_last_n: -1,
    };
    // 0 1 2 0 1: 2 would extend "0 1" (n = 2): 1 * 2 ^ (2 - 1)
    dry_row(&row, &mut out, &[0, 1, 2, 0, 1, -1], &[-1], dry);
    assert_eq!(out, [0.0, 1.0, 0.0, f32::NEG_INFINITY]);
    // a breaker 1 at the end: no repeat reaches past it
    dry_row(&row, &mut out, &[0, 1, 2, 0, 1], &[1], dry);
    assert_eq!(out, row);
    // a penalty past float32 clamps to its lowest value
    let huge = Dry {
        multiplier: 1e300,
        ..dry
    };
    dry_row(&row, &mut out, &[0, 1, 2, 0, 1], &[], huge);
    assert_eq!(out, [0.0, 1.0, f32::MIN, f32::NEG_INFINITY]);
    // the window: only the last 2 tokens ("0 1"), where nothing repeats
    let window = Dry {
        penalty_last_n: 2,
        ..dry
    };
    dry_row(&row, &mut out, &[0, 1, 2, 0, 1], &[], window);
    assert_eq!(out, row);
}

#[test]
fn xtc_keeps_the_least_likely_candidate() {
    // p = (0.4, 0.3, 0.2, 0.1): candidates at threshold 0.15 are the first three
    let row: Vec<f64> = [0.4f64, 0.3, 0.2, 0.1].iter().map(|p| p.ln()).collect();
    let mut out = vec![0.0; 4];
    let fire = Xtc {
        threshold: 0.15,
        probability: 1.0,
        coin: 0.5,
    };
    xtc_row(&row, &mut out, fire);
    assert_eq!(kept(&out), [false, false, true, true]);
    xtc_row(
        &row,
        &mut out,
        Xtc {
            coin: 0.7,
            probability: 0.6,
            ..fire
        },
    );
    assert_eq!(out, row);
    xtc_row(
        &row,
        &mut out,
        Xtc {
            threshold: 0.35,
            ..fire
        },
    ); // one candidate
    assert_eq!(out, row);
}

#[test]
fn mirostat_truncation_and_update() {
    // p = (0.5, 0.25, 0.25): surprises 1, 2, 2 bits
    let row: Vec<f64> = [0.5f64, 0.25, 0.25].iter().map(|p| p.ln()).collect();
    let mut out = vec![0.0; 3];
    cutoff_row(&row, &mut out, Cutoff::Mirostat(1.5));
    assert_eq!(kept(&out), [true, false, false]);
    cutoff_row(&row, &mut out, Cutoff::Mirostat(-3.0)); // the top stays
    assert_eq!(kept(&out), [true, false, false]);
    cutoff_row(&row, &mut out, Cutoff::Mirostat(f64::INFINITY));
    assert_eq!(out, row);
    let q = mirostat_update_row(&row, 1).unwrap();
    assert!((-q / std::f64::consts::LN_2 - 2.0).abs() < 1e-12);
    let masked = [0.0f64, f64::NEG_INFINITY];
    assert_eq!(mirostat_update_row(&masked, 1), Ok(f64::NEG_INFINITY));
}
