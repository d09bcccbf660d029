//! Philox-4x32-10 (Salmon et al., SC'11) and the uniforms `sample` draws from it.
//!
//! Bit-exact with `pyagent_ref.ops.sampling.philox4x32_10` / `philox_uniform`: the
//! generator is integer arithmetic, and a uniform is (2m + 1) * 2**-53 for a 52-bit
//! integer m, which is exact in f64.

pub const M0: u32 = 0xD251_1F53;
pub const M1: u32 = 0xCD9E_8D57;
pub const W0: u32 = 0x9E37_79B9;
pub const W1: u32 = 0xBB67_AE85;

/// Lanes per vectorised philox call: 16 blocks = 32 uniforms.
pub const LANES: usize = 16;

#[inline(always)]
fn mulhilo(m: u32, x: u32) -> (u32, u32) {
    let p = (m as u64) * (x as u64);
    ((p >> 32) as u32, p as u32)
}

/// One Philox-4x32-10 block.
#[inline(always)]
pub fn philox4x32_10(counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let [mut c0, mut c1, mut c2, mut c3] = counter;
    let [mut k0, mut k1] = key;
    for rnd in 0..10 {
        if rnd > 0 {
            k0 = k0.wrapping_add(W0);
            k1 = k1.wrapping_add(W1);
        }
        let (hi0, lo0) = mulhilo(M0, c0);
        let (hi1, lo1) = mulhilo(M1, c2);
        (c0, c1, c2, c3) = (hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0);
    }
    [c0, c1, c2, c3]
}

/// `LANES` blocks at once (same key, counters given per lane). Each 32-bit word lives
/// in a 64-bit lane so that the 32x32->64 multiplies map onto vector `pmuludq`
/// without packing and unpacking between rounds.
#[inline(always)]
pub fn philox_lanes(c: &mut [[u64; LANES]; 4], key: [u32; 2]) {
    const MASK: u64 = 0xFFFF_FFFF;
    let (mut k0, mut k1) = (key[0] as u64, key[1] as u64);
    for rnd in 0..10 {
        if rnd > 0 {
            k0 = (k0 + W0 as u64) & MASK;
            k1 = (k1 + W1 as u64) & MASK;
        }
        let [c0, c1, c2, c3] = c;
        for l in 0..LANES {
            let p0 = (c0[l] & MASK) * M0 as u64;
            let p1 = (c2[l] & MASK) * M1 as u64;
            let n0 = (p1 >> 32) ^ c1[l] ^ k0;
            let n2 = (p0 >> 32) ^ c3[l] ^ k1;
            c1[l] = p1 & MASK;
            c3[l] = p0 & MASK;
            c0[l] = n0;
            c2[l] = n2;
        }
    }
}

/// The key of a row: the seed's 64 bits as (low word, high word).
#[inline(always)]
pub fn seed_key(seed: i64) -> [u32; 2] {
    let s = seed as u64;
    [s as u32, (s >> 32) as u32]
}

/// The 52-bit integers m of uniforms [2 * j0, 2 * j0 + 2 * LANES) of the stream
/// (seed, pos): out[2l] from block j0 + l's (x0, x1), out[2l + 1] from its (x2, x3).
#[inline(always)]
pub fn mantissas(key: [u32; 2], pos: u64, j0: u64, out: &mut [u64; 2 * LANES]) {
    let mut c = [[0u64; LANES]; 4];
    for l in 0..LANES {
        let j = j0 + l as u64;
        c[0][l] = j & 0xFFFF_FFFF;
        c[1][l] = j >> 32;
        c[2][l] = pos & 0xFFFF_FFFF;
        c[3][l] = pos >> 32;
    }
    philox_lanes(&mut c, key);
    for l in 0..LANES {
        out[2 * l] = (c[1][l] << 20) | (c[0][l] >> 12);
        out[2 * l + 1] = (c[3][l] << 20) | (c[2][l] >> 12);
    }
}

const ONE_BITS: u64 = 0x3FF0_0000_0000_0000;
const TWO_M53: f64 = 1.0 / 9_007_199_254_740_992.0;

/// u = (2m + 1) * 2**-53 for m < 2**52, exactly: 1 + m 2**-52 is built from the bits,
/// minus 1 is exact (Sterbenz), plus 2**-53 is exact because the sum has 53 bits.
#[inline(always)]
pub fn uniform(m: u64) -> f64 {
    (f64::from_bits(ONE_BITS | m) - 1.0) + TWO_M53
}

/// Fill `out` (len num) with the uniforms of stream (seed, pos).
#[inline(always)]
pub fn fill_uniforms_impl(seed: i64, pos: i64, out: &mut [f64]) {
    let key = seed_key(seed);
    let pos = pos as u64;
    let mut m = [0u64; 2 * LANES];
    for (ci, chunk) in out.chunks_mut(2 * LANES).enumerate() {
        mantissas(key, pos, (ci * LANES) as u64, &mut m);
        for (o, &mi) in chunk.iter_mut().zip(m.iter()) {
            *o = uniform(mi);
        }
    }
}

