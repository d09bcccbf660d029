//! Byte automata: the subset construction, Hopcroft's minimisation and the product
//! construction (contract: `pyagent_ref.structured.dfa`: `determinize`, `minimize`,
//! `intersect`, `subtract`).
//!
//! Every result goes through `canonical` (trimmed, states numbered breadth-first from the
//! start with classes tried by their first byte, classes whose columns agree merged), as
//! the reference's do. A canonical table depends only on the automaton up to the names
//! of its states, and a minimal DFA only on its language, so these functions return the
//! reference's tables exactly, whatever order they build states in: the tests compare
//! them table for table.
//!
//! The differences are storage: a subset is a sorted `Vec<u32>` of NFA states, the
//! epsilon closure marks states with an epoch stamp, and Hopcroft's partition is one
//! array of states grouped by block (a split moves the marked states to the block's
//! front and cuts there), with the predecessors of each (class, state) in one flat array.

use rustc_hash::FxHashMap;

use super::tables::DEAD;

/// A DFA as the constructions exchange it (the reference's `DFA`, rows flattened):
/// `transitions[q * num_classes + c]` is the state after a byte of class
/// `c = byte_class[b]` in state q, or `DEAD`. An empty language has no states and start
/// `DEAD`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Table {
    pub byte_class: [u8; 256],
    pub num_classes: usize,
    pub transitions: Vec<i32>,
    pub accepting: Vec<bool>,
    pub start: i32,
}

impl Table {
    /// The empty language (the reference's ``DFA((0,) * 256, (), (), DEAD)``).
    pub fn empty() -> Table {
        Table {
            byte_class: [0; 256],
            num_classes: 1,
            transitions: Vec::new(),
            accepting: Vec::new(),
            start: DEAD,
        }
    }

    pub fn num_states(&self) -> usize {
        self.accepting.len()
    }

    /// Checks what the constructions index by (the binding's validation): classes, the
    /// table's size, every target and the start.
    pub fn new(
        byte_class: [u8; 256],
        transitions: Vec<i32>,
        accepting: Vec<bool>,
        start: i32,
    ) -> Result<Table, String> {
        let num_classes = byte_class
            .iter()
            .map(|&c| c as usize + 1)
            .max()
            .unwrap_or(1);
        let n = accepting.len();
        if transitions.len() != n * num_classes {
            return Err(format!(
                "{} transitions for {n} states of {num_classes} byte classes",
                transitions.len()
            ));
        }
        if let Some(&bad) = transitions.iter().find(|&&t| t < DEAD || t >= n as i32) {
            return Err(format!("a transition to state {bad} of {n}"));
        }
        if start < DEAD || start >= n as i32 || (start == DEAD) != (n == 0) {
            return Err(format!("start state {start} of {n}"));
        }
        Ok(Table {
            byte_class,
            num_classes,
            transitions,
            accepting,
            start,
        })
    }
}

/// A Thompson NFA (the reference's `NFA`): `edges[q]` are (lo, hi, target) byte moves,
/// `epsilons[q]` the states reached without a byte. Every index is below the number of
/// states (the binding checks).
#[derive(Debug, Clone)]
pub struct Nfa {
    pub start: u32,
    pub accept: u32,
    pub edges: Vec<Vec<(u8, u8, u32)>>,
    pub epsilons: Vec<Vec<u32>>,
}

/// A regex syntax tree (the reference's `regex.Node`): a set of code points as ranges,
/// a concatenation, an alternation, or a repetition (`max` None: unbounded).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Node {
    Chars(Vec<(u32, u32)>),
    Concat(Vec<Node>),
    Alt(Vec<Node>),
    Repeat(Box<Node>, u64, Option<u64>),
}

impl Node {
    /// The tree of a prefix encoding (Python's `automata._flatten`): `0 n lo hi ...`
    /// (chars), `1 n items...` (concat), `2 n options...` (alt), `3 min max item` (repeat,
    /// max -1 for none). Err names what is malformed.
    pub fn decode(code: &[i64]) -> Result<Node, String> {
        let mut at = 0;
        let node = Node::decode_at(code, &mut at, 0)?;
        if at != code.len() {
            return Err(format!("{} numbers after the tree", code.len() - at));
        }
        Ok(node)
    }

