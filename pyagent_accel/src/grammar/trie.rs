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

/// One trie node: its byte, depth and subtree end, and where its token ids start (they
/// end where the next node's start).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Node {
    pub subtree_end: u32,
    pub token_start: u32,
    pub depth: u16,
    pub byte: u8,
}

/// The longest token the trie takes (depths are 16-bit).
pub const MAX_TOKEN_BYTES: usize = u16::MAX as usize;

#[derive(Debug)]
pub struct Trie {
    /// The nodes in preorder, then a sentinel that only ends the last node's ids.
    nodes: Vec<Node>,
    token_ids: Vec<u32>,
    /// id -> bytes (`None`: a special token or no token).
    pub token_bytes: Vec<Option<Vec<u8>>>,
    pub max_depth: usize,
    /// The bytes of the nodes strictly below each node, as a 256-bit set: a walk whose
    /// DFA state loops on all of them allows the whole subtree at once.
    below: Vec<[u64; 4]>,
    /// The depth of the deepest node in each node's subtree.
    reach: Vec<u16>,
    slices: Mutex<SliceCache>,
}

#[derive(Debug, Default)]
struct SliceCache {
    map: FxHashMap<SliceKey, Arc<Slice>>,
    /// The states whose slices were walked, by DFA fingerprint, in the order cached
    /// (other states of the map share one of theirs).
    walked: FxHashMap<u128, Vec<i32>>,
    bytes: usize,
}

/// A state shares a slice whose walk it agrees with: at most this many recently walked
/// states of its DFA are tried.
const SHARE_CANDIDATES: usize = 8;

impl Trie {
    /// The trie of `token_bytes` (id -> bytes); ids whose bytes are `None` or empty are in
    /// no node. Err names a token over `MAX_TOKEN_BYTES`.
    pub fn new(token_bytes: Vec<Option<Vec<u8>>>) -> Result<Trie, String> {
        let mut spelled: Vec<(&[u8], u32)> = Vec::new();
        for (id, bytes) in token_bytes.iter().enumerate() {
            match bytes {
                Some(b) if b.len() > MAX_TOKEN_BYTES => {
                    return Err(format!("token {id} has over {MAX_TOKEN_BYTES} bytes"))
                }
                Some(b) if !b.is_empty() => spelled.push((b.as_slice(), id as u32)),
                _ => {}
            }
        }
        spelled.sort_unstable(); // by bytes, then id: ids sharing bytes in id order
        let root = Node {
            subtree_end: 0,
            token_start: 0,
            depth: 0,
            byte: 0,
        };
        let mut nodes = vec![root];
        let mut token_ids = Vec::with_capacity(spelled.len());
        let mut previous: &[u8] = &[];
        for &(bytes, id) in &spelled {
            if bytes != previous {
                let shared = bytes
                    .iter()
                    .zip(previous)
                    .take_while(|(a, b)| a == b)
                    .count();
                // the new nodes' ids start here: a node's ids are pushed while it is last
                for (d, &byte) in bytes.iter().enumerate().skip(shared) {
                    nodes.push(Node {
                        subtree_end: 0,
                        token_start: token_ids.len() as u32,
                        depth: d as u16 + 1,
                        byte,
                    });
                }
                previous = bytes;
            }
            token_ids.push(id);
        }
        let ends = subtree_ends(nodes.iter().map(|n| n.depth));
        for (node, end) in nodes.iter_mut().zip(ends) {
            node.subtree_end = end;
        }
        let max_depth = nodes.iter().map(|n| n.depth as usize).max().unwrap_or(0);
        let below = bytes_below(&nodes, max_depth);
        let reach = subtree_reach(&nodes);
        token_ids.push(0); // a sentinel: `allow_tokens` reads a node's first id unchecked
        nodes.push(Node {
            subtree_end: 0,
            token_start: token_ids.len() as u32 - 1,
            depth: 0,
            byte: 0,
        });
        Ok(Trie {
            nodes,
            token_ids,
            token_bytes,
            max_depth,
            below,
            reach,
            slices: Mutex::default(),
        })
    }

    /// Node `i` (`i < len()`).
    #[inline(always)]
    pub fn node(&self, i: usize) -> Node {
        self.nodes[i]
    }

    /// The number of nodes, the root included.
    pub fn len(&self) -> usize {
        self.nodes.len() - 1
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 1
    }

    pub fn vocab_size(&self) -> usize {
        self.token_bytes.len()
    }

