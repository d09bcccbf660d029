"""Names vulture reports as unused that are used, by something it cannot see.

`nox -s lint` passes this file to vulture with the sources; each entry says who uses it.
"""

# ruff: noqa: B018, F821 - bare names are how vulture whitelists work

# pytest and hypothesis call these by name.
pytest_addoption
pytest_report_header
pytest_generate_tests
pytest_configure
_.__qualname__  # conformance.core names the hypothesis test after the property
_._hypothesis_internal_add_digest  # hypothesis reads it to tell tests apart

# HF transformers reads these from the objects the adapter hands it.
_.attention_scaling

# Public dataclass fields: users and the server's metrics read them.
_.queued_s
_.e2e
_.parent_block_hash
_.mean_residency_s
_.max_residency_s
_.prefix_hit_rate
_.tags  # jinja2 reads an extension's tags
_.post_processor  # HF tokenizers reads it
_.pre_tokenizer  # HF tokenizers reads it
_.__signature__  # inspect.signature reads it (accel wrappers carry the reference's)
_._attn_implementation  # HF transformers reads it
_._experts_implementation  # HF transformers reads it (the MoE adapter sets it)
_.normalizer  # HF tokenizers reads it
_.encode_special_tokens  # HF tokenizers reads it (conformance/adapters/hf_tokenizers.py)
pytestmark  # pytest reads it

# OpenAI's request and response fields: pydantic parses and serializes them.
_.user
_.description
_.owned_by
annotations  # a Responses API output_text field
created_at  # a Responses API response field
document  # a rerank result field (Jina's and Cohere's shape)
relevance_score  # a rerank result field
_.should_exit  # uvicorn's server loop reads it
_.binary_location  # selenium hands it to chromedriver (tests/server/test_playground.py)
_.json_object  # StructuredOutputsParams field, read through getattr (kind)
_.do_POST  # http.server calls it (tests/observe/test_tracing.py's OTLP collector)
_.log_message  # http.server calls it (the same collector, kept quiet)