    fn decode_at(code: &[i64], at: &mut usize, depth: usize) -> Result<Node, String> {
        let mut next = || -> Result<i64, String> {
            let v = *code.get(*at).ok_or("the tree ends early")?;
            *at += 1;
            Ok(v)
        };
        if depth > 10_000 {
            return Err("the tree is nested too deeply".into());
        }
        let (tag, count) = (next()?, next()?);
        let count = usize::try_from(count).map_err(|_| format!("a count of {count}"))?;
        match tag {
            0 => {
                let mut ranges = Vec::with_capacity(count.min(1 << 16));
                for _ in 0..count {
                    let (lo, hi) = (next()?, next()?);
                    if !(0..=0x10FFFF).contains(&lo) || !(lo..=0x10FFFF).contains(&hi) {
                        return Err(format!("a code point range {lo}..{hi}"));
                    }
                    ranges.push((lo as u32, hi as u32));
                }
                Ok(Node::Chars(ranges))
            }
            1 | 2 => {
                let items = (0..count)
                    .map(|_| Node::decode_at(code, at, depth + 1))
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(if tag == 1 {
                    Node::Concat(items)
                } else {
                    Node::Alt(items)
                })
            }
            3 => {
                let max = match next()? {
                    -1 => None,
                    m if m >= count as i64 => Some(m as u64),
                    m => return Err(format!("a repetition {count}..{m}")),
                };
                let item = Node::decode_at(code, at, depth + 1)?;
                Ok(Node::Repeat(Box::new(item), count as u64, max))
            }
            _ => Err(format!("an unknown node tag {tag}")),
        }
    }
}

/// The last code point of each UTF-8 length, and the surrogates (no encoding).
const LENGTH_ENDS: [u32; 4] = [0x7F, 0x7FF, 0xFFFF, 0x10FFFF];
const SURROGATES: (u32, u32) = (0xD800, 0xDFFF);

/// The UTF-8 byte-range sequences matching exactly the encodings of the code points
/// `lo..=hi` (contract and algorithm: the reference's `nfa.utf8_sequences`), appended to
/// `out` in the reference's order.
pub fn utf8_sequences(lo: u32, hi: u32, out: &mut Vec<Vec<(u8, u8)>>) {
    let mut pieces = vec![(lo, hi)];
    if lo <= SURROGATES.1 && hi >= SURROGATES.0 {
        pieces = vec![(lo, SURROGATES.0 - 1), (SURROGATES.1 + 1, hi)];
    }
    for (piece_lo, piece_hi) in pieces {
        let mut start = 0;
        for (length, &end) in LENGTH_ENDS.iter().enumerate() {
            let (a, b) = (piece_lo.max(start), piece_hi.min(end));
            if a <= b {
                same_length(a, b, length + 1, out);
            }
            start = end + 1;
        }
    }
}

fn same_length(lo: u32, hi: u32, length: usize, out: &mut Vec<Vec<(u8, u8)>>) {
    for trailing in 1..length {
        let mask = (1u32 << (6 * trailing)) - 1; // the bits of the last `trailing` bytes
        if lo & !mask == hi & !mask {
            continue; // the leading bytes agree: the trailing bytes are one range each
        }
        if lo & mask != 0 {
            same_length(lo, lo | mask, length, out);
            same_length((lo | mask) + 1, hi, length, out);
            return;
        }
        if hi & mask != mask {
            same_length(lo, (hi & !mask) - 1, length, out);
            same_length(hi & !mask, hi, length, out);
            return;
        }
    }
    let (mut a, mut b) = ([0u8; 4], [0u8; 4]);
    let a = char::from_u32(lo)
        .expect("no surrogate")
        .encode_utf8(&mut a)
        .as_bytes();
    let b = char::from_u32(hi)
        .expect("no surrogate")
        .encode_utf8(&mut b)
        .as_bytes();
    out.push(a.iter().copied().zip(b.iter().copied()).collect());
}

