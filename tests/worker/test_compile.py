"""torch.compile of the model forward: same tokens, and a decode step is one graph."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from pyagent_ref.model import AttentionMetadata  # noqa: E402
from pyagent_ref.ops import load as load_ops  # noqa: E402
from pyagent_ref.worker.model_runner import ModelRunner  # noqa: E402
from tests.worker.helpers import generate, make_engine, tiny_model  # noqa: E402

# array_api_compat memoises its namespace lookups; dynamo traces through them and says so
pytestmark = pytest.mark.filterwarnings("ignore:Dynamo detected a call to a .functools.lru_cache")


def test_compiled_engine_draws_the_eager_tokens(tiny_hf):
    # aot_eager traces and partitions like inductor without its C++ compile time
    _, path = tiny_hf
    compiled = make_engine(path, compile="aot_eager")
    assert compiled.runner.forward is not compiled.runner.model.forward
    assert generate(compiled) == generate(make_engine(path))


def test_a_decode_step_compiles_to_one_graph():
    model = tiny_model()
    cache = model.kv_cache_shape(8, 4)
    kv = [(torch.zeros(cache), torch.zeros(cache)) for _ in range(2)]
    meta = AttentionMetadata(
        slot_mapping=torch.tensor([5, 9, -1]),
        block_table=torch.tensor([[1, 0], [2, 3], [0, 0]]),
        query_start_loc=torch.tensor([0, 1, 2, 3]),
        seq_lens=torch.tensor([2, 6, 0]),
        decode_only=True,
    )
    ids = torch.tensor([3, 4, 0])
    explained = torch._dynamo.explain(model.forward)(ids, torch.tensor([1, 5, 0]), meta, kv)
    assert explained.graph_break_count == 0, explained.break_reasons
    assert explained.graph_count == 1


def test_an_unknown_backend_is_rejected():
    with pytest.raises(ValueError, match="compile must be .* got 'fastest'"):
        ModelRunner(tiny_model(), 6, 4, load_ops("ref"), compile="fastest")
