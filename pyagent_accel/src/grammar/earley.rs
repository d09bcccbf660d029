//! A byte-level Earley parser with undo (contract: `pyagent_ref.structured.earley`).
//!
//! The algorithm is the reference's: after `n` bytes the state is `n + 1` columns; a
//! column holds *items* (a dotted alternative and the column it started in) and *runs*
//! (a terminal's DFA in some state, started in some column). `push` steps every run of
//! the last column on the byte (the scan); a run that reaches an accepting state
//! completes its terminal, moving the dots of the items waiting for it; the closure then
//! predicts and completes within the new column, stepping over nullable symbols at
//! prediction (Aycock and Horspool), so a completion never needs items of its own
//! column. The bytes are a viable prefix exactly when the new column has runs.
//!
//! What differs is the storage. All columns live in three flat arenas (the runs, the
//! items waiting for a symbol, the column bounds); `pop` truncates them, so pushing and
//! popping the bytes of a trie walk allocates nothing once the arenas have grown.
//! Finished items are never stored: a column keeps only its *waiting* items, sorted by
//! the symbol they wait for (looked up by binary search when a later column completes
//! that symbol), and a flag for "the start rule is finished from column 0". A byte that
//! completes no terminal (the common case: inside a string or a number) makes a column
//! of runs only, with no closure at all.

use rustc_hash::FxHashSet;
use std::sync::Arc;

use super::tables::{Grammar, Sym, DEAD};

/// The most items one column may hold (the reference's `MAX_COLUMN_ITEMS`).
pub const MAX_COLUMN_ITEMS: usize = 100_000;

/// An Earley item: the dot at `syms[pos]`, in an alternative begun at column `origin`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Item {
    pos: u32,
    origin: u32,
}

impl Item {
    fn advanced(self) -> Item {
        Item {
            pos: self.pos + 1,
            origin: self.origin,
        }
    }
}

/// A lexeme in progress: `term`'s DFA is in `state` after the bytes since column `origin`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Run {
    pub term: u32,
    pub origin: u32,
    pub state: i32,
}

/// The end (exclusive) of a column's slice of each arena; it starts where the previous
/// column ends.
#[derive(Debug, Clone, Copy)]
struct Column {
    runs_end: u32,
    waiting_end: u32,
    /// Whether the start rule is finished from column 0 here (the bytes are a sentence).
    accepting: bool,
}

/// The key a waiting item is filed under: the symbol after its dot.
fn waiting_key(sym: Sym) -> u32 {
    match sym {
        Sym::Rule(r) => 2 * r,
        Sym::Term(t) => 2 * t + 1,
        Sym::End(_) => unreachable!("finished items wait for nothing"),
    }
}

/// A column over the item limit (the reference's `GrammarError`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TooManyItems(pub usize);

impl std::fmt::Display for TooManyItems {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "more than {MAX_COLUMN_ITEMS} Earley items at byte {}",
            self.0
        )
    }
}

/// Recognises a grammar's sentences byte by byte, with undo. Contract: after successful
/// pushes of bytes `s`, `s` is a prefix of some sentence; `push` refuses (returns false,
/// changes nothing) exactly the bytes after which none can follow; `is_accepting` says
/// whether `s` is a sentence; `pop` undoes pushes.
#[derive(Debug)]
pub struct Parser {
    grammar: Arc<Grammar>,
    columns: Vec<Column>,
    runs: Vec<Run>,
    waiting: Vec<(u32, Item)>,
    scratch: Scratch,
}

/// Per-closure working memory, reused between pushes.
#[derive(Debug, Default)]
struct Scratch {
    agenda: Vec<Item>,
    seen: FxHashSet<Item>,
    /// `started[t] == epoch`: terminal t already has a run begun in this column.
    started: Vec<u32>,
    /// `predicted[r] == epoch`: rule r's alternatives are already predicted here.
    predicted: Vec<u32>,
    epoch: u32,
}