/// Thompson's construction (contract: the reference's `nfa.build_nfa`), with the same
/// states: Err (the reference's message) exactly when it needs over `max_states`.
pub fn build_nfa(node: &Node, max_states: i64) -> Result<Nfa, String> {
    let mut builder = Builder {
        edges: Vec::new(),
        epsilons: Vec::new(),
        max_states,
    };
    let (start, accept) = builder.fragment(node)?;
    Ok(Nfa {
        start,
        accept,
        edges: builder.edges,
        epsilons: builder.epsilons,
    })
}

struct Builder {
    edges: Vec<Vec<(u8, u8, u32)>>,
    epsilons: Vec<Vec<u32>>,
    max_states: i64,
}

impl Builder {
    fn state(&mut self) -> Result<u32, String> {
        if self.edges.len() as i64 >= self.max_states {
            return Err(format!(
                "the pattern needs more than {} NFA states (max_nfa_states); large \
                 repetition counts are expanded into copies",
                self.max_states
            ));
        }
        self.edges.push(Vec::new());
        self.epsilons.push(Vec::new());
        Ok(self.edges.len() as u32 - 1)
    }

    /// `node`'s fragment: its (start, end) states.
    fn fragment(&mut self, node: &Node) -> Result<(u32, u32), String> {
        match node {
            Node::Chars(ranges) => {
                let (start, end) = (self.state()?, self.state()?);
                // "read these byte ranges, then end": one state per distinct suffix
                let mut suffix_states: FxHashMap<Vec<(u8, u8)>, u32> = FxHashMap::default();
                let mut sequences = Vec::new();
                for &(lo, hi) in ranges {
                    utf8_sequences(lo, hi, &mut sequences);
                }
                for sequence in &sequences {
                    let mut target = end;
                    for i in (1..sequence.len()).rev() {
                        let rest = &sequence[i..];
                        target = match suffix_states.get(rest) {
                            Some(&q) => q,
                            None => {
                                let q = self.state()?;
                                self.edges[q as usize].push((rest[0].0, rest[0].1, target));
                                suffix_states.insert(rest.to_vec(), q);
                                q
                            }
                        };
                    }
                    let (lo, hi) = sequence[0];
                    self.edges[start as usize].push((lo, hi, target));
                }
                Ok((start, end))
            }
            Node::Concat(items) => {
                let start = self.state()?;
                let mut end = start;
                for item in items {
                    end = self.then(end, item)?;
                }
                Ok((start, end))
            }
            Node::Alt(options) => {
                let (start, end) = (self.state()?, self.state()?);
                for option in options {
                    let (option_start, option_end) = self.fragment(option)?;
                    self.epsilons[start as usize].push(option_start);
                    self.epsilons[option_end as usize].push(end);
                }
                Ok((start, end))
            }
            Node::Repeat(item, min, max) => {
                let start = self.state()?;
                let mut end = start;
                for _ in 0..*min {
                    end = self.then(end, item)?;
                }
                let Some(max) = max else {
                    // a loop: end -ε-> loop -ε-> item -ε-> loop
                    let looping = self.state()?;
                    self.epsilons[end as usize].push(looping);
                    let (item_start, item_end) = self.fragment(item)?;
                    self.epsilons[looping as usize].push(item_start);
                    self.epsilons[item_end as usize].push(looping);
                    return Ok((start, looping));
                };
                let exit = self.state()?;
                for _ in *min..*max {
                    self.epsilons[end as usize].push(exit);
                    end = self.then(end, item)?;
                }
                self.epsilons[end as usize].push(exit);
                Ok((start, exit))
            }
        }
    }

    /// Append `node`'s fragment after state `end`; its end.
    fn then(&mut self, end: u32, node: &Node) -> Result<u32, String> {
        let (start, node_end) = self.fragment(node)?;
        self.epsilons[end as usize].push(start);
        Ok(node_end)
    }
}

/// Epsilon closures with an epoch-stamped visited set.
struct Closure {
    seen: Vec<u32>,
    epoch: u32,
    stack: Vec<u32>,
}

