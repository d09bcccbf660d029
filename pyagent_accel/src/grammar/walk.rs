//! The allowed next tokens: a walk of the token trie that runs the Earley parser only
//! where it must.
//!
//! The reference pushes every trie node's byte into the parser. Here the walk follows
//! the trie with the parser's *runs* (a terminal's DFA state and the column it began
//! in): a node's byte steps each run, a node where every run is `DEAD` is refused with
//! its subtree, and a node where some run lives allows its tokens (the parser's column
//! would hold those runs, so it would take the byte). Only where a run *accepts* does
//! the grammar act: its terminal may end, moving the items that wait for it, which may
//! start new runs. Which terminals start depends only on the ended runs' terminals and
//! origin columns, not on the bytes in between, so while those origins are columns the
//! parser really holds, the walk asks the parser once (`Parser::started_after`,
//! memoised per mask) and goes on *virtually*, with the new runs begun at the node.
//! When a run begun on the walk's own path ends, its items live in a column the parser
//! never built: that node is a *frontier*, and after the walk the parser reads its
//! prefix for real and the walk of its subtree starts again from there (rare: tokens
//! like `"},` that close one lexeme after another).
//!
//! Two fast paths:
//!
//! * one run (inside a string, a number, a key): a tight loop of one packed DFA move
//!   per node (`Walk::one_run`); an accepting node that starts nothing (a regex whose
//!   lexeme may end anywhere) does not even leave the loop;
//! * *slices*: the walk of one lexeme from the root, stopping where it accepts, depends
//!   only on its DFA and state; where the state loops on every byte below a node (the
//!   body of a string, say), the node's whole subtree is allowed without a walk. Such a walk (the tokens it allows and its frontier, the
//!   nodes where it accepts) is cached in the `Trie` under the DFA's fingerprint, shared
//!   by every matcher of the vocabulary whatever its grammar: inside a JSON string a
//!   mask is the cached words plus the walks below the nodes that close the string.
//!   A state's first walk is shared with, or built on, the slice of a recently walked
//!   state of the same DFA (`Walk::dense_slice`): states that no string up to the
//!   trie's depth tells apart share one slice (the counting states of a `maxLength`
//!   string), and otherwise only the nodes where the two walks differ are walked
//!   (`walk_on_base`).
//!
//! A mask is the union of its runs' walks, one lexeme at a time (the parser's columns
//! are unions of what each run leads to), so every lexeme of the last column takes
//! whichever path suits it: its slice, or the virtual walk from the root when its slice
//! would be mostly frontier (a lexeme that may end after any byte).

use rustc_hash::FxHashMap;
use std::sync::Arc;

use super::earley::{Parser, Run, TooManyItems};
use super::tables::{Dfa, Grammar, ACCEPTS, DEAD_MOVE};
use super::trie::Trie;

/// A lexeme as a slice cache key: its DFA's fingerprint and its state.
pub type SliceKey = (u128, i32);

/// A lexeme whose first bytes lead into at least this many trie nodes is walked into
/// mask words and cached; a smaller walk lists its tokens and is not kept.
const CACHE_MIN_VISITS: usize = 2048;

/// A slice whose frontier is more than this part of its nodes is not used: the lexeme
/// is walked from the root with its runs instead.
const MAX_FRONTIER_SHARE: usize = 16;

/// The most pairs of states `Dfa::first_difference` compares before a lexeme state gives up
/// sharing another's slice and is walked.
const SHARE_MAX_PAIRS: usize = 1 << 12;

/// A node to walk again from, with its prefix below the walk's starting depth.
#[derive(Debug, Clone, Copy)]
struct Frontier {
    node: u32,
    bytes_start: u32,
    bytes_end: u32,
}

/// Frontier nodes with their prefixes, and how many nodes the walk visited.
#[derive(Debug, Default)]
struct Frontiers {
    nodes: Vec<Frontier>,
    bytes: Vec<u8>,
    /// The nodes the walk covered, those of subtrees allowed at once included.
    visited: usize,
    /// The nodes the walk's loop stepped a DFA at (what it cost).
    stepped: usize,
}

