//! A grammar as flat tables: the form `earley::Parser` reads (contract: the reference's
//! `pyagent_ref.structured.grammar.Grammar` and `dfa.DFA`).
//!
//! Every alternative of every rule is laid out in one array of symbols, followed by an
//! `End(rule)` marker, so an Earley item's "dot" is a single index into that array and
//! moving the dot past a symbol is `pos + 1`. A terminal is a lexeme given by its
//! minimal byte DFA (`Dfa`), stepped with two table reads per byte.

use std::fmt;

/// The state after a byte string that is no prefix of any match (`dfa.DEAD`).
pub const DEAD: i32 = -1;

/// A move of a DFA packed in one word (`Dfa::step_move`): the next state's row (its
/// first entry in the move table, `state * num_classes`), with `ACCEPTS` set if it is
/// accepting, or `DEAD_MOVE`. Walks keep rows rather than states: a move is then one
/// table read after the last, which is what bounds a trie walk.
pub const ACCEPTS: u32 = 1 << 31;
pub const DEAD_MOVE: u32 = u32::MAX;

/// A grammar that cannot be used; the message names the rule or terminal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableError(pub String);

impl fmt::Display for TableError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A trimmed byte DFA (the reference's `DFA`): `transitions[q * num_classes + c]` is the
/// state after a byte of class `c = byte_class[b]` in state `q`, `DEAD` if no match can
/// follow; every live state can still reach an accepting one.
#[derive(Debug, Clone)]
pub struct Dfa {
    byte_class: [u8; 256],
    num_classes: usize,
    transitions: Vec<i32>,
    accepting: Vec<bool>,
    /// `transitions` as packed moves (see `ACCEPTS`).
    moves: Vec<u32>,
    start: i32,
    /// A 128-bit hash of the tables: equal minimal DFAs (one language) have equal
    /// fingerprints, so work cached for one grammar's lexeme serves another's.
    fingerprint: u128,
}

impl Dfa {
    /// Checks every index the stepping relies on, so no table read can go out of bounds.
    pub fn new(
        byte_class: &[u8],
        transitions: Vec<i32>,
        accepting: Vec<bool>,
        start: i32,
    ) -> Result<Dfa, String> {
        let byte_class: [u8; 256] = byte_class
            .try_into()
            .map_err(|_| format!("byte_class has {} entries, not 256", byte_class.len()))?;
        let num_classes = byte_class
            .iter()
            .map(|&c| c as usize + 1)
            .max()
            .unwrap_or(1);
        let num_states = accepting.len();
        if num_states * num_classes >= ACCEPTS as usize {
            return Err(format!("{num_states} states of {num_classes} byte classes"));
        }
        if transitions.len() != num_states * num_classes {
            return Err(format!(
                "{} transitions for {num_states} states of {num_classes} byte classes",
                transitions.len()
            ));
        }
        if let Some(&bad) = transitions
            .iter()
            .find(|&&t| t < DEAD || t >= num_states as i32)
        {
            return Err(format!("a transition to state {bad} of {num_states}"));
        }
        if start == DEAD || start < 0 || start >= num_states as i32 {
            return Err(format!(
                "start state {start} of {num_states} (an empty language?)"
            ));
        }
        let mut hashed = Vec::with_capacity(260 + 4 * transitions.len() + accepting.len());
        hashed.extend_from_slice(&byte_class);
        hashed.extend_from_slice(&start.to_le_bytes());
        hashed.extend(transitions.iter().flat_map(|t| t.to_le_bytes()));
        hashed.extend(accepting.iter().map(|&a| a as u8));
        let moves = transitions
            .iter()
            .map(|&t| match t {
                DEAD => DEAD_MOVE,
                t if accepting[t as usize] => (t as usize * num_classes) as u32 | ACCEPTS,
                t => (t as usize * num_classes) as u32,
            })
            .collect();
        Ok(Dfa {
            byte_class,
            num_classes,
            transitions,
            accepting,
            moves,
            start,
            fingerprint: xxhash_rust::xxh3::xxh3_128(&hashed),
        })
    }

    /// The state after `byte` in the live state `state` (`DEAD` if none).
    #[inline(always)]
    pub fn step(&self, state: i32, byte: u8) -> i32 {
        self.transitions
            [state as usize * self.num_classes + self.byte_class[byte as usize] as usize]
    }

    /// The packed move (see `ACCEPTS`) on `byte` from the state whose row is `row`.
    #[inline(always)]
    pub fn step_move(&self, row: u32, byte: u8) -> u32 {
        self.moves[row as usize + self.byte_class[byte as usize] as usize]
    }

    /// The row of the live state `state` (what `step_move` takes).
    #[inline(always)]
    pub fn row(&self, state: i32) -> u32 {
        (state as usize * self.num_classes) as u32
    }

    /// The state of a row (a packed move without its `ACCEPTS` bit).
    #[inline(always)]
    pub fn state_of_row(&self, row: u32) -> i32 {
        (row as usize / self.num_classes) as i32
    }

    /// Whether the live state `state` is accepting.
    #[inline(always)]
    pub fn accepts(&self, state: i32) -> bool {
        self.accepting[state as usize]
    }

    pub fn start(&self) -> i32 {
        self.start
    }

    pub fn num_states(&self) -> usize {
        self.accepting.len()
    }

    /// The bytes on which the state whose row is `row` moves to itself, a 256-bit set.
    pub fn loop_bytes(&self, row: u32) -> [u64; 4] {
        let mut set = [0u64; 4];
        for b in 0..=255u8 {
            if self.step_move(row, b) & !ACCEPTS == row {
                set[(b >> 6) as usize] |= 1 << (b & 63);
            }
        }
        set
    }

    /// Where a walk of the trie from the live state `a` may first differ from the walk
    /// from `b`: None if, for every nonempty string of at most `depth` bytes with no
    /// proper nonempty prefix accepted (a walk stops where its lexeme accepts), both
    /// states die on it or neither does and both accept it or neither does; else the
    /// length of the shortest string where they may differ. A breadth-first search of the
    /// pairs of states the two reach, each pair once at its least depth; once it has met
    /// more than `max_pairs` pairs it answers, conservatively, the depth it is at.
    pub fn first_difference(
        &self,
        a: i32,
        b: i32,
        depth: usize,
        max_pairs: usize,
    ) -> Option<usize> {
        let mut seen: rustc_hash::FxHashSet<(i32, i32)> = Default::default();
        let mut level = vec![(a, b)];
        let mut next = Vec::new();
        for length in 1..=depth {
            for &(p, q) in &level {
                for c in 0..self.num_classes {
                    let (p2, q2) = (
                        self.transitions[p as usize * self.num_classes + c],
                        self.transitions[q as usize * self.num_classes + c],
                    );
                    if p2 == q2 {
                        continue; // one state: the same walk below
                    }
                    if p2 == DEAD || q2 == DEAD {
                        return Some(length); // the other is live (they differ)
                    }
                    let accepting = self.accepting[p2 as usize];
                    if accepting != self.accepting[q2 as usize] {
                        return Some(length);
                    }
                    if !accepting && seen.insert((p2, q2)) {
                        if seen.len() > max_pairs {
                            return Some(length);
                        }
                        next.push((p2, q2));
                    }
                }
            }
            std::mem::swap(&mut level, &mut next);
            next.clear();
            if level.is_empty() {
                break;
            }
        }
        None
    }

    /// Whether the empty string is in the language.
    pub fn nullable(&self) -> bool {
        self.accepts(self.start)
    }

    pub fn fingerprint(&self) -> u128 {
        self.fingerprint
    }
}

/// One symbol of the flat alternative array.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sym {
    /// A nonterminal (rule id).
    Rule(u32),
    /// A terminal (index into `Grammar::terminals`).
    Term(u32),
    /// The end of an alternative of this rule.
    End(u32),
}