impl Closure {
    /// The states of the closure of `states` that read a byte or accept (`reads`), sorted:
    /// the name of a subset.
    fn subset(&mut self, nfa: &Nfa, reads: &[bool], states: &[u32]) -> Vec<u32> {
        self.epoch += 1;
        let mut out = Vec::new();
        self.stack.clear();
        for &q in states {
            if self.seen[q as usize] != self.epoch {
                self.seen[q as usize] = self.epoch;
                self.stack.push(q);
            }
        }
        while let Some(q) = self.stack.pop() {
            if reads[q as usize] {
                out.push(q);
            }
            for &t in &nfa.epsilons[q as usize] {
                if self.seen[t as usize] != self.epoch {
                    self.seen[t as usize] = self.epoch;
                    self.stack.push(t);
                }
            }
        }
        out.sort_unstable();
        out
    }
}

/// The subset construction: a trimmed, canonical (not minimal) DFA of `nfa`'s language.
/// Err (the reference's message) once more than `max_states` subsets are reachable.
pub fn determinize(nfa: &Nfa, max_states: i64) -> Result<Table, String> {
    let n = nfa.edges.len();
    let mut cut = [false; 257];
    cut[0] = true;
    for &(lo, hi, _) in nfa.edges.iter().flatten() {
        cut[lo as usize] = true;
        cut[hi as usize + 1] = true;
    }
    let mut byte_class = [0u8; 256];
    let mut num_classes = 0usize;
    for (b, class) in byte_class.iter_mut().enumerate() {
        num_classes += cut[b] as usize;
        *class = (num_classes - 1) as u8;
    }
    let reads: Vec<bool> = (0..n)
        .map(|q| !nfa.edges[q].is_empty() || q == nfa.accept as usize)
        .collect();
    let mut closure = Closure {
        seen: vec![0; n],
        epoch: 0,
        stack: Vec::new(),
    };
    let first = closure.subset(nfa, &reads, &[nfa.start]);
    let mut index: FxHashMap<Vec<u32>, i32> = FxHashMap::default();
    index.insert(first.clone(), 0);
    let mut subsets = vec![first];
    let mut rows: Vec<i32> = Vec::new();
    let mut targets: Vec<Vec<u32>> = vec![Vec::new(); num_classes];
    let mut i = 0;
    while i < subsets.len() {
        targets.iter_mut().for_each(Vec::clear);
        for &q in &subsets[i] {
            for &(lo, hi, t) in &nfa.edges[q as usize] {
                let (c0, c1) = (byte_class[lo as usize], byte_class[hi as usize]);
                for c in c0..=c1 {
                    targets[c as usize].push(t);
                }
            }
        }
        for class_targets in &targets {
            let following = closure.subset(nfa, &reads, class_targets);
            if following.is_empty() {
                rows.push(DEAD);
                continue;
            }
            let id = match index.get(&following) {
                Some(&id) => id,
                None => {
                    if subsets.len() as i64 == max_states {
                        return Err(format!(
                            "the pattern's DFA has more than {max_states} states (max_states)"
                        ));
                    }
                    let id = subsets.len() as i32;
                    index.insert(following.clone(), id);
                    subsets.push(following);
                    id
                }
            };
            rows.push(id);
        }
        i += 1;
    }
    let accepting: Vec<bool> = subsets
        .iter()
        .map(|s| s.binary_search(&nfa.accept).is_ok())
        .collect();
    Ok(canonical(&byte_class, num_classes, &rows, &accepting, 0))
}

