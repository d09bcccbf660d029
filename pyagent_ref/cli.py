"""The `pyagent` command: `pyagent generate "prompt"`, `pyagent demo` and `pyagent serve`."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
import typing

from .engine.core import EngineConfig
from .engine.llm import LLM
from .model.pooling import POOLING_TYPES
from .sample.params import SamplingParams

DEMO_PREFIX = (
    "# A small library of helpers for reading configuration files.\n"
    "import os\nimport sys\nimport json\n\n\n"
)
DEMO_TAILS = [
    "def load_config(path):\n",
    "def read_json(path):\n",
    "class Config:\n",
    "def parse_args(argv):\n",
    "def main():\n",
    "def merge(a, b):\n",
    "def find_files(root, pattern):\n",
    "def write_config(path, data):\n",
]


def _sampling(args: argparse.Namespace) -> SamplingParams:
    return SamplingParams(
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        min_p=args.min_p,
        max_tokens=args.max_tokens,
        seed=args.seed,
        stop=args.stop or [],
        repetition_penalty=args.repetition_penalty,
    )


def _json_object(text: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON ({exc}): {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"a JSON object is needed, got {text!r}")
    return value


# EngineConfig fields that are not engine flags: the model and the ops have their own
# flags in each command (`demo --ops` takes a list).
_NOT_ENGINE_FLAGS = ("model", "ops")


def _engine_fields() -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(EngineConfig) if f.name not in _NOT_ENGINE_FLAGS]


def _field_help() -> dict[str, str]:
    """{field: its entry in EngineConfig's docstring} (`name: text`, continued on the
    more indented lines below)."""
    docs: dict[str, str] = {}
    name = None
    for line in (EngineConfig.__doc__ or "").splitlines():
        head, sep, text = line.strip().partition(": ")
        if sep and line.startswith("    ") and not line.startswith("     ") and head.isidentifier():
            name, docs[head] = head, text
        elif name and line.strip():
            docs[name] += " " + line.strip()
        else:
            name = None
    return docs


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    """One flag per `EngineConfig` field (`max_num_seqs` is --max-num-seqs): the type, the
    default and the help come from EngineConfig, which also checks the values."""
    group = parser.add_argument_group("engine options (EngineConfig)")
    docs, hints = _field_help(), typing.get_type_hints(EngineConfig)
    for field in _engine_fields():
        kind, flag = hints[field.name], "--" + field.name.replace("_", "-")
        default = field.default_factory() if callable(field.default_factory) else field.default
        options: dict = {"default": None, "help": f"{docs[field.name]} (default: {default})"}
        if kind is bool:
            options["action"] = argparse.BooleanOptionalAction
        elif kind == bool | str:  # compile: bare flag for True, or a backend name
            options.update(nargs="?", const=True, metavar="BACKEND")
        elif kind == tuple[int, ...]:
            options.update(nargs="+", type=int)
        elif kind == tuple[type | str, ...]:  # classes, given by their import paths
            options.update(nargs="+", metavar="MODULE:CLASS")
        elif int in typing.get_args(kind) or kind is int:
            options["type"] = int
        elif dict in typing.get_args(kind):
            options.update(type=_json_object, metavar="JSON")
        group.add_argument(flag, **options)


def _engine_args(args: argparse.Namespace) -> dict:
    """The engine flags the user gave, as EngineConfig keyword arguments."""
    given = {f.name: getattr(args, f.name) for f in _engine_fields()}
    return {
        name: tuple(value) if isinstance(value, list) else value
        for name, value in given.items()
        if value is not None
    }


def cmd_generate(args: argparse.Namespace) -> int:
    llm = LLM(args.model, ops=args.ops, **_engine_args(args))
    out = llm.generate(args.prompt, _sampling(args))[0]
    sys.stdout.write(args.prompt + out.outputs[0].text + "\n")
    return 0


def _percentiles(values: list[float]) -> str:
    if not values:
        return "n/a"
    values = sorted(values)
    pick = lambda q: values[min(len(values) - 1, int(q * len(values)))] * 1e3  # noqa: E731
    return f"p50 {pick(0.5):7.1f} ms  p90 {pick(0.9):7.1f} ms  p99 {pick(0.99):7.1f} ms"


def _steps_line(stats) -> str:
    """The engine's step totals (`EngineStats`) in one line."""
    per_step = stats.scheduled_tokens / stats.steps if stats.steps else 0.0
    line = (
        f"steps {stats.steps}: {per_step:.1f} tokens/step ({stats.prefill_tokens} prefill, "
        f"{stats.decode_tokens} decode), up to {stats.max_running} running, "
        f"{stats.preemptions} preemptions, peak KV usage {stats.max_kv_usage:.0%}"
    )
    spec = stats.spec
    if spec.num_draft_tokens:
        line += (
            f"; speculative drafts {spec.num_accepted_tokens}/{spec.num_draft_tokens} "
            f"accepted ({spec.acceptance_rate:.0%}), {spec.mean_accepted_length:.2f} "
            "tokens per verifying step"
        )
    return line