impl Clone for Parser {
    fn clone(&self) -> Parser {
        Parser {
            grammar: self.grammar.clone(),
            columns: self.columns.clone(),
            runs: self.runs.clone(),
            waiting: self.waiting.clone(),
            scratch: Scratch::default(),
        }
    }
}

impl Parser {
    /// A parser that has read no bytes.
    pub fn new(grammar: Arc<Grammar>) -> Result<Parser, TooManyItems> {
        let mut parser = Parser {
            grammar,
            columns: Vec::new(),
            runs: Vec::new(),
            waiting: Vec::new(),
            scratch: Scratch::default(),
        };
        let start = parser.grammar.start;
        let agenda = &mut parser.scratch.agenda;
        for &pos in parser.grammar.alternatives(start) {
            agenda.push(Item { pos, origin: 0 });
        }
        parser.close()?;
        Ok(parser)
    }

    pub fn grammar(&self) -> &Arc<Grammar> {
        &self.grammar
    }

    /// How many bytes have been pushed (and not popped).
    pub fn num_bytes(&self) -> usize {
        self.columns.len() - 1
    }

    /// Whether the bytes pushed so far are a whole sentence.
    pub fn is_accepting(&self) -> bool {
        self.columns.last().is_some_and(|c| c.accepting)
    }

    /// The runs of the last column (what the next byte is matched against).
    pub fn runs(&self) -> &[Run] {
        &self.runs[self.column_start(self.columns.len() - 1).0..]
    }

    /// The terminals whose runs a column would start if the runs `ended` (terminal,
    /// origin; each origin a column of this parser) reached accepting states in it: the
    /// lexemes that may follow them. Changes nothing. Errors as `push` does.
    pub fn started_after(
        &mut self,
        ended: &[(u32, u32)],
        out: &mut Vec<u32>,
    ) -> Result<(), TooManyItems> {
        out.clear();
        let last = self.columns.len() - 1;
        let (runs_end, waiting_end) = (self.runs.len(), self.waiting.len());
        for &(term, origin) in ended {
            let origin = origin as usize;
            let (_, start) = self.column_start(origin);
            let waiting = waiting_for(
                &self.waiting,
                start,
                self.columns[origin].waiting_end as usize,
                waiting_key(Sym::Term(term)),
            );
            let agenda = &mut self.scratch.agenda;
            agenda.extend(waiting.iter().map(|&(_, item)| item.advanced()));
        }
        let closed = self.close();
        if closed.is_ok() {
            out.extend(self.runs[runs_end..].iter().map(|r| r.term));
            self.columns.truncate(last + 1);
        }
        self.runs.truncate(runs_end);
        self.waiting.truncate(waiting_end);
        closed
    }

    /// The runs pushing `byte` would scan into the next column, sorted, into `out`
    /// (changes nothing). With the columns so far, they decide everything the push does.
    pub fn scanned_runs(&self, byte: u8, out: &mut Vec<Run>) {
        let terms = &self.grammar.terminals;
        out.clear();
        for run in self.runs() {
            let state = terms[run.term as usize].step(run.state, byte);
            if state != DEAD {
                out.push(Run { state, ..*run });
            }
        }
        out.sort_unstable();
        out.dedup();
    }

    /// Whether pushing `byte` would succeed (some run survives it); changes nothing.
    pub fn can_push(&self, byte: u8) -> bool {
        let terms = &self.grammar.terminals;
        self.runs()
            .iter()
            .any(|r| terms[r.term as usize].step(r.state, byte) != DEAD)
    }