/// Hopcroft's partition refinement: the minimal DFA of `dfa`'s language, canonical.
pub fn minimize(dfa: &Table) -> Table {
    if dfa.start == DEAD {
        return dfa.clone();
    }
    let (n, k) = (dfa.num_states(), dfa.num_classes);
    let (sink, total) = (n, n + 1); // DEAD as an explicit state moving to itself
    let step = |q: usize, c: usize| -> usize {
        match q {
            q if q == sink => sink,
            q => match dfa.transitions[q * k + c] {
                DEAD => sink,
                t => t as usize,
            },
        }
    };
    // predecessors of (class c, state t): preds[offsets[c * total + t]..offsets[.. + 1]]
    let mut offsets = vec![0u32; k * total + 1];
    for q in 0..total {
        for c in 0..k {
            offsets[c * total + step(q, c) + 1] += 1;
        }
    }
    for i in 1..offsets.len() {
        offsets[i] += offsets[i - 1];
    }
    let mut fill = offsets.clone();
    let mut preds = vec![0u32; k * total];
    for q in 0..total {
        for c in 0..k {
            let slot = &mut fill[c * total + step(q, c)];
            preds[*slot as usize] = q as u32;
            *slot += 1;
        }
    }
    // the partition: `elems` grouped by block, block b is elems[start[b]..end[b]]
    let accepts = |q: usize| q != sink && dfa.accepting[q];
    let mut elems: Vec<u32> = (0..total as u32).filter(|&q| accepts(q as usize)).collect();
    let num_accepting = elems.len();
    elems.extend((0..total as u32).filter(|&q| !accepts(q as usize)));
    let (mut start, mut end) = (Vec::new(), Vec::new());
    let mut block_of = vec![0u32; total];
    for (lo, hi) in [(0, num_accepting), (num_accepting, total)] {
        if lo < hi {
            for &q in &elems[lo..hi] {
                block_of[q as usize] = start.len() as u32;
            }
            start.push(lo);
            end.push(hi);
        }
    }
    let mut pos = vec![0usize; total];
    for (p, &q) in elems.iter().enumerate() {
        pos[q as usize] = p;
    }
    let mut pending: Vec<usize> = (0..start.len()).collect();
    let mut is_pending = vec![true; start.len()];
    let mut marked = vec![0usize; start.len()];
    let (mut touched, mut splitter) = (Vec::new(), Vec::new());
    while let Some(a) = pending.pop() {
        is_pending[a] = false;
        splitter.clear();
        splitter.extend_from_slice(&elems[start[a]..end[a]]);
        for c in 0..k {
            touched.clear();
            for &t in &splitter {
                let key = c * total + t as usize;
                for &q in &preds[offsets[key] as usize..offsets[key + 1] as usize] {
                    let b = block_of[q as usize] as usize;
                    let (p, m) = (pos[q as usize], start[b] + marked[b]);
                    if p < m {
                        continue; // already marked
                    }
                    elems.swap(p, m);
                    pos[elems[p] as usize] = p;
                    pos[q as usize] = m;
                    marked[b] += 1;
                    if marked[b] == 1 {
                        touched.push(b);
                    }
                }
            }
            for &b in &touched {
                let (m, size) = (marked[b], end[b] - start[b]);
                marked[b] = 0;
                if m == size {
                    continue; // the whole block moves into the splitter: no split
                }
                let new = start.len();
                start.push(start[b]);
                end.push(start[b] + m);
                start[b] += m;
                for &q in &elems[start[new]..end[new]] {
                    block_of[q as usize] = new as u32;
                }
                marked.push(0);
                let smaller_new = m <= size - m;
                is_pending.push(is_pending[b] || smaller_new);
                if is_pending[b] || smaller_new {
                    pending.push(new); // both halves pending, or the new half is smaller
                } else {
                    is_pending[b] = true;
                    pending.push(b); // the rest of b is the smaller half
                }
            }
        }
    }
    let dead_block = block_of[sink];
    let mut rows = Vec::with_capacity(start.len() * k);
    let mut accepting = Vec::with_capacity(start.len());
    for &first in &start {
        let q = elems[first] as usize;
        for c in 0..k {
            let b = block_of[step(q, c)];
            rows.push(if b == dead_block { DEAD } else { b as i32 });
        }
        accepting.push(accepts(q));
    }
    let first_block = block_of[dfa.start as usize] as usize;
    canonical(&dfa.byte_class, k, &rows, &accepting, first_block)
}

