//! The allowed next tokens: a walk of the token trie against the parser, in two speeds.
//!
//! The reference pushes every trie node's byte into the Earley parser. Most of those
//! pushes complete no terminal: inside a string or a number the next column is just the
//! runs of the last one, each stepped by one DFA transition. So the walk here follows
//! the trie with the *lexemes in progress* only, a small set of `(terminal, DFA state)`
//! pairs per depth (the *light* walk), and hands a node to the Earley parser only where
//! some lexeme reaches an accepting state, the one place the grammar can take over:
//!
//! * a node where every lexeme is `DEAD` is refused with its whole subtree;
//! * a node where some lexeme lives and none accepts allows its tokens, and the walk goes
//!   on into its children with the stepped lexemes (this is exact: the parser's column
//!   would hold those runs and nothing else, so it would take the same bytes);
//! * a node where some lexeme accepts allows its tokens (the column has runs) and is a
//!   *frontier*: its children depend on the grammar around the lexeme, so the parser
//!   reads the node's prefix (closing the lexeme, predicting what follows) and the walk
//!   of the node's subtree starts again from the parser's new lexemes, one level down.
//!
//! The light walk from the root depends on nothing but the lexemes' DFAs and states and
//! the vocabulary. Its result, a `Slice` (the tokens it allows, and its frontier nodes
//! with their prefixes), is cached in the `Trie` under the lexemes' DFA fingerprints and
//! states, so it is shared by every matcher of the vocabulary, whatever their grammar:
//! a JSON string's body, once walked, costs a copy of its mask words plus the frontier
//! (the tokens that close the string) at every later step of every request.

use std::sync::Arc;

use rustc_hash::FxHashMap;

use super::earley::{Parser, Run, TooManyItems};
use super::tables::{Dfa, Grammar, ACCEPTS, DEAD_MOVE};
use super::trie::Trie;

/// A lexeme in progress as a cache key: its DFA's fingerprint and its state.
pub type SliceKey = (u128, i32);

/// A light walk from the root visiting at least this many nodes is worth caching.
const CACHE_MIN_VISITS: usize = 2048;

/// A frontier node and its prefix below the walk's starting depth.
#[derive(Debug, Clone, Copy)]
struct Frontier {
    node: u32,
    bytes_start: u32,
    bytes_end: u32,
}

/// The frontier nodes a light walk found, with their prefixes, and how many nodes it
/// visited.
#[derive(Debug, Default)]
pub struct Frontiers {
    nodes: Vec<Frontier>,
    bytes: Vec<u8>,
    visited: usize,
}

impl Frontiers {
    fn clear(&mut self) {
        self.nodes.clear();
        self.bytes.clear();
        self.visited = 0;
    }

    fn push(&mut self, node: usize, prefix: &[u8]) {
        let bytes_start = self.bytes.len() as u32;
        self.bytes.extend_from_slice(prefix);
        self.nodes.push(Frontier {
            node: node as u32,
            bytes_start,
            bytes_end: self.bytes.len() as u32,
        });
    }

    /// Append `other`'s frontier nodes.
    fn extend(&mut self, other: &Frontiers) {
        for f in &other.nodes {
            self.push(f.node as usize, other.prefix(f));
        }
    }

    /// Sort the nodes and drop repeats and nodes inside another's subtree (each is
    /// decided with its outermost frontier ancestor).
    fn outermost(&mut self, trie: &Trie) {
        self.nodes.sort_unstable_by_key(|f| f.node);
        let mut end = 0;
        self.nodes.retain(|f| {
            let keep = f.node >= end;
            if keep {
                end = trie.node(f.node as usize).subtree_end;
            }
            keep
        });
    }

    fn prefix(&self, f: &Frontier) -> &[u8] {
        &self.bytes[f.bytes_start as usize..f.bytes_end as usize]
    }
}

/// The light walk from the root for some lexemes: the tokens it allows (a bit per token
/// id) and its frontier.
#[derive(Debug)]
pub struct Slice {
    words: Vec<u32>,
    frontiers: Frontiers,
}