    /// The ids whose bytes are exactly node `node`'s prefix.
    #[inline(always)]
    pub fn tokens(&self, node: usize) -> &[u32] {
        let end = self.nodes[node + 1].token_start as usize;
        &self.token_ids[self.nodes[node].token_start as usize..end]
    }

    /// The bytes from the root to `node` (for tests and debugging: O(node)).
    pub fn prefix(&self, node: usize) -> Vec<u8> {
        let mut out = Vec::new();
        let mut depth = self.nodes[node].depth;
        for n in self.nodes[1..=node].iter().rev() {
            if n.depth == depth && depth > 0 {
                out.push(n.byte);
                depth -= 1;
            }
        }
        out.reverse();
        out
    }

    /// The children of `node`, in increasing byte order.
    pub fn children(&self, node: usize) -> Vec<usize> {
        let (mut child, end) = (node + 1, self.nodes[node].subtree_end as usize);
        let mut out = Vec::new();
        while child < end {
            out.push(child);
            child = self.nodes[child].subtree_end as usize;
        }
        out
    }

    /// Set the bits of node `node`'s ids in `words`. Most nodes have no id or one: that
    /// case sets a bit (or none) without a branch, since a walk meets both at random.
    #[inline(always)]
    pub fn allow_tokens(&self, node: usize, words: &mut [u32]) {
        let (start, end) = (
            self.nodes[node].token_start as usize,
            self.nodes[node + 1].token_start as usize,
        );
        let id = self.token_ids[start]; // the sentinel when the node has none
        words[(id >> 5) as usize] |= ((end > start) as u32) << (id & 31);
        if end > start + 1 {
            for &id in &self.token_ids[start + 1..end] {
                words[(id >> 5) as usize] |= 1 << (id & 31);
            }
        }
    }

    /// The bytes of the nodes strictly below `node` (its subtree but itself), a 256-bit set.
    #[inline(always)]
    pub fn bytes_below(&self, node: usize) -> &[u64; 4] {
        &self.below[node]
    }

    /// The depth of the deepest node in node `node`'s subtree.
    #[inline(always)]
    pub fn reach(&self, node: usize) -> usize {
        self.reach[node] as usize
    }

    /// The ids of the nodes strictly below `node` (they are contiguous: preorder).
    #[inline(always)]
    pub fn tokens_below(&self, node: usize) -> &[u32] {
        let end = self.nodes[node].subtree_end as usize;
        &self.token_ids
            [self.nodes[node + 1].token_start as usize..self.nodes[end].token_start as usize]
    }

    /// The number of nodes in the subtrees of the root's children that `live` keeps
    /// (`live(byte)`: whether a walk goes on after that first byte).
    pub fn live_nodes(&self, live: impl Fn(u8) -> bool) -> usize {
        let (mut child, mut total) = (1, 0);
        while child < self.len() {
            let n = self.nodes[child];
            if live(n.byte) {
                total += n.subtree_end as usize - child;
            }
            child = n.subtree_end as usize;
        }
        total
    }

    /// The cached slice for `key`, if any.
    pub fn cached_slice(&self, key: &SliceKey) -> Option<Arc<Slice>> {
        let cache = self.slices.lock().unwrap_or_else(|e| e.into_inner());
        cache.map.get(key).cloned()
    }

    /// Keep `slice`, walked from `key`'s state, for `key` (the cache is emptied when it
    /// would exceed its budget).
    pub fn cache_slice(&self, key: SliceKey, slice: Arc<Slice>) {
        let mut cache = self.slices.lock().unwrap_or_else(|e| e.into_inner());
        let size = slice.size_bytes();
        if cache.bytes + size > SLICE_CACHE_BYTES {
            cache.map.clear();
            cache.walked.clear();
            cache.bytes = 0;
        }
        cache.bytes += size;
        cache.map.insert(key, slice);
        cache.walked.entry(key.0).or_default().push(key.1);
    }

    /// The states of the DFA `fingerprint` whose walked slices are cached, the most
    /// recent first, at most `SHARE_CANDIDATES`.
    pub fn walked_states(&self, fingerprint: u128) -> Vec<i32> {
        let cache = self.slices.lock().unwrap_or_else(|e| e.into_inner());
        let states = cache
            .walked
            .get(&fingerprint)
            .map_or(&[][..], |v| v.as_slice());
        states
            .iter()
            .rev()
            .take(SHARE_CANDIDATES)
            .copied()
            .collect()
    }