/// The minimal DFA of the byte strings `a` accepts and `b` accepts (`subtract`: does not
/// accept). Err (the reference's message) once more than `max_states` pairs are reachable.
pub fn product(a: &Table, b: &Table, subtract: bool, max_states: i64) -> Result<Table, String> {
    if a.start == DEAD {
        return Ok(a.clone());
    }
    let mut class_of: FxHashMap<(u8, u8), u8> = FxHashMap::default();
    let mut classes: Vec<(u8, u8)> = Vec::new();
    let mut byte_class = [0u8; 256];
    for (byte, class) in byte_class.iter_mut().enumerate() {
        let pair = (a.byte_class[byte], b.byte_class[byte]);
        *class = *class_of.entry(pair).or_insert_with(|| {
            classes.push(pair);
            (classes.len() - 1) as u8
        });
    }
    let (ka, kb) = (a.num_classes, b.num_classes);
    let mut pairs = vec![(a.start, b.start)];
    let mut index: FxHashMap<(i32, i32), i32> = FxHashMap::default();
    index.insert(pairs[0], 0);
    let mut rows = Vec::new();
    let mut i = 0;
    while i < pairs.len() {
        let (qa, qb) = pairs[i];
        for &(ca, cb) in &classes {
            let ta = a.transitions[qa as usize * ka + ca as usize];
            let tb = match qb {
                DEAD => DEAD,
                qb => b.transitions[qb as usize * kb + cb as usize],
            };
            if ta == DEAD {
                rows.push(DEAD);
                continue;
            }
            let id = match index.get(&(ta, tb)) {
                Some(&id) => id,
                None => {
                    if pairs.len() as i64 == max_states {
                        return Err(format!("the product DFA has more than {max_states} states"));
                    }
                    let id = pairs.len() as i32;
                    index.insert((ta, tb), id);
                    pairs.push((ta, tb));
                    id
                }
            };
            rows.push(id);
        }
        i += 1;
    }
    let accepting: Vec<bool> = pairs
        .iter()
        .map(|&(qa, qb)| {
            let in_b = qb != DEAD && b.accepting[qb as usize];
            a.accepting[qa as usize] && (in_b != subtract)
        })
        .collect();
    let table = canonical(&byte_class, classes.len(), &rows, &accepting, 0);
    Ok(minimize(&table))
}

