"""The engine tests' tiny random Llama, shared with the P/D tests."""

from tests.engine.conftest import tiny_llm_dir  # noqa: F401