impl Frontiers {
    fn push(&mut self, node: usize, prefix: &[u8]) {
        let bytes_start = self.bytes.len() as u32;
        self.bytes.extend_from_slice(prefix);
        self.nodes.push(Frontier {
            node: node as u32,
            bytes_start,
            bytes_end: self.bytes.len() as u32,
        });
    }

    fn prefix(&self, f: &Frontier) -> &[u8] {
        &self.bytes[f.bytes_start as usize..f.bytes_end as usize]
    }
}

/// One lexeme's walk from the root, stopping where it accepts: the tokens it allows (as
/// mask words when the walk is cached, else as ids) and its frontier (the accepting
/// nodes that have children).
#[derive(Debug)]
struct LexemeWalk {
    words: Vec<u32>,
    ids: Vec<u32>,
    frontiers: Frontiers,
}

impl LexemeWalk {
    /// Whether the walk saves work: false when the lexeme accepts at a large part of the
    /// nodes it visits (each frontier node costs more than a node walked).
    fn pays(&self) -> bool {
        self.frontiers.nodes.len() * MAX_FRONTIER_SHARE <= self.frontiers.visited
    }

    /// OR the tokens into `words`.
    fn allow(&self, words: &mut [u32]) {
        for (w, s) in words.iter_mut().zip(&self.words) {
            *w |= s;
        }
        allow(words, &self.ids);
    }
}

/// A `LexemeWalk` as the trie caches it.
#[derive(Debug)]
pub struct Slice {
    walk: LexemeWalk,
}

impl Slice {
    pub fn size_bytes(&self) -> usize {
        let (w, f) = (&self.walk, &self.walk.frontiers);
        4 * (w.words.len() + w.ids.len()) + 12 * f.nodes.len() + f.bytes.len() + 64
    }
}

/// The walk of `dfa` from `state` over the whole trie, one DFA move per node; into
/// `num_words` mask words if `dense`, else as a list of ids.
fn walk_lexeme(dfa: &Dfa, state: i32, trie: &Trie, dense: bool, num_words: usize) -> LexemeWalk {
    let mut walk = LexemeWalk {
        words: vec![0; if dense { num_words } else { 0 }],
        ids: Vec::new(),
        frontiers: Frontiers::default(),
    };
    let mut path = vec![0u8; trie.max_depth];
    let range = (1, trie.len(), 0);
    let (visited, stepped) = walk_below(dfa, dfa.row(state), trie, range, &mut walk, &mut path);
    walk.frontiers.visited = visited;
    walk.frontiers.stepped = stepped;
    walk
}

/// The walk of the nodes `lo..hi` (deeper than `depth0`, whose prefix is in `path`) from
/// the state whose row is `row`, into `walk` (its words if it has any, else its ids);
/// returns the nodes it covered and those it stepped.
fn walk_below(
    dfa: &Dfa,
    row: u32,
    trie: &Trie,
    (lo, hi, depth0): (usize, usize, usize),
    walk: &mut LexemeWalk,
    path: &mut [u8],
) -> (usize, usize) {
    let dense = !walk.words.is_empty();
    let mut rows = vec![0u32; trie.max_depth + 1]; // the state's row after each depth
    rows[depth0] = row;
    let mut loops = LoopBytes::new(dfa);
    let mut node = lo;
    let (mut visited, mut stepped) = (0, 0);
    while node < hi {
        visited += 1;
        stepped += 1;
        let n = trie.node(node);
        let k = n.depth as usize;
        let next = dfa.step_move(rows[k - 1], n.byte);
        if next == DEAD_MOVE {
            node = n.subtree_end as usize;
            continue;
        }
        rows[k] = next & !ACCEPTS;
        path[k - 1] = n.byte;
        if dense {
            trie.allow_tokens(node, &mut walk.words);
        } else {
            walk.ids.extend_from_slice(trie.tokens(node));
        }
        let end = n.subtree_end as usize;
        if next & ACCEPTS != 0 {
            if node + 1 < end {
                walk.frontiers.push(node, &path[..k]);
            }
            node = end;
        } else if node + 1 < end && loops.covers(dfa, next, trie.bytes_below(node)) {
            // every byte below keeps the (non-accepting) state: the whole subtree is
            // allowed and accepts nowhere
            if dense {
                allow(&mut walk.words, trie.tokens_below(node));
            } else {
                walk.ids.extend_from_slice(trie.tokens_below(node));
            }
            visited += end - node - 1;
            node = end;
        } else {
            node += 1;
        }
    }
    (visited, stepped)
}