    /// Read one byte: false, and no change, if no sentence continues this way. An error
    /// (a column over `MAX_COLUMN_ITEMS`) leaves the parser as it was.
    pub fn push(&mut self, byte: u8) -> Result<bool, TooManyItems> {
        let last = self.columns.len() - 1;
        let (runs_start, _) = self.column_start(last);
        let runs_end = self.runs.len();
        let grammar = &*self.grammar;
        for i in runs_start..runs_end {
            let run = self.runs[i];
            let dfa = &grammar.terminals[run.term as usize];
            let state = dfa.step(run.state, byte);
            if state == DEAD {
                continue;
            }
            self.runs.push(Run { state, ..run });
            if dfa.accepts(state) {
                // the terminal may end here: every item waiting for it moves its dot
                let waiting = waiting_for(
                    &self.waiting,
                    self.column_start(run.origin as usize).1,
                    self.columns[run.origin as usize].waiting_end as usize,
                    waiting_key(Sym::Term(run.term)),
                );
                let agenda = &mut self.scratch.agenda;
                agenda.extend(waiting.iter().map(|&(_, item)| item.advanced()));
            }
        }
        if self.runs.len() == runs_end {
            self.scratch.agenda.clear();
            return Ok(false);
        }
        let stepped = &mut self.runs[runs_end..];
        if stepped.len() > 1 {
            // two states of one run may step to the same state: keep runs a set
            stepped.sort_unstable();
            let mut kept = 1;
            for i in 1..stepped.len() {
                if stepped[i] != stepped[kept - 1] {
                    stepped[kept] = stepped[i];
                    kept += 1;
                }
            }
            self.runs.truncate(runs_end + kept);
        }
        if let Err(err) = self.close() {
            self.runs.truncate(runs_end);
            self.waiting
                .truncate(self.columns[last].waiting_end as usize);
            return Err(err);
        }
        Ok(true)
    }

    /// Undo the last `n` pushed bytes (`n <= num_bytes()`, checked by the caller).
    pub fn pop(&mut self, n: usize) {
        debug_assert!(n <= self.num_bytes());
        if n == 0 {
            return;
        }
        self.columns.truncate(self.columns.len() - n);
        let last = self.columns[self.columns.len() - 1];
        self.runs.truncate(last.runs_end as usize);
        self.waiting.truncate(last.waiting_end as usize);
    }

    /// Pop back to `num_bytes` bytes.
    pub fn truncate(&mut self, num_bytes: usize) {
        self.pop(self.num_bytes() - num_bytes);
    }

    /// Where column `c`'s runs and waiting items start in their arenas.
    #[inline]
    fn column_start(&self, c: usize) -> (usize, usize) {
        match c {
            0 => (0, 0),
            _ => {
                let prev = self.columns[c - 1];
                (prev.runs_end as usize, prev.waiting_end as usize)
            }
        }
    }

    /// Finish the column being built (its scanned runs are at the end of `runs`) from
    /// the items on the agenda: add them and everything they predict and complete.
    fn close(&mut self) -> Result<(), TooManyItems> {
        let here = self.columns.len() as u32;
        let waiting_start = self.waiting.len();
        let grammar = &*self.grammar;
        let scratch = &mut self.scratch;
        scratch.next_epoch(grammar);
        let epoch = scratch.epoch;
        let mut accepting = false;
        if !scratch.seen.is_empty() {
            scratch.seen.clear();
        }
        while let Some(item) = scratch.agenda.pop() {
            if !scratch.seen.insert(item) {
                continue;
            }
            if scratch.seen.len() > MAX_COLUMN_ITEMS {
                scratch.agenda.clear();
                return Err(TooManyItems(here as usize));
            }
            match grammar.syms[item.pos as usize] {
                Sym::End(rule) => {
                    accepting |= rule == grammar.start && item.origin == 0;
                    // an item begun here finished here: its rule is nullable, and its
                    // parents here were advanced when they predicted it
                    if item.origin != here {
                        let origin = item.origin as usize;
                        let start = if origin == 0 {
                            0
                        } else {
                            self.columns[origin - 1].waiting_end as usize
                        };
                        let parents = waiting_for(
                            &self.waiting,
                            start,
                            self.columns[origin].waiting_end as usize,
                            2 * rule,
                        );
                        scratch
                            .agenda
                            .extend(parents.iter().map(|&(_, parent)| parent.advanced()));
                    }
                }
                Sym::Term(t) => {
                    self.waiting.push((2 * t + 1, item));
                    let dfa = &grammar.terminals[t as usize];
                    if scratch.started[t as usize] != epoch {
                        scratch.started[t as usize] = epoch;
                        self.runs.push(Run {
                            term: t,
                            origin: here,
                            state: dfa.start(),
                        });
                    }
                    if dfa.nullable() {
                        scratch.agenda.push(item.advanced());
                    }
                }
                Sym::Rule(r) => {
                    self.waiting.push((2 * r, item));
                    if scratch.predicted[r as usize] != epoch {
                        scratch.predicted[r as usize] = epoch;
                        let alternatives = grammar.alternatives(r);
                        scratch
                            .agenda
                            .extend(alternatives.iter().map(|&pos| Item { pos, origin: here }));
                    }
                    if grammar.nullable[r as usize] {
                        scratch.agenda.push(item.advanced());
                    }
                }
            }
        }
        self.waiting[waiting_start..].sort_unstable_by_key(|&(key, _)| key);
        self.columns.push(Column {
            runs_end: self.runs.len() as u32,
            waiting_end: self.waiting.len() as u32,
            accepting,
        });
        Ok(())
    }
}

