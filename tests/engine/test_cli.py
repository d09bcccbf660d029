"""The `pyagent` command on the embedded default model."""

from __future__ import annotations

import re
import shutil

import pytest

pytest.importorskip("torch")

from pyagent_ref.cli import main  # noqa: E402
from pyagent_ref.engine.llm import LLM  # noqa: E402
from pyagent_ref.sample.params import SamplingParams  # noqa: E402


def test_generate_prints_the_prompt_and_its_greedy_continuation(capsys):
    assert main(["generate", "import os\n", "--max-tokens", "12", "--ops", "ref"]) == 0
    printed = capsys.readouterr().out
    expected = LLM(ops="ref").generate("import os\n", SamplingParams(temperature=0, max_tokens=12))
    assert printed == "import os\n" + expected[0].outputs[0].text + "\n"


def test_engine_options_reach_the_engine_and_bad_ones_exit_2(capsys):
    assert main(["generate", "def ", "--max-tokens", "4", "--enforce-eager"]) == 0
    with pytest.raises(SystemExit) as exc:
        main(["generate", "def ", "--compile", "fastest"])
    assert exc.value.code == 2
    assert "compile must be a bool or a torch.compile backend name" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("name", "corrupt"),
    [
        ("config.json", lambda data: data[: len(data) // 2]),
        ("model.safetensors", lambda data: data[:-64]),
    ],
    ids=["corrupt config.json", "truncated model.safetensors"],
)
def test_a_corrupt_model_file_is_named_and_exits_2(tiny_llm_dir, tmp_path, capsys, name, corrupt):
    model_dir = shutil.copytree(tiny_llm_dir[1], tmp_path / "model")
    (model_dir / name).write_bytes(corrupt((model_dir / name).read_bytes()))
    with pytest.raises(SystemExit) as exc:
        main(["generate", "def ", "--model", str(model_dir), "--max-tokens", "1"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"pyagent: error: {model_dir / name} is not ")
    assert "Traceback" not in err


def test_demo_reports_the_engine_step_totals(capsys):
    args = ["demo", "--requests", "4", "--max-tokens", "4", "--show", "0", "--ops", "ref"]
    assert main([*args, "accel"]) == 0
    out = capsys.readouterr().out
    assert "drew the same tokens for every request: True" in out
    steps = re.findall(
        r"steps (\d+): [\d.]+ tokens/step \((\d+) prefill, (\d+) decode\), up to (\d+) running",
        out,
    )
    assert len(steps) == 2
    for num_steps, prefill, decode, running in steps:
        # 4 requests of at most 4 tokens: the prefill draws each one's first token
        assert 0 < int(decode) <= 12 and int(prefill) > 0 and 1 <= int(running) <= 4
        assert int(num_steps) >= 2


def test_kv_offload_option_reaches_the_engine_and_bad_ones_exit_2(capsys):
    args = ["generate", "import os\n", "--max-tokens", "6", "--ops", "ref"]
    assert main(args) == 0
    plain = capsys.readouterr().out
    assert main([*args, "--kv-offload", '{"cpu_blocks": 32}']) == 0
    assert capsys.readouterr().out == plain
    for bad, message in [
        ('{"cpu_blocks": 0}', "pyagent: error: kv_offload.cpu_blocks must be >= 1, got 0"),
        ("cpu:32", "argument --kv-offload: not JSON"),
    ]:
        with pytest.raises(SystemExit) as exc:
            main([*args, "--kv-offload", bad])
        assert exc.value.code == 2
        assert message in capsys.readouterr().err


def test_every_engine_option_is_a_flag_documented_by_engine_config(capsys):
    from dataclasses import fields

    from pyagent_ref.cli import _field_help
    from pyagent_ref.engine.core import EngineConfig

    docs = _field_help()
    assert {f.name for f in fields(EngineConfig)} <= set(docs), "undocumented EngineConfig field"
    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    help_text = capsys.readouterr().out
    for f in fields(EngineConfig):
        if f.name not in ("model", "ops"):
            assert "--" + f.name.replace("_", "-") in help_text


def test_engine_flags_are_checked_by_engine_config(capsys):
    args = ["generate", "def ", "--max-tokens", "3", "--ops", "ref"]
    assert main([*args, "--max-num-seqs", "2", "--no-enable-prefix-caching"]) == 0
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        main([*args, "--max-num-seqs", "0"])
    assert exc.value.code == 2
    assert "pyagent: error: max_num_seqs must be an int >= 1, got 0" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main([*args, "--eviction", "mru"])
    assert "eviction must be one of ('lru', 'arc'), got 'mru'" in capsys.readouterr().err