/// The canonical DFA of a transition table (`k` classes a row): trimmed to the states
/// that can reach an accepting one, numbered breadth-first from `start` with classes
/// tried by their first byte, classes whose columns agree merged (numbered by first byte).
pub fn canonical(
    byte_class: &[u8; 256],
    k: usize,
    rows: &[i32],
    accepting: &[bool],
    start: usize,
) -> Table {
    let n = accepting.len();
    let mut offsets = vec![0u32; n + 1];
    for &t in rows.iter().filter(|&&t| t != DEAD) {
        offsets[t as usize + 1] += 1;
    }
    for i in 1..=n {
        offsets[i] += offsets[i - 1];
    }
    let mut fill = offsets.clone();
    let mut preds = vec![0u32; offsets[n] as usize];
    for (i, &t) in rows.iter().enumerate() {
        if t != DEAD {
            preds[fill[t as usize] as usize] = (i / k) as u32;
            fill[t as usize] += 1;
        }
    }
    let mut live = accepting.to_vec();
    let mut stack: Vec<usize> = (0..n).filter(|&q| live[q]).collect();
    while let Some(t) = stack.pop() {
        for &q in &preds[offsets[t] as usize..offsets[t + 1] as usize] {
            if !live[q as usize] {
                live[q as usize] = true;
                stack.push(q as usize);
            }
        }
    }
    if !live[start] {
        return Table::empty();
    }
    let mut by_first_byte: Vec<usize> = Vec::new();
    let mut listed = vec![false; k];
    for &c in byte_class {
        if !listed[c as usize] {
            listed[c as usize] = true;
            by_first_byte.push(c as usize);
        }
    }
    let mut number = vec![DEAD; n];
    number[start] = 0;
    let mut order = vec![start];
    let mut i = 0;
    while i < order.len() {
        let q = order[i];
        for &c in &by_first_byte {
            let t = rows[q * k + c];
            if t != DEAD && live[t as usize] && number[t as usize] == DEAD {
                number[t as usize] = order.len() as i32;
                order.push(t as usize);
            }
        }
        i += 1;
    }
    let renumber = |q: usize, c: usize| match rows[q * k + c] {
        DEAD => DEAD,
        t => number[t as usize], // DEAD for a state that cannot accept
    };
    let mut columns: FxHashMap<Vec<i32>, u8> = FxHashMap::default();
    let mut kept: Vec<usize> = Vec::new(); // a class of each merged column
    let mut new_class = vec![0u8; k];
    for &c in &by_first_byte {
        let column: Vec<i32> = order.iter().map(|&q| renumber(q, c)).collect();
        let next = columns.len() as u8;
        new_class[c] = *columns.entry(column).or_insert_with(|| {
            kept.push(c);
            next
        });
    }
    let mut transitions = Vec::with_capacity(order.len() * kept.len());
    for &q in &order {
        transitions.extend(kept.iter().map(|&c| renumber(q, c)));
    }
    Table {
        byte_class: byte_class.map(|c| new_class[c as usize]),
        num_classes: kept.len(),
        transitions,
        accepting: order.iter().map(|&q| accepting[q]).collect(),
        start: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The NFA of `ab|cb`: two chains from one start into one accept state.
    fn ab_or_cb() -> Nfa {
        // 0 -ε-> 1, 0 -ε-> 3; 1 -a-> 2 -b-> 5; 3 -c-> 4 -b-> 5
        Nfa {
            start: 0,
            accept: 5,
            edges: vec![
                vec![],
                vec![(b'a', b'a', 2)],
                vec![(b'b', b'b', 5)],
                vec![(b'c', b'c', 4)],
                vec![(b'b', b'b', 5)],
                vec![],
            ],
            epsilons: vec![vec![1, 3], vec![], vec![], vec![], vec![], vec![]],
        }
    }

    fn accepts(t: &Table, text: &[u8]) -> bool {
        let mut q = t.start;
        for &b in text {
            if q == DEAD {
                return false;
            }
            q = t.transitions[q as usize * t.num_classes + t.byte_class[b as usize] as usize];
        }
        q != DEAD && t.accepting[q as usize]
    }

    #[test]
    fn subsets_then_minimal() {
        let subsets = determinize(&ab_or_cb(), 100).unwrap();
        assert_eq!(subsets.num_states(), 4); // start, after a, after c, after b
        let minimal = minimize(&subsets);
        assert_eq!(minimal.num_states(), 3);
        assert_eq!(minimal.num_classes, 3); // [ac], b, the rest
        assert_eq!(
            minimal.byte_class[b'a' as usize],
            minimal.byte_class[b'c' as usize]
        );
        for (text, yes) in [
            (&b"ab"[..], true),
            (b"cb", true),
            (b"bb", false),
            (b"a", false),
        ] {
            assert_eq!(accepts(&minimal, text), yes);
        }
        assert!(determinize(&ab_or_cb(), 3).is_err());
    }

    #[test]
    fn utf8_sequences_of_greek_and_a_tree() {
        let mut out = Vec::new();
        utf8_sequences(0x3B1, 0x3C9, &mut out); // α-ω
        assert_eq!(
            out,
            vec![
                vec![(0xCE, 0xCE), (0xB1, 0xBF)],
                vec![(0xCF, 0xCF), (0x80, 0x89)]
            ]
        );
        out.clear();
        utf8_sequences(0xD000, 0xE000, &mut out); // around the surrogates
        assert!(out
            .iter()
            .all(|s| s.len() == 3 && s[0].0 != 0xED || s[1].1 < 0xA0));
        // [ac]b+ as a tree: chars, then a repetition
        let tree = Node::decode(&[1, 2, 0, 2, 97, 97, 99, 99, 3, 1, -1, 0, 1, 98, 98]).unwrap();
        let dfa = minimize(&determinize(&build_nfa(&tree, 100).unwrap(), 100).unwrap());
        for (text, yes) in [
            (&b"ab"[..], true),
            (b"cbbb", true),
            (b"a", false),
            (b"bb", false),
        ] {
            assert_eq!(accepts(&dfa, text), yes);
        }
        assert!(build_nfa(&tree, 3).is_err());
        assert!(Node::decode(&[3, 2, 1, 0, 0]).is_err());
    }

    #[test]
    fn products() {
        let m = minimize(&determinize(&ab_or_cb(), 100).unwrap());
        let both = product(&m, &m, false, 100).unwrap();
        assert_eq!(both, m);
        let none = product(&m, &m, true, 100).unwrap();
        assert_eq!(none, Table::empty());
    }
}