def run_demo(
    ops: str,
    num_requests: int,
    max_tokens: int,
    model: str | None,
    show: int,
    engine_args: dict | None = None,
) -> dict:
    """Serve `num_requests` concurrent requests sharing a prefix; return the figures."""
    llm = LLM(model, ops=ops, **{"max_num_seqs": num_requests, **(engine_args or {})})
    llm.generate("import os\n", SamplingParams(max_tokens=2))  # warm-up, not timed
    llm.core.kv.reset_prefix_cache()
    before = llm.core.kv.metrics()
    llm.core.stats.reset()
    prompts = [DEMO_PREFIX + DEMO_TAILS[i % len(DEMO_TAILS)] for i in range(num_requests)]
    params = [
        SamplingParams(temperature=0.7, top_p=0.95, max_tokens=max_tokens, seed=i)
        for i in range(num_requests)
    ]
    start = time.perf_counter()
    outs = llm.generate(prompts, params)
    elapsed = time.perf_counter() - start
    generated = sum(len(o.outputs[0].token_ids) for o in outs)
    metrics = [m for o in outs for m in o.metrics]
    kv = llm.core.kv.metrics()
    queries = kv.queries - before.queries
    for o in outs[:show]:
        tail = o.prompt[len(DEMO_PREFIX) :] if o.prompt else ""
        print(f"--- {tail.strip()}\n{tail}{o.outputs[0].text}")
    return {
        "ops": ops,
        "requests": num_requests,
        "generated": generated,
        "seconds": elapsed,
        "tok_per_s": generated / elapsed,
        "ttft": _percentiles([m.ttft for m in metrics if m.ttft is not None]),
        "itl": _percentiles([gap for m in metrics for gap in m.itl]),
        "hit_rate": (kv.hits - before.hits) / queries if queries else 0.0,
        "steps": llm.core.stats,
        "tokens": [o.outputs[0].token_ids for o in outs],
    }


def cmd_demo(args: argparse.Namespace) -> int:
    results = []
    for i, ops in enumerate(args.ops_list):
        try:
            print(f"\n=== {args.requests} concurrent requests, ops={ops} ===")
            results.append(
                run_demo(
                    ops,
                    args.requests,
                    args.max_tokens,
                    args.model,
                    args.show if i == 0 else 0,
                    _engine_args(args),
                )
            )
        except ImportError as exc:
            print(f"ops={ops} unavailable: {exc}")
    print("\n=== summary ===")
    for r in results:
        print(
            f"ops={r['ops']:<6} {r['generated']} tokens in {r['seconds']:.2f} s "
            f"= {r['tok_per_s']:.1f} tok/s, "
            f"prefix-cache hit rate {r['hit_rate']:.1%}\n"
            f"    TTFT {r['ttft']}\n    ITL  {r['itl']}\n"
            f"    {_steps_line(r['steps'])}"
        )
    if len(results) == 2:
        same = results[0]["tokens"] == results[1]["tokens"]
        print(f"ref and accel ops drew the same tokens for every request: {same}")
        ratio = results[1]["tok_per_s"] / results[0]["tok_per_s"]
        print(f"throughput accel / ref: {ratio:.2f}x")
        if not same:
            return 1
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from .server import ServerConfig, ServingEngine, serve

    config = ServerConfig(
        served_model_name=args.served_model_name or args.model or "pyagent-default",
        api_key=args.api_key,
        tool_call_parser=args.tool_call_parser,
        reasoning_parser=args.reasoning_parser,
        max_queue=args.max_queue,
        pooling_type=args.pooling_type,
        lora_modules=dict(args.lora_modules or ()),
    )
    engine = ServingEngine(
        args.model, ops=args.ops, engine_process=args.engine_process, **_engine_args(args)
    )
    serve(engine, config, args.host, args.port, args.log_level, args.shutdown_timeout)
    return 0


