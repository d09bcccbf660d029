"""pyagent_ref: the readable reference implementation of an LLM inference engine.

`pyagent_ref.ops` holds the stateless array functions that form the conformance
surface; `pyagent_accel` mirrors them in Rust and `conformance` checks both.
"""

__version__ = "0.1.0"