/// A checked grammar: rules over lexemes, with the nullable set computed.
#[derive(Debug)]
pub struct Grammar {
    /// Each alternative's symbols then `End(rule)`, alternatives grouped by rule.
    pub syms: Vec<Sym>,
    /// Where each alternative starts in `syms`; rule r's are `alts[rule_alts[r]..rule_alts[r + 1]]`.
    pub alts: Vec<u32>,
    pub rule_alts: Vec<u32>,
    pub nullable: Vec<bool>,
    pub terminals: Vec<Dfa>,
    pub start: u32,
}

impl Grammar {
    /// `rules[r]` lists rule r's alternatives, each a list of symbols: `s >= 0` is rule
    /// `s`, `s < 0` is terminal `-s - 1`. Errors name an out-of-range symbol or start.
    pub fn new(
        rules: &[Vec<Vec<i64>>],
        start: i64,
        terminals: Vec<Dfa>,
    ) -> Result<Grammar, TableError> {
        let (num_rules, num_terms) = (rules.len() as i64, terminals.len() as i64);
        if !(0..num_rules).contains(&start) {
            return Err(TableError(format!("start rule {start} of {num_rules}")));
        }
        let (mut syms, mut alts, mut rule_alts) = (Vec::new(), Vec::new(), vec![0u32]);
        for (r, rule) in rules.iter().enumerate() {
            for alt in rule {
                alts.push(syms.len() as u32);
                for &s in alt {
                    syms.push(match s {
                        s if (0..num_rules).contains(&s) => Sym::Rule(s as u32),
                        s if (-num_terms..0).contains(&s) => Sym::Term((-s - 1) as u32),
                        s => {
                            return Err(TableError(format!("rule {r} uses an unknown symbol {s}")))
                        }
                    });
                }
                syms.push(Sym::End(r as u32));
            }
            rule_alts.push(alts.len() as u32);
        }
        if syms.len() >= u32::MAX as usize / 2 {
            return Err(TableError("grammar too large".into()));
        }
        let mut grammar = Grammar {
            syms,
            alts,
            rule_alts,
            nullable: vec![false; rules.len()],
            terminals,
            start: start as u32,
        };
        grammar.nullable = grammar.nullable_rules();
        Ok(grammar)
    }