/// The dense walk of `dfa` from `state`, built on `base`: the cached walk of the state
/// `other` of the same DFA, whose walk agrees with this one's on the strings shorter
/// than `from` (`Dfa::first_difference`). The trie is walked with both states at once,
/// and where both reach one state, or in a subtree that does not reach depth `from`,
/// the base's tokens and frontier stand; elsewhere a node's tokens and frontier are set
/// as this walk has them (below a node where only one walk goes on: all of its own).
fn walk_on_base(
    dfa: &Dfa,
    state: i32,
    trie: &Trie,
    (base, other, from): (&LexemeWalk, i32, usize),
) -> LexemeWalk {
    let mut walk = LexemeWalk {
        words: base.words.clone(),
        ids: Vec::new(),
        frontiers: Frontiers::default(), // this walk's frontier where it differs
    };
    let mut dropped: Vec<(u32, u32)> = Vec::new(); // the base's frontier in these goes
    let mut rows = vec![(0u32, 0u32); trie.max_depth + 1]; // after each depth
    let mut path = vec![0u8; trie.max_depth];
    rows[0] = (dfa.row(state), dfa.row(other));
    let goes_on = |m: u32| m != DEAD_MOVE && m & ACCEPTS == 0;
    let mut stepped = 0;
    let mut node = 1;
    while node < trie.len() {
        stepped += 1;
        let n = trie.node(node);
        let (k, end) = (n.depth as usize, n.subtree_end as usize);
        if k < from && trie.reach(node) < from {
            node = end; // strings shorter than `from`: the walks agree
            continue;
        }
        let (p, q) = rows[k - 1];
        let (a, b) = (dfa.step_move(p, n.byte), dfa.step_move(q, n.byte));
        if a == b {
            node = end; // one state (or both dead): the same walk from here
            continue;
        }
        path[k - 1] = n.byte;
        match (a != DEAD_MOVE, b != DEAD_MOVE) {
            (true, false) => trie.allow_tokens(node, &mut walk.words),
            (false, true) => clear(&mut walk.words, trie.tokens(node)),
            _ => {}
        }
        if node + 1 < end {
            if b != DEAD_MOVE && b & ACCEPTS != 0 {
                dropped.push((node as u32, node as u32 + 1));
            }
            if a != DEAD_MOVE && a & ACCEPTS != 0 {
                walk.frontiers.push(node, &path[..k]);
            }
        }
        match (goes_on(a), goes_on(b)) {
            (true, true) => {
                rows[k] = (a, b);
                node += 1;
                continue;
            }
            (true, false) => {
                let range = (node + 1, end, k);
                stepped += walk_below(dfa, a, trie, range, &mut walk, &mut path).1;
            }
            (false, true) => {
                clear(&mut walk.words, trie.tokens_below(node));
                dropped.push((node as u32 + 1, end as u32));
            }
            (false, false) => {}
        }
        node = end;
    }
    // the base's frontier less the dropped nodes, then this walk's, in preorder
    let new = std::mem::take(&mut walk.frontiers);
    let kept = base.frontiers.nodes.iter().filter(|f| {
        let i = dropped.partition_point(|&(_, hi)| hi <= f.node);
        dropped.get(i).is_none_or(|&(lo, _)| f.node < lo)
    });
    let mut all: Vec<(&Frontiers, Frontier)> = kept
        .map(|&f| (&base.frontiers, f))
        .chain(new.nodes.iter().map(|&f| (&new, f)))
        .collect();
    all.sort_unstable_by_key(|(_, f)| f.node);
    for (owner, f) in all {
        walk.frontiers.push(f.node as usize, owner.prefix(&f));
    }
    // what pays() weighs: as many nodes as the base's (an estimate where they differ)
    walk.frontiers.visited = base.frontiers.visited;
    walk.frontiers.stepped = stepped;
    walk
}

