//! `pyagent_accel.structured`: the token-level stage of structured output in Rust, the
//! twin of `pyagent_ref.structured`'s `EarleyParser`, `TokenTrie` and `GrammarMatcher`
//! (same results: the tests compare masks bit for bit).
//!
//! A grammar arrives as flat tables (`tables`: rules as symbol arrays, each lexeme a
//! byte DFA) built once in Python from a reference `Grammar`. `earley` reads bytes with
//! undo over flat arenas; `trie` lays the vocabulary out in preorder; `walk` computes a
//! mask by following the trie with the lexemes in progress (one DFA step per node) and
//! handing a node to the Earley parser only where a lexeme can end, with the part that
//! depends only on the lexemes cached per vocabulary; `matcher` is one output's state
//! (accept, rollback, jump-forward); `bindings` are the `_native` classes.

pub mod automata;
mod bindings;
pub mod earley;
pub mod matcher;
pub mod tables;
pub mod trie;
pub mod walk;

pub use bindings::register;
