"""pyagent_accel: Rust implementations of `pyagent_ref.ops`, same names and results.

`pyagent_accel.ops` mirrors `pyagent_ref.ops` module by module (`sampling`, `hashing`,
`block_table`, `layers`, `rope`, `attention`): same function names, signatures, results
and exception classes, for numpy arrays and torch CPU tensors. Select it with
`pyagent_ref.ops.load("accel")` (or "auto"), or import `pyagent_accel.ops` directly.
`pyagent_accel.tokenize.bpe` is the Rust twin of the reference byte-level BPE, and
`pyagent_accel.structured` of the reference's token-level structured output (Earley
parser, token trie, `GrammarMatcher`: the same masks).
"""

__version__ = "0.1.0"