/// Uniform `index` of the stream (seed, pos) alone: one Philox block, the value
/// `fill_uniforms` writes at `out[index]` (the stream does not depend on its length).
#[inline]
pub fn uniform_at(seed: i64, pos: i64, index: u64) -> f64 {
    let (j, pos) = (index / 2, pos as u64);
    let x = philox4x32_10(
        [j as u32, (j >> 32) as u32, pos as u32, (pos >> 32) as u32],
        seed_key(seed),
    );
    let (lo, hi) = if index % 2 == 0 {
        (x[0], x[1])
    } else {
        (x[2], x[3])
    };
    uniform((((hi as u64) << 32) | lo as u64) >> 12)
}

crate::float::multiversion! {
    pub fn fill_uniforms(seed: i64, pos: i64, out: &mut [f64]) -> () = fill_uniforms_impl;
}

/// Elementwise Philox over word arrays (the `philox4x32_10` op).
#[inline(always)]
fn philox_arrays_impl(words: [&[u32]; 6], out: [&mut [i64]; 4]) {
    let [c0, c1, c2, c3, k0, k1] = words;
    let [o0, o1, o2, o3] = out;
    for i in 0..o0.len() {
        let r = philox4x32_10([c0[i], c1[i], c2[i], c3[i]], [k0[i], k1[i]]);
        o0[i] = r[0] as i64;
        o1[i] = r[1] as i64;
        o2[i] = r[2] as i64;
        o3[i] = r[3] as i64;
    }
}

crate::float::multiversion! {
    /// Elementwise Philox; all slices must have the length of out[0].
    pub fn philox_arrays(words: [&[u32]; 6], out: [&mut [i64]; 4]) -> () = philox_arrays_impl;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_answers_random123() {
        assert_eq!(
            philox4x32_10([0, 0, 0, 0], [0, 0]),
            [0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8]
        );
        assert_eq!(
            philox4x32_10([u32::MAX; 4], [u32::MAX; 2]),
            [0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd]
        );
        assert_eq!(
            philox4x32_10(
                [0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344],
                [0xa4093822, 0x299f31d0]
            ),
            [0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1]
        );
    }

    #[test]
    fn lanes_match_scalar() {
        let key = seed_key(-12345);
        let mut m = [0u64; 2 * LANES];
        mantissas(key, 7, (1u64 << 32) - 3, &mut m);
        for l in 0..LANES {
            let j = (1u64 << 32) - 3 + l as u64;
            let x = philox4x32_10([j as u32, (j >> 32) as u32, 7, 0], key);
            assert_eq!(m[2 * l], (((x[1] as u64) << 32) | x[0] as u64) >> 12);
            assert_eq!(m[2 * l + 1], (((x[3] as u64) << 32) | x[2] as u64) >> 12);
        }
    }

    #[test]
    fn uniform_is_exact_and_open() {
        assert_eq!(uniform(0), 2f64.powi(-53));
        assert_eq!(uniform((1 << 52) - 1), 1.0 - 2f64.powi(-53));
        for m in [1u64, 12345, 1 << 51, (1 << 51) + 7, (1 << 52) - 2] {
            assert_eq!(uniform(m), ((m as f64) * 2.0 + 1.0) * 2f64.powi(-53));
        }
    }

    #[test]
    fn uniform_at_reads_the_stream() {
        let mut u = [0.0; 77];
        for (seed, pos) in [(0, 0), (-1, 5), (i64::MAX, (1 << 40) + 3)] {
            fill_uniforms(seed, pos, &mut u);
            for (i, &want) in u.iter().enumerate() {
                assert_eq!(uniform_at(seed, pos, i as u64), want, "{seed} {pos} {i}");
            }
        }
    }

    #[test]
    fn fill_matches_reference_formula() {
        // first uniforms of seed 0 / position 0 and seed -1 / position 5, from
        // pyagent_ref.ops.sampling.philox_uniform
        let mut u = [0.0; 5];
        fill_uniforms(0, 0, &mut u);
        let x = philox4x32_10([0, 0, 0, 0], [0, 0]);
        let m0 = (((x[1] as u64) << 32) | x[0] as u64) >> 12;
        assert_eq!(u[0], uniform(m0));
        assert!((u[0] - 0.8805202).abs() < 1e-7);
        fill_uniforms(-1, 5, &mut u);
        assert!((u[0] - 0.77096415).abs() < 1e-7);
        assert!((u[4] - 0.44684718).abs() < 1e-7);
    }
}