impl Scratch {
    /// A fresh epoch for the `started` / `predicted` stamps (reset on wrap-around).
    fn next_epoch(&mut self, grammar: &Grammar) {
        if self.started.len() != grammar.terminals.len()
            || self.predicted.len() != grammar.nullable.len()
        {
            self.started = vec![0; grammar.terminals.len()];
            self.predicted = vec![0; grammar.nullable.len()];
        }
        self.epoch = self.epoch.wrapping_add(1);
        if self.epoch == 0 {
            self.started.fill(0);
            self.predicted.fill(0);
            self.epoch = 1;
        }
    }
}

/// The entries of `waiting[start..end]` (one column, sorted by key) filed under `key`.
#[inline]
fn waiting_for(waiting: &[(u32, Item)], start: usize, end: usize, key: u32) -> &[(u32, Item)] {
    let column = &waiting[start..end];
    let first = column.partition_point(|&(k, _)| k < key);
    let count = column[first..].partition_point(|&(k, _)| k == key);
    &column[first..first + count]
}

#[cfg(test)]
mod tests {
    use super::super::tables::tests::{literal, star};
    use super::*;

    /// S -> S "a" | "b" ... with the terminals given; for the tests below.
    fn parser(rules: Vec<Vec<Vec<i64>>>, terms: Vec<super::super::tables::Dfa>) -> Parser {
        Parser::new(Arc::new(Grammar::new(&rules, 0, terms).unwrap())).unwrap()
    }

    fn feed(p: &mut Parser, text: &[u8]) -> bool {
        let before = p.num_bytes();
        for &b in text {
            if !p.push(b).unwrap() {
                p.truncate(before);
                return false;
            }
        }
        true
    }

    #[test]
    fn left_recursion_and_undo() {
        // S -> S "a" | "b"
        let mut p = parser(
            vec![vec![vec![0, -1], vec![-2]]],
            vec![literal(b"a"), literal(b"b")],
        );
        assert!(!p.is_accepting());
        assert!(!feed(&mut p, b"a"));
        assert!(feed(&mut p, b"baa") && p.is_accepting());
        assert!(!feed(&mut p, b"b"));
        p.pop(2);
        assert!(p.is_accepting() && p.num_bytes() == 1);
        assert!(feed(&mut p, b"a"));
    }

    #[test]
    fn nullable_rules_and_terminals() {
        // S -> A A "x";  A -> "" | [y]*
        let mut p = parser(
            vec![vec![vec![1, 1, -1]], vec![vec![], vec![-2]]],
            vec![literal(b"x"), star(b"y")],
        );
        assert!(feed(&mut p, b"x") && p.is_accepting());
        p.pop(1);
        assert!(feed(&mut p, b"yyyx") && p.is_accepting());
    }

    #[test]
    fn lexemes_are_not_greedy() {
        // S -> [a]* "a"
        let mut p = parser(vec![vec![vec![-1, -2]]], vec![star(b"a"), literal(b"a")]);
        assert!(feed(&mut p, b"aaa") && p.is_accepting());
        assert!(p.can_push(b'a') && !p.can_push(b'b'));
    }
}
