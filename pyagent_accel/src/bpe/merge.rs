//! Step 4 of `pyagent_ref.tokenize.bpe`: byte-pair merging of one piece.
//!
//! The contract is `bpe_merge`: start from one part per byte and repeatedly merge the
//! adjacent pair with the lowest rank, the leftmost such pair on a tie, until no adjacent
//! pair has a rank. The reference rescans every pair after each merge (O(n^2)); here the
//! candidate pairs wait in a min-heap ordered by (rank, position), so a piece of n bytes
//! costs O(n log n): each merge removes one part and adds at most two candidates.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use rustc_hash::FxHashMap;

/// A part that no longer exists or has no neighbour.
const NONE: usize = usize::MAX;

/// The merges of an encoding over token ids: (left id, right id) -> (rank, merged id).
pub struct MergeTable {
    pairs: FxHashMap<(u32, u32), (u32, u32)>,
}

impl MergeTable {
    /// The table of `merges` ((left id, right id, rank, merged id) each).
    pub fn new(merges: impl IntoIterator<Item = (u32, u32, u32, u32)>) -> Self {
        let pairs = merges
            .into_iter()
            .map(|(left, right, rank, merged)| ((left, right), (rank, merged)))
            .collect();
        MergeTable { pairs }
    }

    fn get(&self, left: u32, right: u32) -> Option<(u32, u32)> {
        self.pairs.get(&(left, right)).copied()
    }
}

/// Reusable buffers for `merge`, so that encoding many pieces allocates once.
///
/// Part `i` is the part that starts at byte `i` of the piece; `next`/`prev` link the
/// parts that exist, in order.
#[derive(Default)]
pub struct Merger {
    id: Vec<u32>,
    next: Vec<usize>,
    prev: Vec<usize>,
    /// Candidate merges: (rank, left part, left id, right id), smallest first.
    heap: BinaryHeap<Reverse<(u32, usize, u32, u32)>>,
}

impl Merger {
    /// Append to `out` the token ids of `piece`, whose bytes are first the tokens
    /// `byte_ids[b]`, merged by `table`.
    pub fn merge(
        &mut self,
        piece: &[u8],
        byte_ids: &[u32; 256],
        table: &MergeTable,
        out: &mut Vec<u32>,
    ) {
        let n = piece.len();
        self.id.clear();
        self.id.extend(piece.iter().map(|&b| byte_ids[b as usize]));
        self.next.clear();
        self.next
            .extend((1..=n).map(|i| if i < n { i } else { NONE }));
        self.prev.clear();
        self.prev
            .extend((0..n).map(|i| if i > 0 { i - 1 } else { NONE }));
        self.heap.clear();
        for i in 1..n {
            self.push_candidate(i - 1, i, table);
        }
        while let Some(Reverse((_, left, left_id, right_id))) = self.heap.pop() {
            let right = self.next[left];
            // Stale: a part only grows while it exists, so its id changes exactly when
            // it merges; a candidate whose parts changed since it was pushed is gone.
            if right == NONE || self.id[left] != left_id || self.id[right] != right_id {
                continue;
            }
            let (_, merged) = table
                .get(left_id, right_id)
                .expect("a pushed pair has a rank");
            self.id[left] = merged;
            self.id[right] = u32::MAX; // no longer a part
            self.next[left] = self.next[right];
            if self.next[left] != NONE {
                let after = self.next[left];
                self.prev[after] = left;
                self.push_candidate(left, after, table);
            }
            if self.prev[left] != NONE {
                self.push_candidate(self.prev[left], left, table);
            }
        }
        let mut part = if n > 0 { 0 } else { NONE };
        while part != NONE {
            out.push(self.id[part]);
            part = self.next[part];
        }
    }

    /// Queue the pair of adjacent parts `left`, `right` if it has a rank.
    fn push_candidate(&mut self, left: usize, right: usize, table: &MergeTable) {
        let (left_id, right_id) = (self.id[left], self.id[right]);
        if let Some((rank, _)) = table.get(left_id, right_id) {
            self.heap.push(Reverse((rank, left, left_id, right_id)));
        }
    }
}
