//! One output's matcher (contract: `pyagent_ref.structured.matcher.GrammarMatcher`):
//! the parser holding the bytes of the tokens accepted so far, the vocabulary's trie,
//! and the EOS ids. Argument checks (ids in range, rollback counts) are the binding's.

use std::sync::Arc;

use super::earley::{Parser, TooManyItems};
use super::trie::Trie;
use super::walk::Walker;

/// The most bytes `jump_forward_bytes` returns (`MAX_JUMP_FORWARD_BYTES`).
pub const MAX_JUMP_FORWARD_BYTES: usize = 4096;

#[derive(Debug)]
pub struct Matcher {
    parser: Parser,
    trie: Arc<Trie>,
    /// Without repeats, in the order given.
    eos: Vec<u32>,
    /// The bytes of each accepted token (EOS: 0).
    lengths: Vec<usize>,
    terminated: bool,
    walker: Walker,
}

impl Clone for Matcher {
    fn clone(&self) -> Matcher {
        Matcher {
            parser: self.parser.clone(),
            trie: self.trie.clone(),
            eos: self.eos.clone(),
            lengths: self.lengths.clone(),
            terminated: self.terminated,
            walker: Walker::default(),
        }
    }
}

impl Matcher {
    /// `eos` ids must be below the trie's vocab size.
    pub fn new(parser: Parser, trie: Arc<Trie>, eos: &[u32]) -> Matcher {
        let mut unique = Vec::with_capacity(eos.len());
        for &id in eos {
            if !unique.contains(&id) {
                unique.push(id);
            }
        }
        Matcher {
            parser,
            trie,
            eos: unique,
            lengths: Vec::new(),
            terminated: false,
            walker: Walker::default(),
        }
    }

    pub fn trie(&self) -> &Arc<Trie> {
        &self.trie
    }

    pub fn is_terminated(&self) -> bool {
        self.terminated
    }

    pub fn num_accepted_tokens(&self) -> usize {
        self.lengths.len()
    }

    /// Advance by one token (`token < vocab_size`); false, and no change, if the grammar
    /// does not allow it. EOS is taken where the bytes so far are a sentence, and ends the
    /// output; a token without bytes that is no EOS is refused.
    pub fn accept_token(&mut self, token: u32) -> Result<bool, TooManyItems> {
        if self.terminated {
            return Ok(false);
        }
        if self.eos.contains(&token) {
            if !self.parser.is_accepting() {
                return Ok(false);
            }
            self.terminated = true;
            self.lengths.push(0);
            return Ok(true);
        }
        let Some(bytes) = self.trie.token_bytes[token as usize].as_deref() else {
            return Ok(false);
        };
        if bytes.is_empty() {
            return Ok(false);
        }
        let base = self.parser.num_bytes();
        for &byte in bytes {
            match self.parser.push(byte) {
                Ok(true) => {}
                refused => {
                    self.parser.truncate(base);
                    return refused;
                }
            }
        }
        self.lengths.push(bytes.len());
        Ok(true)
    }

    /// Undo the last `n` accepted tokens (`n <= num_accepted_tokens()`).
    pub fn rollback(&mut self, n: usize) {
        for _ in 0..n {
            let Some(length) = self.lengths.pop() else {
                return;
            };
            if self.terminated {
                self.terminated = false; // the last accepted token was the EOS
            } else {
                self.parser.pop(length);
            }
        }
    }

    /// Write the allowed next tokens into `words` (at least `ceil(vocab_size / 32)`
    /// words; bit `i % 32` of word `i / 32` for token i), clearing every other bit.
    pub fn fill_bitmask(&mut self, words: &mut [u32]) -> Result<(), TooManyItems> {
        words.fill(0);
        self.walker.stepped = 0;
        if self.terminated {
            return Ok(());
        }
        self.walker.fill(&mut self.parser, &self.trie, words)?;
        if self.parser.is_accepting() {
            for &id in &self.eos {
                words[(id >> 5) as usize] |= 1 << (id & 31);
            }
        }
        Ok(())
    }

    /// The trie nodes the last `fill_bitmask` stepped a DFA at (0 once terminated): a
    /// measure of its work, for benchmarks.
    pub fn last_mask_nodes(&self) -> usize {
        self.walker.stepped
    }

    /// The allowed next tokens, in increasing order.
    pub fn allowed_tokens(&mut self) -> Result<Vec<u32>, TooManyItems> {
        let mut words = vec![0u32; self.trie.vocab_size().div_ceil(32)];
        self.fill_bitmask(&mut words)?;
        let mut ids = Vec::new();
        for (w, &word) in words.iter().enumerate() {
            let mut bits = word;
            while bits != 0 {
                ids.push(32 * w as u32 + bits.trailing_zeros());
                bits &= bits - 1;
            }
        }
        Ok(ids)
    }

    /// The bytes the grammar forces next: the longest run of bytes each the only one the
    /// parser takes, stopping where the bytes so far are a sentence or after
    /// `MAX_JUMP_FORWARD_BYTES`. Empty once terminated; the matcher is left unchanged.
    pub fn jump_forward_bytes(&mut self) -> Result<Vec<u8>, TooManyItems> {
        let mut forced = Vec::new();
        if self.terminated {
            return Ok(forced);
        }
        let base = self.parser.num_bytes();
        let mut result = Ok(());
        while forced.len() < MAX_JUMP_FORWARD_BYTES && !self.parser.is_accepting() {
            let mut viable = (0..=255u8).filter(|&b| self.parser.can_push(b));
            let (Some(only), None) = (viable.next(), viable.next()) else {
                break;
            };
            match self.parser.push(only) {
                Ok(true) => forced.push(only),
                Ok(false) => break, // cannot happen: can_push said it survives
                Err(err) => {
                    result = Err(err);
                    break;
                }
            }
        }
        self.parser.truncate(base);
        result.map(|()| forced)
    }
}
