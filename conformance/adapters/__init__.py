"""Adapters: third-party implementations behind the pyagent op signatures.

An adapter is a module with one attribute per ops module it covers (`sampling`, ...),
each an object whose attributes are op functions with the reference's names and
signatures (numpy or torch arrays in, the input's library out). Ops it lacks are simply
absent; it may say why in `CONFORMANCE_MISSING = {"module.op" or "module.*": reason}`.
Run the suite on it with `python -m conformance <adapter module>`; where it knowingly
differs from the specification, record it in `conformance.divergences`.

- `hf_transformers`: Hugging Face transformers' logits processors.
"""
