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

use super::earley::{Parser, TooManyItems};
use super::tables::{Grammar, DEAD};
use super::trie::Trie;

/// The lexemes in progress as a cache key: `(DFA fingerprint, state)`, sorted, unique.
pub type SliceKey = Vec<(u128, i32)>;

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
}

/// One level's working memory: the lexemes after each depth of the current branch
/// (depth k's, relative to the walk's start, are `lexemes[end[k - 1]..end[k]]`), the
/// branch's bytes, and the frontier found.
#[derive(Debug, Default)]
struct Level {
    lexemes: Vec<(u32, i32)>,
    end: Vec<usize>,
    path: Vec<u8>,
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

fn slice_key(grammar: &Grammar, lexemes: &[(u32, i32)]) -> SliceKey {
    let mut key: SliceKey = lexemes
        .iter()
        .map(|&(t, q)| (grammar.terminals[t as usize].fingerprint(), q))
        .collect();
    key.sort_unstable();
    key.dedup();
    key
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
        frontiers,
    } = level;
    frontiers.clear();
    lexemes.clear();
    lexemes.extend_from_slice(start);
    end.clear();
    end.resize(trie.max_depth - depth0 + 1, 0);
    end[0] = start.len();
    path.clear();
    path.resize(trie.max_depth - depth0, 0);
    let mut node = lo;
    while node < hi {
        frontiers.visited += 1;
        let k = trie.depth[node] as usize - depth0; // >= 1
        let byte = trie.byte[node];
        let parent = if k == 1 { 0 } else { end[k - 2] }..end[k - 1];
        lexemes.truncate(parent.end);
        let mut accepting = false;
        for i in parent {
            let (t, q) = lexemes[i];
            let dfa = &terms[t as usize];
            let next = dfa.step(q, byte);
            if next != DEAD && !lexemes[end[k - 1]..].contains(&(t, next)) {
                lexemes.push((t, next));
                accepting |= dfa.accepts(next);
            }
        }
        let subtree_end = trie.subtree_end[node] as usize;
        if lexemes.len() == end[k - 1] {
            node = subtree_end; // every lexeme died: skip the subtree
            continue;
        }
        end[k] = lexemes.len();
        path[k - 1] = byte;
        allow(words, trie.tokens(node));
        if accepting {
            if node + 1 < subtree_end {
                let bytes_start = frontiers.bytes.len() as u32;
                frontiers.bytes.extend_from_slice(&path[..k]);
                frontiers.nodes.push(Frontier {
                    node: node as u32,
                    bytes_start,
                    bytes_end: frontiers.bytes.len() as u32,
                });
            }
            node = subtree_end;
        } else {
            node += 1;
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
        let result = self.fill_from_root(parser, trie, words);
        parser.truncate(base);
        result
    }

    fn fill_from_root(
        &mut self,
        parser: &mut Parser,
        trie: &Trie,
        words: &mut [u32],
    ) -> Result<(), TooManyItems> {
        let grammar = parser.grammar().clone();
        let lexemes = lexemes_of(parser);
        let key = slice_key(&grammar, &lexemes);
        let slice = match trie.cached_slice(&key) {
            Some(slice) => slice,
            None => {
                let mut slice_words = vec![0; words.len()];
                let level = self.level(0);
                light_walk(&grammar, trie, &lexemes, (1, trie.len(), 0), level, &mut slice_words);
                let slice = Arc::new(Slice {
                    words: slice_words,
                    frontiers: std::mem::take(&mut level.frontiers),
                });
                if slice.frontiers.visited >= CACHE_MIN_VISITS {
                    trie.cache_slice(key, slice.clone());
                }
                slice
            }
        };
        for (w, s) in words.iter_mut().zip(&slice.words) {
            *w |= s;
        }
        self.frontiers(parser, trie, &slice.frontiers, 0, words, 1)
    }

    /// Decide the subtrees of the frontier nodes (prefixes below `depth0`, where the
    /// parser stands) with the parser, ORing their tokens into `words`; the parser ends
    /// where it started.
    fn frontiers(
        &mut self,
        parser: &mut Parser,
        trie: &Trie,
        frontiers: &Frontiers,
        depth0: usize,
        words: &mut [u32],
        level: usize,
    ) -> Result<(), TooManyItems> {
        let base = parser.num_bytes();
        let mut previous: &[u8] = &[];
        for f in &frontiers.nodes {
            let prefix = frontiers.prefix(f);
            // the parser holds the previous frontier's prefix: keep what they share
            let shared = prefix
                .iter()
                .zip(previous)
                .take_while(|(a, b)| a == b)
                .count();
            parser.truncate(base + shared);
            previous = &prefix[..shared];
            for &byte in &prefix[shared..] {
                // the light walk saw a run survive every byte, so the parser takes them
                let taken = parser.push(byte)?;
                debug_assert!(taken, "the parser refuses a frontier's prefix");
                if !taken {
                    break;
                }
            }
            if parser.num_bytes() != base + prefix.len() {
                continue;
            }
            previous = prefix;
            let node = f.node as usize;
            let range = (node + 1, trie.subtree_end[node] as usize, depth0 + prefix.len());
            self.subtree(parser, trie, range, words, level)?;
        }
        parser.truncate(base);
        Ok(())
    }

    /// The walk of the trie nodes `lo..hi` below the parser's prefix (which is `depth0`
    /// bytes deep in the trie), ORing the tokens allowed into `words`.
    fn subtree(
        &mut self,
        parser: &mut Parser,
        trie: &Trie,
        range: (usize, usize, usize),
        words: &mut [u32],
        level: usize,
    ) -> Result<(), TooManyItems> {
        let grammar = parser.grammar().clone();
        let lexemes = lexemes_of(parser);
        let stack = self.level(level);
        light_walk(&grammar, trie, &lexemes, range, stack, words);
        // this level's frontier is walked by deeper levels: keep it out of their way
        let frontiers = std::mem::take(&mut stack.frontiers);
        let result = self.frontiers(parser, trie, &frontiers, range.2, words, level + 1);
        self.level(level).frontiers = frontiers;
        result
    }

    fn level(&mut self, level: usize) -> &mut Level {
        if self.levels.len() <= level {
            self.levels.resize_with(level + 1, Level::default);
        }
        &mut self.levels[level]
    }
}