    /// Let `key` share the cached slice of `(key.0, walked)`, if it is still cached.
    pub fn share_slice(&self, key: SliceKey, walked: i32) -> Option<Arc<Slice>> {
        let mut cache = self.slices.lock().unwrap_or_else(|e| e.into_inner());
        let slice = cache.map.get(&(key.0, walked))?.clone();
        cache.bytes += 64; // the entry; the slice is counted once
        cache.map.insert(key, slice.clone());
        Some(slice)
    }
}

/// For each node (in preorder), the set of the bytes of the nodes strictly below it.
fn bytes_below(nodes: &[Node], max_depth: usize) -> Vec<[u64; 4]> {
    let mut parent = vec![0usize; nodes.len()];
    let mut last_at_depth = vec![0usize; max_depth + 1];
    for (i, n) in nodes.iter().enumerate().skip(1) {
        let d = n.depth as usize;
        parent[i] = last_at_depth[d - 1];
        last_at_depth[d] = i;
    }
    let mut below = vec![[0u64; 4]; nodes.len()];
    for i in (1..nodes.len()).rev() {
        let mut set = below[i];
        let b = nodes[i].byte;
        set[(b >> 6) as usize] |= 1 << (b & 63);
        for (w, s) in below[parent[i]].iter_mut().zip(set) {
            *w |= s;
        }
    }
    below
}

/// For each node (in preorder), the depth of the deepest node of its subtree.
fn subtree_reach(nodes: &[Node]) -> Vec<u16> {
    let mut reach: Vec<u16> = nodes.iter().map(|n| n.depth).collect();
    for i in (1..nodes.len()).rev() {
        // the deepest below i is in one of its children's subtrees, all after it
        let end = nodes[i].subtree_end as usize;
        let mut child = i + 1;
        while child < end {
            reach[i] = reach[i].max(reach[child]);
            child = nodes[child].subtree_end as usize;
        }
    }
    reach[0] = reach[1..].iter().copied().max().unwrap_or(0);
    reach
}

/// For each node (given by its depth, in preorder), the first node after its subtree:
/// the next node no deeper.
fn subtree_ends(depths: impl ExactSizeIterator<Item = u16>) -> Vec<u32> {
    let n = depths.len();
    let mut end = vec![n as u32; n];
    let mut open: Vec<(usize, u16)> = Vec::new();
    for (i, d) in depths.enumerate() {
        while let Some(&(top, top_depth)) = open.last() {
            if top_depth < d {
                break;
            }
            end[top] = i as u32;
            open.pop();
        }
        open.push((i, d));
    }
    end
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let t = Trie::new(words).unwrap();
        assert_eq!(t.len(), 5); // root, a, ab, abc, b
        let nodes: Vec<_> = (0..5).map(|i| t.node(i)).collect();
        assert_eq!(
            nodes[1..].iter().map(|n| n.byte).collect::<Vec<_>>(),
            b"abcb"
        );
        assert_eq!(
            nodes.iter().map(|n| n.depth).collect::<Vec<_>>(),
            [0, 1, 2, 3, 1]
        );
        assert_eq!(
            nodes.iter().map(|n| n.subtree_end).collect::<Vec<_>>(),
            [5, 4, 4, 4, 5]
        );
        assert_eq!(t.tokens(2), &[0, 4]);
        assert_eq!(t.tokens(1), &[2]);
        assert_eq!(t.tokens(0), &[] as &[u32]);
        let mut words = [0u32; 1];
        for node in 0..t.len() {
            t.allow_tokens(node, &mut words);
        }
        assert_eq!(words[0], 0b101_1101); // ids 0, 2, 3, 4, 6 (not 1 or 5)
        assert_eq!(t.live_nodes(|b| b == b'a'), 3);
        assert_eq!(t.prefix(3), b"abc");
        assert_eq!(t.children(0), [1, 4]);
        assert_eq!(t.children(1), [2]);
        assert_eq!(t.max_depth, 3);
        let set = |bytes: &[u8]| {
            let mut s = [0u64; 4];
            for &b in bytes {
                s[(b >> 6) as usize] |= 1 << (b & 63);
            }
            s
        };
        assert_eq!(t.bytes_below(0), &set(b"abc"));
        assert_eq!(t.bytes_below(1), &set(b"bc"));
        assert_eq!(t.bytes_below(3), &set(b""));
        assert_eq!(t.tokens_below(1), &[0, 4, 6]);
        assert_eq!(
            (0..5).map(|i| t.reach(i)).collect::<Vec<_>>(),
            [3, 3, 3, 3, 1]
        );
        assert_eq!(t.tokens_below(0), &[2, 0, 4, 6, 3]);
        assert!(Trie::new(vec![Some(vec![0; MAX_TOKEN_BYTES + 1])]).is_err());
    }
}
