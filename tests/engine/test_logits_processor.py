"""Custom logits processors through the engine: applied to the batch, told of batch
changes, checked at admission, loaded from import paths."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from pyagent_ref.engine.core import EngineConfig  # noqa: E402
from pyagent_ref.engine.llm import LLM  # noqa: E402
from pyagent_ref.sample.logits_processor import (  # noqa: E402
    LogitsProcessor,
    load_logits_processors,
)
from pyagent_ref.sample.params import SamplingParams  # noqa: E402


class BanUntil(LogitsProcessor):
    """extra_args={"ban": [ids], "until": n}: the ids cannot be drawn before output n."""

    events: list = []  # noqa: RUF012 - the test reads what every instance heard

    @classmethod
    def validate_params(cls, params):
        args = params.extra_args or {}
        if "ban" in args and not isinstance(args.get("until"), int):
            raise ValueError(f"extra_args['until'] must be an int, got {args.get('until')!r}")

    def update_state(self, batch_update):
        self.events.append(([rid for rid, _, _ in batch_update.added], batch_update.removed))

    def apply(self, logits, rows):
        for i, row in enumerate(rows):
            args = row.params.extra_args or {}
            if "ban" in args and len(row.output_token_ids) < args["until"]:
                logits[i, args["ban"]] = float("-inf")
        return logits


def test_the_processor_rewrites_its_requests_rows_only(tiny_llm_dir):
    path = tiny_llm_dir[1]
    plain = LLM(path).generate(
        "Hello", SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    )
    first = plain[0].outputs[0].token_ids
    llm = LLM(path, logits_processors=[BanUntil])
    banned = SamplingParams(
        temperature=0, max_tokens=6, ignore_eos=True, extra_args={"ban": first[:3], "until": 4}
    )
    free = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    BanUntil.events.clear()
    outs = llm.generate(["Hello", "Hello"], [banned, free])
    got = outs[0].outputs[0].token_ids
    assert not set(got[:4]) & set(first[:3])
    assert outs[1].outputs[0].token_ids == first  # the other request is untouched
    llm.generate("x", SamplingParams(max_tokens=1))  # the next step hears who left
    added = [rid for a, _ in BanUntil.events for rid in a][:2]
    removed = [rid for _, r in BanUntil.events for rid in r][:2]
    assert sorted(added) == sorted(removed) == sorted([outs[0].request_id, outs[1].request_id])


def test_bad_extra_args_are_refused_at_admission(tiny_llm_dir):
    llm = LLM(tiny_llm_dir[1], logits_processors=["tests.engine.test_logits_processor:BanUntil"])
    with pytest.raises(ValueError, match=r"extra_args\['until'\] must be an int, got None"):
        llm.generate("x", SamplingParams(extra_args={"ban": [1]}))
    assert not llm.core.has_unfinished_requests()


def test_entries_must_be_processor_classes():
    assert load_logits_processors(["tests.engine.test_logits_processor.BanUntil"]) == [BanUntil]
    with pytest.raises(TypeError, match="LogitsProcessor subclasses or their import paths"):
        load_logits_processors([dict])
    with pytest.raises(ValueError, match="'no_such_module:X' does not import"):
        load_logits_processors(["no_such_module:X"])
    with pytest.raises(ValueError, match="logits_processors must be a tuple"):
        EngineConfig(logits_processors=[3])
    with pytest.raises(TypeError, match="extra_args must be None or a dict, got 3"):
        SamplingParams(extra_args=3)


def test_a_processor_without_apply_is_refused_when_the_engine_is_built(tiny_llm_dir):
    class NoApply(LogitsProcessor):
        pass

    with pytest.raises(TypeError, match="NoApply"):
        LLM(tiny_llm_dir[1], logits_processors=[NoApply])