impl Slice {
    pub fn size_bytes(&self) -> usize {
        let f = &self.frontiers;
        4 * self.words.len() + 12 * f.nodes.len() + f.bytes.len() + 64
    }
}

/// Working memory of the walks, reused between masks: one light stack per level of
/// frontier nesting.
#[derive(Debug, Default)]
pub struct Walker {
    levels: Vec<Level>,
    /// The frontier of all the lexemes' walks from the root.
    merged: Frontiers,
    memo: Memo,
}

/// The lexemes after a frontier's last byte, by the runs that byte scans (one mask's
/// worth: run origins are column numbers).
#[derive(Debug, Default)]
struct Memo {
    index: FxHashMap<Vec<Run>, usize>,
    lexemes: Vec<Vec<(u32, i32)>>,
    /// The bytes the parser held when the mask began.
    base: usize,
}

impl Memo {
    fn clear(&mut self, base: usize) {
        self.index.clear();
        self.lexemes.clear();
        self.base = base;
    }

    fn get(&self, runs: &[Run]) -> Option<&usize> {
        self.index.get(runs)
    }

    /// Keep `lexemes` (under `runs` if given); their index.
    fn insert(&mut self, runs: Option<Vec<Run>>, lexemes: Vec<(u32, i32)>) -> usize {
        self.lexemes.push(lexemes);
        let index = self.lexemes.len() - 1;
        if let Some(runs) = runs {
            self.index.insert(runs, index);
        }
        index
    }

    fn lexemes(&self, index: usize) -> &[(u32, i32)] {
        &self.lexemes[index]
    }
}

/// One level's working memory: the lexemes after each depth of the current branch
/// (depth k's, relative to the walk's start, are `lexemes[end[k - 1]..end[k]]`), the
/// branch's bytes, and the frontier found.
#[derive(Debug, Default)]
struct Level {
    lexemes: Vec<(u32, i32)>,
    end: Vec<usize>,
    path: Vec<u8>,
    /// The single lexeme's state after each depth (`OneLexeme`).
    states: Vec<u32>,
    frontiers: Frontiers,
}

/// Set the bits of `ids` in `words`.
#[inline]
fn allow(words: &mut [u32], ids: &[u32]) {
    for &id in ids {
        words[(id >> 5) as usize] |= 1 << (id & 31);
    }
}

/// The parser's lexemes in progress: its runs' `(terminal, state)`, without repeats.
fn lexemes_of(parser: &Parser) -> Vec<(u32, i32)> {
    let mut lexemes: Vec<(u32, i32)> = parser.runs().iter().map(|r| (r.term, r.state)).collect();
    lexemes.sort_unstable();
    lexemes.dedup();
    lexemes
}

/// The light walk over the trie nodes `lo..hi` (a node's subtree without the node, all
/// deeper than `depth0`), starting from the lexemes `start`. Allowed tokens are ORed
/// into `words` (`vocab_size` bits), frontier nodes go to `level.frontiers` with their
/// bytes below `depth0`.
fn light_walk(
    grammar: &Grammar,
    trie: &Trie,
    start: &[(u32, i32)],
    (lo, hi, depth0): (usize, usize, usize),
    level: &mut Level,
    words: &mut [u32],
) {
    let terms = &grammar.terminals;
    let Level {
        lexemes,
        end,
        path,
        states,
        frontiers,
    } = level;
    frontiers.clear();
    path.clear();
    path.resize(trie.max_depth - depth0, 0);
    if let [(t, q)] = *start {
        let walk = OneLexeme {
            dfa: &terms[t as usize],
            trie,
        };
        walk.run(q as u32, (lo, hi, depth0), 0, path, states, words, frontiers);
        return;
    }
    lexemes.clear();
    lexemes.extend_from_slice(start);
    end.clear();
    end.resize(trie.max_depth - depth0 + 1, 0);
    end[0] = start.len();
    let mut node = lo;
    while node < hi {
        frontiers.visited += 1;
        let n = trie.node(node);
        let k = n.depth as usize - depth0; // >= 1
        let parent = if k == 1 { 0 } else { end[k - 2] }..end[k - 1];
        lexemes.truncate(parent.end);
        let mut accepting = false;
        for i in parent {
            let (t, q) = lexemes[i];
            let next = terms[t as usize].step_move(q as u32, n.byte);
            if next != DEAD_MOVE {
                let state = (next & !ACCEPTS) as i32;
                if !lexemes[end[k - 1]..].contains(&(t, state)) {
                    lexemes.push((t, state));
                }
                accepting |= next & ACCEPTS != 0;
            }
        }
        let subtree_end = n.subtree_end as usize;
        if lexemes.len() == end[k - 1] {
            node = subtree_end; // every lexeme died: skip the subtree
            continue;
        }
        end[k] = lexemes.len();
        path[k - 1] = n.byte;
        allow(words, trie.tokens(node));
        if accepting {
            if node + 1 < subtree_end {
                frontiers.push(node, &path[..k]);
            }
            node = subtree_end;
        } else if let [(t, q)] = lexemes[end[k - 1]..] {
            // one lexeme left: the subtree is a plain DFA walk
            let walk = OneLexeme {
                dfa: &terms[t as usize],
                trie,
            };
            let range = (node + 1, subtree_end, n.depth as usize);
            walk.run(q as u32, range, k, path, states, words, frontiers);
            node = subtree_end;
        } else {
            node += 1;
        }
    }
}

