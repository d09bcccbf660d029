use rustc_hash::FxHashMap;

use super::encoding::{AddedTokenSplitter, Encoding};
use super::merge::{MergeTable, Merger};

const GPT2_PATTERN: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";

fn single_bytes() -> FxHashMap<Vec<u8>, u32> {
    (0..=255u8).map(|b| (vec![b], b as u32)).collect()
}

/// The worked example of docs/tokenization.md: merges `l o`, `lo w`, `e r`, `␣ low`.
fn lower() -> Encoding {
    let mut vocab = single_bytes();
    let pairs: [(&[u8], &[u8]); 4] = [(b"l", b"o"), (b"lo", b"w"), (b"e", b"r"), (b" ", b"low")];
    let mut merges = vec![];
    for (rank, (left, right)) in pairs.into_iter().enumerate() {
        vocab.insert([left, right].concat(), 256 + rank as u32);
        merges.push((left.to_vec(), right.to_vec(), rank as u32));
    }
    let mut decoded: Vec<_> = vocab.iter().map(|(b, &i)| (i, b.clone())).collect();
    decoded.push((300, b"<|end|>".to_vec()));
    Encoding::new(
        vocab,
        merges,
        &[GPT2_PATTERN.to_owned()],
        false,
        false,
        decoded,
    )
    .unwrap()
}

#[test]
fn merge_lowest_rank_then_leftmost() {
    // (a, a) only: "aaaa" merges the leftmost pair first, then the next free one.
    let table = MergeTable::new([(97, 97, 0, 256)]);
    let byte_ids = std::array::from_fn(|b| b as u32);
    let mut merger = Merger::default();
    for (piece, expected) in [
        (&b"aaa"[..], vec![256, 97]),
        (b"aaaa", vec![256, 256]),
        (b"xyz", vec![120, 121, 122]),
        (b"", vec![]),
    ] {
        let mut out = vec![];
        merger.merge(piece, &byte_ids, &table, &mut out);
        assert_eq!(out, expected, "{piece:?}");
    }
}

#[test]
fn worked_example() {
    let enc = lower();
    let splitter = AddedTokenSplitter::new(vec![vec![("<|end|>".into(), 300)]], vec![]).unwrap();
    let ids = enc.encode("lower  lower<|end|>", &splitter).unwrap();
    assert_eq!(ids, [257, 258, 32, 259, 258, 300]);
    assert_eq!(
        enc.decode(&[257, 258, 0xF0, 0x9F]).unwrap(),
        "lower\u{fffd}"
    );
    assert_eq!(enc.decode(&[299]), None);
}

#[test]
fn added_tokens_leftmost_longest_and_disallowed() {
    let tokens = vec![("<a>".into(), 1), ("<a><b>".into(), 2), ("b>".into(), 3)];
    let splitter = AddedTokenSplitter::new(vec![tokens], vec!["<b>".into()]).unwrap();
    let enc = lower();
    // "x", <a><b>, <a>, "y"
    assert_eq!(
        enc.encode("x<a><b><a>y", &splitter).unwrap(),
        [120, 2, 1, 121]
    );
    assert!(splitter.meets_disallowed("..<b>"));
    assert!(!splitter.meets_disallowed("<a>"));
}