def _lora_module(text: str) -> tuple[str, str]:
    """NAME=PATH of --lora-modules."""
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"expected NAME=PATH, got {text!r}")
    return name, path


def _add_serve_parser(sub) -> None:
    from .parsers import add_parser_arguments

    serve = sub.add_parser("serve", help="an OpenAI-compatible HTTP server")
    serve.add_argument("--model", default=None, help="HF model directory (default: embedded)")
    serve.add_argument("--ops", default="auto", choices=["ref", "accel", "auto"])
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY'")
    serve.add_argument(
        "--served-model-name", default=None, help="the model's name in the API (default: --model)"
    )
    serve.add_argument(
        "--max-queue",
        type=int,
        default=None,
        help="completions that may wait beyond --max-num-seqs; more is a 429 (default: no limit)",
    )
    serve.add_argument(
        "--pooling-type",
        choices=[t for t in POOLING_TYPES if t != "all"],
        default=None,
        help="how /v1/embeddings pools a prompt's final hidden states (default: the model's: "
        "sentence-transformers' pooling for an encoder, the last token for a decoder)",
    )
    serve.add_argument(
        "--lora-modules",
        nargs="+",
        type=_lora_module,
        metavar="NAME=PATH",
        default=None,
        help="LoRA adapters (PEFT directories) served as models named NAME from the start; "
        "needs --enable-lora",
    )
    serve.add_argument(
        "--engine-process",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="run the engine core in a process of its own, stepping while this one "
        "serves HTTP; --no-engine-process steps it in a worker thread of this process "
        "(default: %(default)s)",
    )
    serve.add_argument("--log-level", default="info")
    serve.add_argument(
        "--shutdown-timeout",
        type=float,
        default=60.0,
        help="seconds to let requests in flight finish on SIGINT/SIGTERM",
    )
    add_parser_arguments(serve)
    add_engine_arguments(serve)
    serve.set_defaults(func=cmd_serve)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pyagent", description="pyagent inference engine")
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="complete one prompt")
    gen.add_argument("prompt")
    gen.add_argument(
        "--model", default=None, help="HF model directory (default: the embedded model)"
    )
    gen.add_argument("--ops", default="auto", choices=["ref", "accel", "auto"])
    gen.add_argument("--max-tokens", type=int, default=64)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--min-p", type=float, default=0.0)
    gen.add_argument("--repetition-penalty", type=float, default=1.0)
    gen.add_argument("--seed", type=int, default=None)
    gen.add_argument("--stop", action="append", help="a stop string (repeatable)")
    add_engine_arguments(gen)
    gen.set_defaults(func=cmd_generate)
    demo = sub.add_parser(
        "demo", help="concurrent requests on the embedded model, ref vs accel ops"
    )
    demo.add_argument("--model", default=None)
    demo.add_argument("--requests", type=int, default=32)
    demo.add_argument("--max-tokens", type=int, default=48)
    demo.add_argument("--show", type=int, default=4, help="generations to print")
    demo.add_argument("--ops", dest="ops_list", nargs="+", default=["ref", "accel"])
    add_engine_arguments(demo)
    demo.set_defaults(func=cmd_demo)
    _add_serve_parser(sub)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, TypeError, FileNotFoundError) as exc:
        parser.exit(2, f"pyagent: error: {exc}\n")


if __name__ == "__main__":
    sys.exit(main())