    /// The start positions of rule `r`'s alternatives.
    #[inline]
    pub fn alternatives(&self, r: u32) -> &[u32] {
        &self.alts[self.rule_alts[r as usize] as usize..self.rule_alts[r as usize + 1] as usize]
    }

    /// The rules that derive the empty string (a fixpoint, as `Grammar.nullable`).
    fn nullable_rules(&self) -> Vec<bool> {
        let mut nullable = vec![false; self.rule_alts.len() - 1];
        let mut changed = true;
        while changed {
            changed = false;
            for r in 0..nullable.len() {
                if nullable[r] {
                    continue;
                }
                let empty = self.alternatives(r as u32).iter().any(|&start| {
                    self.syms[start as usize..]
                        .iter()
                        .take_while(|s| !matches!(s, Sym::End(_)))
                        .all(|s| match *s {
                            Sym::Rule(q) => nullable[q as usize],
                            Sym::Term(t) => self.terminals[t as usize].nullable(),
                            Sym::End(_) => unreachable!(),
                        })
                });
                if empty {
                    nullable[r] = true;
                    changed = true;
                }
            }
        }
        nullable
    }
}

#[cfg(test)]
pub mod tests {
    use super::*;

    /// The DFA of exactly `text` (one class per distinct byte, plus the rest).
    pub fn literal(text: &[u8]) -> Dfa {
        let mut byte_class = [0u8; 256];
        let mut next = 1u8;
        for &b in text {
            if byte_class[b as usize] == 0 {
                byte_class[b as usize] = next;
                next += 1;
            }
        }
        let classes = next as usize;
        let states = text.len() + 1;
        let mut transitions = vec![DEAD; states * classes];
        for (q, &b) in text.iter().enumerate() {
            transitions[q * classes + byte_class[b as usize] as usize] = q as i32 + 1;
        }
        let accepting = (0..states).map(|q| q == text.len()).collect();
        Dfa::new(&byte_class, transitions, accepting, 0).unwrap()
    }