/// The bytes on which each state of a DFA loops (`Dfa::loop_bytes`), computed when first
/// asked for, for one walk.
struct LoopBytes {
    sets: Vec<[u64; 4]>,
    known: Vec<bool>,
}

impl LoopBytes {
    fn new(dfa: &Dfa) -> LoopBytes {
        LoopBytes {
            sets: vec![[0; 4]; dfa.num_states()],
            known: vec![false; dfa.num_states()],
        }
    }

    /// Whether the state whose row is `row` loops on every byte of `bytes`.
    #[inline(always)]
    fn covers(&mut self, dfa: &Dfa, row: u32, bytes: &[u64; 4]) -> bool {
        let q = dfa.state_of_row(row) as usize;
        if !self.known[q] {
            self.sets[q] = dfa.loop_bytes(row);
            self.known[q] = true;
        }
        let set = &self.sets[q];
        (0..4).all(|w| bytes[w] & !set[w] == 0)
    }
}

/// Set the bits of `ids` in `words`.
#[inline(always)]
fn allow(words: &mut [u32], ids: &[u32]) {
    for &id in ids {
        words[(id >> 5) as usize] |= 1 << (id & 31);
    }
}

/// Clear the bits of `ids` in `words`.
fn clear(words: &mut [u32], ids: &[u32]) {
    for &id in ids {
        words[(id >> 5) as usize] &= !(1 << (id & 31));
    }
}

/// Which terminals start where some runs end, by the ended runs' (terminal, origin),
/// sorted; kept for one mask (the origins are that mask's columns).
#[derive(Debug, Default)]
struct Memo {
    started: FxHashMap<Vec<(u32, u32)>, Vec<u32>>,
}

/// Working memory of the walks, reused between masks.
#[derive(Debug, Default)]
pub struct Walker {
    memo: Memo,
    /// One per level of recursion of `Walk::runs` / `Walk::one_run`.
    levels: Vec<Level>,
    /// The bytes from the mask's root to the node being visited.
    path: Vec<u8>,
    /// The trie nodes the last mask stepped a DFA at, over all its walks (a slice taken
    /// from the cache costs none): the measure of a mask's work.
    pub stepped: usize,
}

/// One recursion level's memory: the runs after each depth of the current branch
/// (those of relative depth k are `runs[end[k - 1]..end[k]]`), or the single run's
/// state after each depth.
#[derive(Debug, Default)]
struct Level {
    runs: Vec<Run>,
    end: Vec<usize>,
    states: Vec<u32>,
}

/// One walk: the borrowed state of a mask being computed.
struct Walk<'a> {
    grammar: &'a Grammar,
    trie: &'a Trie,
    parser: &'a mut Parser,
    words: &'a mut [u32],
    memo: &'a mut Memo,
    levels: &'a mut Vec<Level>,
    path: &'a mut Vec<u8>,
    /// Frontier nodes for the parser (a run begun on the path ended there).
    frontiers: Frontiers,
    /// The parser's bytes when the mask began: columns up to this one are the same on
    /// every path (a memo key names only those).
    root: usize,
    /// The parser's bytes now: runs begun in a column up to this one can end virtually.
    real: usize,
    /// The nodes stepped so far (`Walker::stepped`).
    stepped: usize,
}

impl Walker {
    /// OR into `words` (`vocab_size` bits) the tokens the parser can take next. The parser
    /// is left as it was, also after an error.
    pub fn fill(
        &mut self,
        parser: &mut Parser,
        trie: &Trie,
        words: &mut [u32],
    ) -> Result<(), TooManyItems> {
        let root = parser.num_bytes();
        self.memo.started.clear();
        self.path.resize(trie.max_depth, 0);
        let grammar = parser.grammar().clone();
        let mut walk = Walk {
            grammar: &grammar,
            trie,
            parser,
            words,
            memo: &mut self.memo,
            levels: &mut self.levels,
            path: &mut self.path,
            frontiers: Frontiers::default(),
            root,
            real: root,
            stepped: 0,
        };
        let result = walk.whole_trie();
        walk.parser.truncate(root);
        self.stepped = walk.stepped;
        result
    }
}