/// The light walk with a single lexeme: one packed DFA move per node.
struct OneLexeme<'a> {
    dfa: &'a Dfa,
    trie: &'a Trie,
}

impl OneLexeme<'_> {
    /// The light walk over the nodes `lo..hi` (deeper than `depth0`) from the DFA state
    /// `q`. `path[..prefix]` holds the bytes from the enclosing walk's start down to
    /// `depth0`; frontier prefixes are recorded from there.
    #[allow(clippy::too_many_arguments)]
    fn run(
        &self,
        q: u32,
        (lo, hi, depth0): (usize, usize, usize),
        prefix: usize,
        path: &mut [u8],
        states: &mut Vec<u32>,
        words: &mut [u32],
        frontiers: &mut Frontiers,
    ) {
        let (dfa, trie) = (self.dfa, self.trie);
        states.clear();
        states.resize(trie.max_depth - depth0 + 1, 0);
        states[0] = q;
        let mut node = lo;
        while node < hi {
            frontiers.visited += 1;
            let n = trie.node(node);
            let k = n.depth as usize - depth0; // >= 1
            let next = dfa.step_move(states[k - 1], n.byte);
            if next == DEAD_MOVE {
                node = n.subtree_end as usize;
                continue;
            }
            states[k] = next & !ACCEPTS;
            path[prefix + k - 1] = n.byte;
            allow(words, trie.tokens(node));
            if next & ACCEPTS != 0 {
                if node + 1 < n.subtree_end as usize {
                    frontiers.push(node, &path[..prefix + k]);
                }
                node = n.subtree_end as usize;
            } else {
                node += 1;
            }
        }
    }
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
        let base = parser.num_bytes();
        self.memo.clear(base);
        let result = self.fill_from_root(parser, trie, words);
        parser.truncate(base);
        result
    }

    /// The light walk from the root, one lexeme at a time: a token is allowed if some
    /// lexeme takes it without ending before its last byte, and the frontier nodes of
    /// all lexemes are left to the parser. A lexeme's walk is cached in the trie when it
    /// is long.
    fn fill_from_root(
        &mut self,
        parser: &mut Parser,
        trie: &Trie,
        words: &mut [u32],
    ) -> Result<(), TooManyItems> {
        let grammar = parser.grammar().clone();
        let mut merged = std::mem::take(&mut self.merged);
        merged.clear();
        for (t, q) in lexemes_of(parser) {
            let key = (grammar.terminals[t as usize].fingerprint(), q);
            if let Some(slice) = trie.cached_slice(&key) {
                for (w, s) in words.iter_mut().zip(&slice.words) {
                    *w |= s;
                }
                merged.extend(&slice.frontiers);
                continue;
            }
            let level = self.level(0);
            let mut slice_words = vec![0; words.len()];
            light_walk(&grammar, trie, &[(t, q)], (1, trie.len(), 0), level, &mut slice_words);
            for (w, s) in words.iter_mut().zip(&slice_words) {
                *w |= s;
            }
            merged.extend(&level.frontiers);
            if level.frontiers.visited >= CACHE_MIN_VISITS {
                let frontiers = std::mem::take(&mut level.frontiers);
                let slice = Slice {
                    words: slice_words,
                    frontiers,
                };
                trie.cache_slice(key, Arc::new(slice));
            }
        }
        merged.outermost(trie);
        let result = self.frontiers(parser, trie, &merged, 0, words, 1);
        self.merged = merged;
        result
    }

    /// Decide the subtrees of the frontier nodes (prefixes below `depth0`, where the
    /// parser stands; none inside another's subtree) ORing their tokens into `words`; the
    /// parser ends where it started.
    ///
    /// The parser reads each prefix but its last byte (a lexeme's inner bytes: runs only,
    /// no closure). What the last byte leads to depends only on the runs it scans, so
    /// the lexemes after it are memoised by those runs: the frontier nodes of a string
    /// (its closing quote in many tokens) share one closure. The subtree is then a light
    /// walk from those lexemes; only a frontier inside it needs the last byte pushed.
    fn frontiers(
        &mut self,
        parser: &mut Parser,
        trie: &Trie,
        frontiers: &Frontiers,
        depth0: usize,
        words: &mut [u32],
        level: usize,
    ) -> Result<(), TooManyItems> {
        let grammar = parser.grammar().clone();
        let base = parser.num_bytes();
        let mut previous: &[u8] = &[];
        let mut scanned = Vec::new();
        for f in &frontiers.nodes {
            let (inner, last) = match frontiers.prefix(f) {
                [inner @ .., last] => (inner, *last),
                [] => continue,
            };
            // the parser holds the previous frontier's inner bytes: keep what they share
            let shared = inner.iter().zip(previous).take_while(|(a, b)| a == b).count();
            parser.truncate(base + shared);
            for &byte in &inner[shared..] {
                // the light walk saw a lexeme live through them, so the parser takes them
                let taken = parser.push(byte)?;
                debug_assert!(taken, "the parser refuses a frontier's prefix");
            }
            previous = inner;
            if parser.num_bytes() != base + inner.len() {
                previous = &[];
                continue;
            }
            parser.scanned_runs(last, &mut scanned);
            // a run begun inside this walk's path has an origin column that differs from
            // path to path: only runs begun before the mask's first byte key the memo
            let stable = scanned.iter().all(|r| r.origin as usize <= self.memo.base);
            let after = match self.memo.get(&scanned) {
                Some(&index) if stable => index,
                _ => {
                    parser.push(last)?;
                    let lexemes = lexemes_of(parser);
                    parser.pop(1);
                    self.memo.insert(stable.then(|| scanned.clone()), lexemes)
                }
            };
            let node = f.node as usize;
            let range = (node + 1, trie.node(node).subtree_end as usize, depth0 + inner.len() + 1);
            let stack = level_in(&mut self.levels, level);
            light_walk(&grammar, trie, self.memo.lexemes(after), range, stack, words);
            if stack.frontiers.nodes.is_empty() {
                continue;
            }
            // a lexeme ends inside the subtree: the parser must read the last byte
            let nested = std::mem::take(&mut stack.frontiers);
            parser.push(last)?;
            let result = self.frontiers(parser, trie, &nested, range.2, words, level + 1);
            parser.pop(1);
            self.level(level).frontiers = nested;
            result?;
        }
        parser.truncate(base);
        Ok(())
    }

    fn level(&mut self, level: usize) -> &mut Level {
        level_in(&mut self.levels, level)
    }
}

/// The working memory of `level`, made on first use.
fn level_in(levels: &mut Vec<Level>, level: usize) -> &mut Level {
    if levels.len() <= level {
        levels.resize_with(level + 1, Level::default);
    }
    &mut levels[level]
}