    /// The DFA of `[set]*` for a set of bytes.
    pub fn star(set: &[u8]) -> Dfa {
        let mut byte_class = [0u8; 256];
        for &b in set {
            byte_class[b as usize] = 1;
        }
        // one state, looping on the set's class (class 1; none when the set is empty)
        let transitions = if set.is_empty() {
            vec![DEAD]
        } else {
            vec![DEAD, 0]
        };
        Dfa::new(&byte_class, transitions, vec![true], 0).unwrap()
    }

    #[test]
    fn nullable_is_a_fixpoint() {
        // 0: A -> B a | ε-free;  1: B -> C C;  2: C -> "" (a nullable terminal) | "x"
        let terms = vec![literal(b"a"), star(b""), literal(b"x")];
        let rules = vec![
            vec![vec![1, -1]],
            vec![vec![2, 2]],
            vec![vec![-2], vec![-3]],
        ];
        let g = Grammar::new(&rules, 0, terms).unwrap();
        assert_eq!(g.nullable, vec![false, true, true]);
        assert_eq!(g.alternatives(2).len(), 2);
    }

    #[test]
    fn bad_tables_are_errors() {
        assert!(Dfa::new(&[0; 255], vec![], vec![], 0).is_err());
        assert!(Dfa::new(&[0; 256], vec![1], vec![true], 0).is_err());
        assert!(Dfa::new(&[0; 256], vec![DEAD], vec![true], DEAD).is_err());
        assert!(Grammar::new(&[vec![vec![5]]], 0, vec![]).is_err());
        assert!(Grammar::new(&[vec![vec![]]], 1, vec![]).is_err());
    }

    #[test]
    fn packed_moves_agree_with_steps() {
        let dfa = literal(b"aba");
        for state in 0..3 {
            for byte in [b'a', b'b', b'c'] {
                let (next, packed) = (dfa.step(state, byte), dfa.step_move(dfa.row(state), byte));
                match next {
                    DEAD => assert_eq!(packed, DEAD_MOVE),
                    q => {
                        assert_eq!(dfa.state_of_row(packed & !ACCEPTS), q);
                        assert_eq!(packed & ACCEPTS != 0, dfa.accepts(q));
                    }
                }
            }
        }
    }

    /// The DFA of `[ab]{0,n}` then `"`: state k has read k of at most n letters.
    pub fn counting(n: usize) -> Dfa {
        let mut byte_class = [0u8; 256];
        byte_class[b'a' as usize] = 1;
        byte_class[b'b' as usize] = 1;
        byte_class[b'"' as usize] = 2;
        let (end, mut transitions) = (n as i32 + 1, Vec::new());
        for k in 0..=n as i32 {
            let letter = if k < n as i32 { k + 1 } else { DEAD };
            transitions.extend([DEAD, letter, end]);
        }
        transitions.extend([DEAD, DEAD, DEAD]);
        let accepting = (0..=end).map(|q| q == end).collect();
        Dfa::new(&byte_class, transitions, accepting, 0).unwrap()
    }

    #[test]
    fn first_difference_is_the_depth_that_tells_states_apart() {
        let dfa = counting(10);
        // states 0 and 3 have 10 and 7 letters left: 8 letters tell them apart
        assert_eq!(dfa.first_difference(0, 3, 7, 1000), None);
        assert_eq!(dfa.first_difference(0, 3, 20, 1000), Some(8));
        assert_eq!(dfa.first_difference(3, 3, 100, 1000), None);
        assert_eq!(dfa.first_difference(0, 3, 7, 2), Some(3)); // a third pair: no more
        let lit = literal(b"ab");
        assert_eq!(lit.first_difference(0, 1, 5, 1000), Some(1)); // 'a' lives from 0 only
    }

    #[test]
    fn equal_dfas_share_a_fingerprint() {
        assert_eq!(literal(b"ab").fingerprint(), literal(b"ab").fingerprint());
        assert_ne!(literal(b"ab").fingerprint(), literal(b"ba").fingerprint());
    }
}