impl Walk<'_> {
    /// The whole mask: each lexeme of the last column by its slice or its runs, then the
    /// frontier left for the parser.
    fn whole_trie(&mut self) -> Result<(), TooManyItems> {
        let mut runs: Vec<Run> = self.parser.runs().to_vec();
        runs.sort_unstable_by_key(|r| (r.term, r.state, r.origin));
        let mut unsliced = Vec::new();
        for lexeme in runs.chunk_by(|a, b| (a.term, a.state) == (b.term, b.state)) {
            let (term, state) = (lexeme[0].term, lexeme[0].state);
            let dfa = &self.grammar.terminals[term as usize];
            let key = (dfa.fingerprint(), state);
            let (cached, fresh) = match self.trie.cached_slice(&key) {
                Some(slice) => (Some(slice), None),
                None => {
                    let row = dfa.row(state);
                    let size = self.trie.live_nodes(|b| dfa.step_move(row, b) != DEAD_MOVE);
                    let dense = size >= CACHE_MIN_VISITS;
                    if dense {
                        (Some(self.dense_slice(dfa, key)), None)
                    } else {
                        let walk = walk_lexeme(dfa, state, self.trie, false, 0);
                        self.stepped += walk.frontiers.stepped;
                        (None, Some(walk))
                    }
                }
            };
            let walk = match (&cached, &fresh) {
                (Some(slice), _) => &slice.walk,
                (None, Some(walk)) => walk,
                (None, None) => unreachable!(),
            };
            if !walk.pays() {
                unsliced.extend_from_slice(lexeme);
                continue;
            }
            walk.allow(self.words);
            // each frontier node: the lexeme's runs accept there, having read its prefix
            for f in &walk.frontiers.nodes {
                let prefix = walk.frontiers.prefix(f);
                let mut q = state;
                for &byte in prefix {
                    q = dfa.step(q, byte);
                }
                let ended: Vec<Run> = lexeme.iter().map(|r| Run { state: q, ..*r }).collect();
                self.path[..prefix.len()].copy_from_slice(prefix);
                self.below(f.node as usize, &ended, 0)?;
            }
        }
        if !unsliced.is_empty() {
            self.runs(&unsliced, (1, self.trie.len(), 0), 0)?;
        }
        self.parser_frontiers(0)
    }

    /// The slice of a lexeme `key` of `dfa` whose walk is not cached, now cached: the
    /// slice of a recently walked state of the DFA whose walk agrees with this one's to
    /// the trie's depth (a counting state far from its bound walks as the next one
    /// does), shared; else a walk on the slice of the recently walked state that agrees
    /// longest (`walk_on_base`: only where the two differ, such as a property name's
    /// states near a listed name, which join the others' after a byte), or from scratch.
    fn dense_slice(&mut self, dfa: &Dfa, key: SliceKey) -> Arc<Slice> {
        let trie = self.trie;
        let mut base: Option<(usize, i32, Arc<Slice>)> = None;
        for walked in trie.walked_states(key.0) {
            match dfa.first_difference(key.1, walked, trie.max_depth, SHARE_MAX_PAIRS) {
                None => {
                    if let Some(slice) = trie.share_slice(key, walked) {
                        return slice;
                    }
                }
                Some(d) if base.as_ref().is_none_or(|(depth, ..)| d > *depth) => {
                    if let Some(slice) = trie.cached_slice(&(key.0, walked)) {
                        base = Some((d, walked, slice));
                    }
                }
                Some(_) => {}
            }
        }
        let walk = match base {
            Some((from, other, slice)) => {
                walk_on_base(dfa, key.1, trie, (&slice.walk, other, from))
            }
            None => walk_lexeme(dfa, key.1, trie, true, self.words.len()),
        };
        self.stepped += walk.frontiers.stepped;
        let slice = Arc::new(Slice { walk });
        trie.cache_slice(key, slice.clone());
        slice
    }

    /// The subtree below `node` (its tokens already allowed), where `scanned` are the
    /// runs after its byte and some of them accept.
    fn below(&mut self, node: usize, scanned: &[Run], level: usize) -> Result<(), TooManyItems> {
        let n = self.trie.node(node);
        if node + 1 >= n.subtree_end as usize {
            return Ok(());
        }
        let depth = n.depth as usize;
        let mut runs = scanned.to_vec();
        let terms = &self.grammar.terminals;
        let mut ended: Vec<(u32, u32)> = scanned
            .iter()
            .filter(|r| terms[r.term as usize].accepts(r.state))
            .map(|r| (r.term, r.origin))
            .collect();
        ended.sort_unstable();
        ended.dedup();
        match self.started_after(ended)? {
            Some(started) => {
                let here = (self.root + depth) as u32;
                for &term in &started {
                    let state = terms[term as usize].start();
                    runs.push(Run {
                        term,
                        origin: here,
                        state,
                    });
                }
                self.runs(&runs, (node + 1, n.subtree_end as usize, depth), level)
            }
            None => {
                let prefix = &self.path[self.real - self.root..depth];
                self.frontiers.push(node, prefix);
                Ok(())
            }
        }
    }

    /// The terminals started where the runs `ended` (terminal, origin) end; None if an
    /// origin is a column the parser does not hold (the node is a frontier).
    fn started_after(&mut self, ended: Vec<(u32, u32)>) -> Result<Option<Vec<u32>>, TooManyItems> {
        if ended.iter().any(|&(_, o)| o as usize > self.real) {
            return Ok(None);
        }
        if let Some(started) = self.memo.started.get(&ended) {
            return Ok(Some(started.clone()));
        }
        let mut started = Vec::new();
        self.parser.started_after(&ended, &mut started)?;
        if ended.iter().all(|&(_, o)| o as usize <= self.root) {
            self.memo.started.insert(ended, started.clone());
        }
        Ok(Some(started))
    }

    /// The walk of the nodes `lo..hi` (deeper than `depth0`) from the runs `start`.
    fn runs(
        &mut self,
        start: &[Run],
        (lo, hi, depth0): (usize, usize, usize),
        level: usize,
    ) -> Result<(), TooManyItems> {
        if let [run] = *start {
            return self.one_run(run, (lo, hi, depth0), level);
        }
        let mut lv = self.take_level(level);
        lv.runs.clear();
        lv.runs.extend_from_slice(start);
        lv.end.clear();
        lv.end.resize(self.trie.max_depth - depth0 + 1, 0);
        lv.end[0] = start.len();
        let terms = &self.grammar.terminals;
        let mut result = Ok(());
        let (mut node, mut stepped) = (lo, 0);
        while node < hi {
            stepped += 1;
            let n = self.trie.node(node);
            let k = n.depth as usize - depth0; // >= 1
            let parent = if k == 1 { 0 } else { lv.end[k - 2] }..lv.end[k - 1];
            lv.runs.truncate(parent.end);
            let mut accepting = false;
            for i in parent {
                let run = lv.runs[i];
                let dfa = &terms[run.term as usize];
                let packed = dfa.step_move(dfa.row(run.state), n.byte);
                if packed != DEAD_MOVE {
                    accepting |= packed & ACCEPTS != 0;
                    let next = Run {
                        state: dfa.state_of_row(packed & !ACCEPTS),
                        ..run
                    };
                    if !lv.runs[lv.end[k - 1]..].contains(&next) {
                        lv.runs.push(next);
                    }
                }
            }
            let subtree_end = n.subtree_end as usize;
            let scanned = lv.end[k - 1]..lv.runs.len();
            if scanned.is_empty() {
                node = subtree_end; // every run died: skip the subtree
                continue;
            }
            lv.end[k] = lv.runs.len();
            self.path[n.depth as usize - 1] = n.byte;
            self.trie.allow_tokens(node, self.words);
            if accepting {
                let scanned = lv.runs[scanned].to_vec();
                result = self.below(node, &scanned, level + 1);
                if result.is_err() {
                    break;
                }
                node = subtree_end;
            } else if scanned.len() == 1 && node + 1 < subtree_end {
                let run = lv.runs[scanned.start];
                result = self.one_run(run, (node + 1, subtree_end, n.depth as usize), level + 1);
                if result.is_err() {
                    break;
                }
                node = subtree_end;
            } else {
                node += 1;
            }
        }
        self.levels[level] = lv;
        self.stepped += stepped;
        result
    }

    /// `runs` for a single run: one packed DFA move per node. An accepting node is left
    /// to `below`, unless the run's ending starts nothing: then the node is like any
    /// other (the column would hold the same runs).
    fn one_run(
        &mut self,
        run: Run,
        (lo, hi, depth0): (usize, usize, usize),
        level: usize,
    ) -> Result<(), TooManyItems> {
        let dfa = &self.grammar.terminals[run.term as usize];
        let mut lv = self.take_level(level);
        lv.states.clear();
        lv.states.resize(self.trie.max_depth - depth0 + 1, 0);
        lv.states[0] = dfa.row(run.state);
        let mut ends_with_nothing: Option<bool> = None;
        let mut result = Ok(());
        let (mut node, mut stepped) = (lo, 0);
        while node < hi {
            stepped += 1;
            let n = self.trie.node(node);
            let k = n.depth as usize - depth0; // >= 1
            let next = dfa.step_move(lv.states[k - 1], n.byte);
            if next == DEAD_MOVE {
                node = n.subtree_end as usize;
                continue;
            }
            lv.states[k] = next & !ACCEPTS;
            self.path[n.depth as usize - 1] = n.byte;
            self.trie.allow_tokens(node, self.words);
            if next & ACCEPTS == 0 {
                node += 1;
                continue;
            }
            let transparent = match ends_with_nothing {
                Some(known) => known,
                None => {
                    let started = self.started_after(vec![(run.term, run.origin)]);
                    let known = matches!(started, Ok(Some(ref s)) if s.is_empty());
                    if let Err(err) = started {
                        result = Err(err);
                        break;
                    }
                    ends_with_nothing = Some(known);
                    known
                }
            };
            if transparent {
                node += 1;
                continue;
            }
            let scanned = Run {
                state: dfa.state_of_row(next & !ACCEPTS),
                ..run
            };
            result = self.below(node, &[scanned], level + 1);
            if result.is_err() {
                break;
            }
            node = n.subtree_end as usize;
        }
        self.levels[level] = lv;
        self.stepped += stepped;
        result
    }

    /// Level `level`'s memory, taken out (put it back when done).
    fn take_level(&mut self, level: usize) -> Level {
        if self.levels.len() <= level {
            self.levels.resize_with(level + 1, Level::default);
        }
        std::mem::take(&mut self.levels[level])
    }

    /// Walk below each frontier node with the parser reading its prefix for real
    /// (nodes where a run begun on the path ended); the parser ends where it started.
    fn parser_frontiers(&mut self, level: usize) -> Result<(), TooManyItems> {
        let frontiers = std::mem::take(&mut self.frontiers);
        let real = self.real;
        for f in &frontiers.nodes {
            let prefix = frontiers.prefix(f);
            self.parser.truncate(real);
            let mut taken = true;
            for &byte in prefix {
                taken = self.parser.push(byte)?;
                if !taken {
                    break; // cannot happen: the walk saw a run live through the prefix
                }
            }
            debug_assert!(taken, "the parser refuses a frontier's prefix");
            if !taken {
                continue;
            }
            let node = f.node as usize;
            let n = self.trie.node(node);
            self.real = self.parser.num_bytes();
            let runs = self.parser.runs().to_vec();
            self.runs(
                &runs,
                (node + 1, n.subtree_end as usize, n.depth as usize),
                level,
            )?;
            self.parser_frontiers(level)?;
            self.real = real;
        }
        self.parser.truncate(real);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grammar::tables::tests::counting;

    /// The words and the frontier (nodes and prefixes) of a walk.
    fn outcome(walk: &LexemeWalk) -> (Vec<u32>, Vec<(u32, Vec<u8>)>) {
        let f = &walk.frontiers;
        let nodes = f
            .nodes
            .iter()
            .map(|x| (x.node, f.prefix(x).to_vec()))
            .collect();
        (walk.words.clone(), nodes)
    }

    #[test]
    fn a_walk_from_a_base_is_the_walk_from_the_root() {
        // tokens over a, b, '"' of 1 to 14 bytes (a fixed pseudo-random draw), walked by
        // the states of a count to 9: each state's walk built on each other's
        let mut seed = 12345u64;
        let mut draw = |n: u64| {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 33) % n
        };
        let tokens: Vec<Option<Vec<u8>>> = (0..3000)
            .map(|_| {
                let len = 1 + draw(14) as usize;
                Some((0..len).map(|_| b"ab\"\""[draw(4) as usize]).collect())
            })
            .collect();
        let trie = Trie::new(tokens).unwrap();
        let words = trie.vocab_size().div_ceil(32);
        let dfa = counting(9);
        let walks: Vec<LexemeWalk> = (0..=9)
            .map(|q| walk_lexeme(&dfa, q, &trie, true, words))
            .collect();
        let mut adapted = 0;
        for a in 0..=9 {
            for b in 0..=9 {
                let expected = outcome(&walks[a as usize]);
                let d = match dfa.first_difference(a, b, trie.max_depth, 1 << 14) {
                    None => {
                        assert_eq!(outcome(&walks[b as usize]), expected, "{a} {b}");
                        1
                    }
                    Some(d) => d,
                };
                // from where they may differ, and from the root (both walks throughout)
                for from in [d, 1] {
                    let walk = walk_on_base(&dfa, a, &trie, (&walks[b as usize], b, from));
                    assert_eq!(outcome(&walk), expected, "{a} from {b} at depth {from}");
                    adapted += 1;
                }
            }
        }
        assert_eq!(adapted, 200);
        assert!(walks[0].frontiers.nodes.len() > 10);
    }
}

