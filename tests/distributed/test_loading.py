"""A rank's share read from the checkpoint (`loading.load_share`) equals the whole model
loaded then cut (`shard_model`), exactly, for every family the parallel tests split and
for every rank of TP=2 and TP=2 x PP=2; reading it (TP=2, PP=2, TP=2 x PP=2) touches no
more bytes of the files than the share's, never a whole tensor of a split parameter; a
faulty checkpoint is named as the whole load names it."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
safetensors = pytest.importorskip("safetensors")

from pyagent_ref.distributed.loading import _runs, load_share  # noqa: E402
from pyagent_ref.distributed.model import DistributedModel  # noqa: E402
from pyagent_ref.distributed.parallel import ParallelContext, check_parallel_sizes  # noqa: E402
from pyagent_ref.model import load_model  # noqa: E402
from tests.distributed.test_parallel_models import _builders  # noqa: E402
from tests.tiny import TINY_LLAMA  # noqa: E402

SIZES = [(2, 1), (1, 2), (2, 2)]  # (tp, pp)


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    dirs = {}
    for family, build in _builders().items():
        path = tmp_path_factory.mktemp(family)
        build(family).save_pretrained(path)
        dirs[family] = path
    return dirs


def _contexts(tp: int, pp: int) -> list[ParallelContext]:
    """Every rank's context (no process group: loading runs no collective)."""
    return [ParallelContext(r % tp, tp, r // tp, pp) for r in range(tp * pp)]


def _state(model) -> dict[str, torch.Tensor]:
    return dict(model.named_parameters())


@pytest.mark.parametrize("family", sorted(_builders()))
def test_the_share_read_equals_the_whole_model_cut(model_dirs, family):
    path = model_dirs[family]
    whole = load_model(path, progress=False)
    for tp, pp in [(2, 1), (2, 2)]:  # PP alone cuts nothing (the bytes test reads it)
        try:
            check_parallel_sizes(whole.config, tp, pp)
        except ValueError:
            continue  # BERT is not cut into stages
        for ctx in _contexts(tp, pp):
            cut = DistributedModel(load_model(path, progress=False), ctx).model
            read = load_share(path, ctx, progress=False)
            want, got = _state(cut), _state(read)
            assert got.keys() == want.keys(), (tp, pp, ctx)
            for name, param in want.items():
                assert got[name].dtype == param.dtype and torch.equal(got[name], param), (
                    f"{family} tp={tp} pp={pp} rank ({ctx.tp_rank}, {ctx.pp_rank}): {name}"
                )
            assert type(read.embed_tokens) is type(cut.embed_tokens)
            for a, b in zip(read.layers, cut.layers, strict=True):
                assert type(a) is type(b)
                assert type(getattr(a, "mlp", None)) is type(getattr(b, "mlp", None))


class _Counting:
    """safetensors.safe_open, counting the bytes of every tensor it hands out (whole or
    sliced) and remembering the largest single read."""

    read = 0
    largest = 0
    open = staticmethod(safetensors.safe_open)

    def __init__(self, path, framework, **kwargs):
        self.inner = _Counting.open(path, framework=framework, **kwargs)

    def __enter__(self):
        self.handle = self.inner.__enter__()
        return self

    def __exit__(self, *exc):
        return self.inner.__exit__(*exc)

    def keys(self):
        return self.handle.keys()

    @staticmethod
    def _count(tensor):
        size = tensor.numel() * tensor.element_size()
        _Counting.read += size
        _Counting.largest = max(_Counting.largest, size)
        return tensor

    def get_tensor(self, name):
        return self._count(self.handle.get_tensor(name))

    def get_slice(self, name):
        inner = self.handle.get_slice(name)

        class Slice:
            def get_shape(self):
                return inner.get_shape()

            def __getitem__(self, index):
                return _Counting._count(inner[index])

        return Slice()


def test_a_rank_reads_about_its_share_of_the_checkpoint(tmp_path, monkeypatch):
    torch.manual_seed(0)
    sizes = TINY_LLAMA | dict(vocab_size=1024, hidden_size=128, intermediate_size=512)
    transformers.LlamaForCausalLM(transformers.LlamaConfig(**sizes)).save_pretrained(tmp_path)
    with safetensors.safe_open(tmp_path / "model.safetensors", framework="pt") as f:
        tensors = {name: f.get_tensor(name) for name in f.keys()}
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    biggest = max(t.numel() * t.element_size() for t in tensors.values())
    monkeypatch.setattr(safetensors, "safe_open", _Counting)

    _Counting.read = _Counting.largest = 0
    load_model(tmp_path, progress=False)
    assert _Counting.read == total  # the counter sees every byte of a whole load

    for tp, pp in SIZES:
        for ctx in _contexts(tp, pp):
            _Counting.read = _Counting.largest = 0
            share = load_share(tmp_path, ctx, progress=False)
            # no byte beyond the share's own parameters (the vocabulary's padding rows
            # are not read): the layers of the other stages are not read at all
            held = sum(p.numel() * p.element_size() for p in share.parameters())
            assert held - 128 * 4 <= _Counting.read <= held < 0.75 * total, (tp, pp, ctx)
            if tp > 1:  # a split tensor is read in part, never whole
                assert _Counting.largest <= biggest // tp


def test_runs_cover_the_index_in_order():
    assert _runs([0, 1, 2, 5, 6, 9]) == [(0, 3), (5, 7), (9, 10)]
    assert _runs([4]) == [(4, 5)]
    assert _runs([]) == []


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda t: t.pop("model.layers.1.mlp.up_proj.weight"), "checkpoint lacks 1 tensors"),
        (
            lambda t: t.update({"model.layers.0.self_attn.k_proj.weight": torch.zeros(8, 64)}),
            r"'model.layers.0.self_attn.k_proj.weight' has shape \(8, 64\), expected \(32, 64\)",
        ),
        (
            lambda t: t.update(
                {"model.embed_tokens.weight": torch.zeros(97, 64, dtype=torch.int32)}
            ),
            "has dtype torch.int32, expected a floating-point dtype",
        ),
        (lambda t: t.update({"model.extra.weight": torch.zeros(2)}), "has no place"),
    ],
)
def test_a_faulty_checkpoint_is_named_as_the_whole_load_names_it(tmp_path, change, message):
    from safetensors.torch import load_file, save_file

    torch.manual_seed(0)
    transformers.LlamaForCausalLM(transformers.LlamaConfig(**TINY_LLAMA)).save_pretrained(tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    change(tensors)
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=message):
        load_model(tmp_path, progress=False)
    for ctx in _contexts(2, 1):  # (a stage would not miss another stage's layer)
        with pytest.raises(ValueError, match=message):
            load_share(tmp_path, ctx, progress=False)
