//! The vocabulary's tokens in a trie over their bytes (contract: the reference's
//! `pyagent_ref.structured.vocab.TokenTrie`, same layout).
//!
//! Nodes are numbered in depth-first preorder with children in increasing byte order:
//! node 0 is the root (the empty prefix), node i adds `byte[i]` to its parent's prefix at
//! depth `depth[i]`, and the subtree of node i is the range `i..subtree_end[i]`. A walk
//! visits the nodes in order and skips a rejected prefix's subtree by jumping to its end.
//!
//! The trie also keeps the cache of mask *slices* (`walk::Slice`): the part of a mask
//! that depends only on the lexemes in progress, shared by every matcher of this
//! vocabulary, whatever their grammar.

use rustc_hash::FxHashMap;
use std::sync::{Arc, Mutex};

use super::walk::{Slice, SliceKey};

/// How many bytes of slices the cache may hold before it is emptied.
const SLICE_CACHE_BYTES: usize = 256 << 20;

#[derive(Debug)]
pub struct Trie {
    pub byte: Vec<u8>,
    pub depth: Vec<u32>,
    pub subtree_end: Vec<u32>,
    /// Node i's token ids are `token_ids[token_start[i]..token_start[i + 1]]`.
    token_start: Vec<u32>,
    token_ids: Vec<u32>,
    /// id -> bytes (`None`: a special token or no token).
    pub token_bytes: Vec<Option<Vec<u8>>>,
    pub max_depth: usize,
    slices: Mutex<SliceCache>,
}

#[derive(Debug, Default)]
struct SliceCache {
    map: FxHashMap<SliceKey, Arc<Slice>>,
    bytes: usize,
}

impl Trie {
    /// The trie of `token_bytes` (id -> bytes); ids whose bytes are `None` or empty are in
    /// no node.
    pub fn new(token_bytes: Vec<Option<Vec<u8>>>) -> Trie {
        let mut spelled: Vec<(&[u8], u32)> = token_bytes
            .iter()
            .enumerate()
            .filter_map(|(id, b)| match b {
                Some(b) if !b.is_empty() => Some((b.as_slice(), id as u32)),
                _ => None,
            })
            .collect();
        spelled.sort_unstable(); // by bytes, then id: ids sharing bytes in id order
        let mut byte = vec![0u8];
        let mut depth = vec![0u32];
        let mut token_start = vec![0u32];
        let mut token_ids = Vec::with_capacity(spelled.len());
        let mut previous: &[u8] = &[];
        for &(bytes, id) in &spelled {
            if bytes != previous {
                let shared = bytes
                    .iter()
                    .zip(previous)
                    .take_while(|(a, b)| a == b)
                    .count();
                for (d, &b) in bytes.iter().enumerate().skip(shared) {
                    byte.push(b);
                    depth.push(d as u32 + 1);
                    token_start.push(token_ids.len() as u32);
                }
                previous = bytes;
            }
            token_ids.push(id);
        }
        token_start.push(token_ids.len() as u32);
        // token_start[i] is where node i's ids begin: a node's ids were pushed while it
        // was the last node, so each node's range ends where the next node's begins
        let subtree_end = subtree_ends(&depth);
        let max_depth = depth.iter().copied().max().unwrap_or(0) as usize;
        Trie {
            byte,
            depth,
            subtree_end,
            token_start,
            token_ids,
            token_bytes,
            max_depth,
            slices: Mutex::default(),
        }
    }

    /// The number of nodes, the root included.
    pub fn len(&self) -> usize {
        self.depth.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 1
    }

    pub fn vocab_size(&self) -> usize {
        self.token_bytes.len()
    }

    /// The ids whose bytes are exactly node `node`'s prefix.
    #[inline]
    pub fn tokens(&self, node: usize) -> &[u32] {
        &self.token_ids[self.token_start[node] as usize..self.token_start[node + 1] as usize]
    }

    /// The cached slice for `key`, if any.
    pub fn cached_slice(&self, key: &SliceKey) -> Option<Arc<Slice>> {
        let cache = self.slices.lock().unwrap_or_else(|e| e.into_inner());
        cache.map.get(key).cloned()
    }

    /// Keep `slice` for `key` (the cache is emptied when it would exceed its budget).
    pub fn cache_slice(&self, key: SliceKey, slice: Arc<Slice>) {
        let mut cache = self.slices.lock().unwrap_or_else(|e| e.into_inner());
        let size = slice.size_bytes();
        if cache.bytes + size > SLICE_CACHE_BYTES {
            cache.map.clear();
            cache.bytes = 0;
        }
        cache.bytes += size;
        cache.map.insert(key, slice);
    }
}

/// For each node, the first node after its subtree: the next node no deeper.
fn subtree_ends(depth: &[u32]) -> Vec<u32> {
    let n = depth.len();
    let mut end = vec![n as u32; n];
    let mut open: Vec<usize> = Vec::new();
    for (i, &d) in depth.iter().enumerate() {
        while let Some(&top) = open.last() {
            if depth[top] < d {
                break;
            }
            end[top] = i as u32;
            open.pop();
        }
        open.push(i);
    }
    end
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prefix(t: &Trie, node: usize) -> Vec<u8> {
        let mut out = Vec::new();
        let mut d = t.depth[node];
        for i in (1..=node).rev() {
            if t.depth[i] == d {
                out.push(t.byte[i]);
                d -= 1;
            }
        }
        out.reverse();
        out
    }

    #[test]
    fn preorder_layout() {
        let words: Vec<Option<Vec<u8>>> = vec![
            Some(b"ab".to_vec()),
            None,
            Some(b"a".to_vec()),
            Some(b"b".to_vec()),
            Some(b"ab".to_vec()),
            Some(Vec::new()),
            Some(b"abc".to_vec()),
        ];
        let t = Trie::new(words);
        assert_eq!(t.len(), 5); // root, a, ab, abc, b
        assert_eq!(t.byte[1..], *b"abcb");
        assert_eq!(t.depth, vec![0, 1, 2, 3, 1]);
        assert_eq!(t.subtree_end, vec![5, 4, 4, 4, 5]);
        assert_eq!(t.tokens(2), &[0, 4]);
        assert_eq!(t.tokens(1), &[2]);
        assert_eq!(t.tokens(0), &[] as &[u32]);
        assert_eq!(prefix(&t, 3), b"abc");
        assert_eq!(t.max_depth, 3);
    }
}