#[cfg(test)]
mod timing {
    use super::*;
    use crate::grammar::tables::Dfa;

    /// Times one uncached lexeme walk over a real vocabulary (a file of u16 lengths, 0xFFFF
    /// for none, then bytes): `STRUCTURED_VOCAB=... cargo test walk_timing -- --ignored`.
    #[test]
    #[ignore]
    fn walk_timing() {
        let Ok(path) = std::env::var("STRUCTURED_VOCAB") else {
            return;
        };
        let data = std::fs::read(path).unwrap();
        let (mut at, mut tokens) = (0, Vec::new());
        while at < data.len() {
            let n = u16::from_le_bytes([data[at], data[at + 1]]) as usize;
            at += 2;
            if n == 0xFFFF {
                tokens.push(None);
            } else {
                tokens.push(Some(data[at..at + n].to_vec()));
                at += n;
            }
        }
        let trie = Trie::new(tokens).unwrap();
        // "[^"\\]*" from inside the string: state 0 loops on all but '"' and '\\' and
        // bytes >= 0x80 (class 2 leads to state 1, which accepts)
        let mut byte_class = [0u8; 256];
        byte_class[b'"' as usize] = 1;
        byte_class[b'\\' as usize] = 2;
        byte_class[0x80..].fill(2);
        let dfa = Dfa::new(
            &byte_class,
            vec![0, 1, -1, -1, -1, -1],
            vec![false, true],
            0,
        )
        .unwrap();
        let words = trie.vocab_size().div_ceil(32);
        for dense in [true, false, true] {
            let t = std::time::Instant::now();
            let walk = walk_lexeme(&dfa, 0, &trie, dense, words);
            let ones: u32 = walk.words.iter().map(|w| w.count_ones()).sum();
            eprintln!(
                "dense {dense}: {:?}, visited {}, allowed {} + {} ids, frontiers {}",
                t.elapsed(),
                walk.frontiers.visited,
                ones,
                walk.ids.len(),
                walk.frontiers.nodes.len()
            );
        }
    }
}
