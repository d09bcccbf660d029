"""PEP 399 checks for an accelerator (run when the target is `pyagent_accel`).

PEP 399 is the rule between `pyagent_ref` and `pyagent_accel`: same results and
exception classes (the spec modules check those), no public name the reference lacks,
and no silent fallback: the functions under test must be native code, not the
reference's Python functions re-exported or called underneath.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import inspect
import os
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np

from . import contract
from .core import Ctx, Spec, reference

spec = Spec("native", ("_native", *contract.modules()))
SPEC = spec


def _example_inputs() -> dict[str, Callable[[], tuple[Any, ...]]]:
    """One small valid call per op (numpy inputs), to observe what code an op runs."""
    x = np.array([[0.5, -1.0, 2.0, float("-inf")], [1.0, 1.0, 0.0, -3.0]])
    ids = np.array([[0, 2, -1], [3, 3, 1]])
    return {
        "sampling.apply_temperature": lambda: (x, np.array([0.7, 0.0])),
        "sampling.apply_top_k": lambda: (x, np.array([2, 0])),
        "sampling.apply_top_p": lambda: (x, np.array([0.8, 1.0])),
        "sampling.apply_min_p": lambda: (x, np.array([0.1, 0.0])),
        "sampling.apply_penalties": lambda: (
            x,
            ids,
            ids,
            np.array([1.2, 1.0]),
            np.array([0.5, 0.0]),
            np.array([0.1, 0.0]),
        ),
        "sampling.apply_logit_bias": lambda: (x, ids, np.ones(ids.shape)),
        "sampling.log_softmax": lambda: (x,),
        "sampling.topk_logprobs": lambda: (x, 2, np.array([0, 1])),
        "sampling.philox_uniform": lambda: (np.array([1, -1]), np.array([0, 5]), 4),
        "sampling.sample": lambda: (x, np.array([1.0, 0.0]), np.array([1, 2]), np.array([0, 3])),
        "spec_decode.verify_greedy": lambda: (x[[0, 1, 1]], np.array([2]), np.array([1, 0])),
        "spec_decode.rejection_sample": lambda: (
            x[[0, 1, 1]],
            np.array([2]),
            np.array([1, 0]),
            np.array([[0.1, 0.2, 0.7, 0.0]]),
            np.array([1.0, 0.0]),
            np.array([1, 2]),
            np.array([0, 3]),
        ),
        "spec_decode.tree_attention_mask": lambda: (np.array([0, 0, 1]),),
        "spec_decode.verify_tree_greedy": lambda: (
            x[[0, 1, 1, 0]],
            np.array([2, 1]),
            np.array([2, 0]),
            np.array([0, 0]),
        ),
        "spec_decode.rejection_sample_tree": lambda: (
            x[[0, 1, 1, 0]],
            np.array([2, 1]),
            np.array([2, 0]),
            np.array([0, 0]),
            np.array([1.0, 0.0]),
            np.array([1, 2]),
            np.array([0, 3]),
        ),
        "spec_decode.propose_ngram": lambda: (np.array([1, 2, 3, 1, 2]), 2, 1, 2),
        "hashing.cbor_encode": lambda: ([1, b"a", "b", [-2]],),
        "hashing.root_hash": lambda: ("sha256",),
        "hashing.hash_block": lambda: (bytes(32), [1, 2, 3], [("salt", "s")], "sha256"),
        "hashing.hash_blocks": lambda: ([1, 2, 3, 4, 5], 2),
        "block_table.compute_positions": lambda: (np.array([0, 3, 4]), np.array([2, 9]), 6),
        "block_table.compute_slot_mapping": lambda: (
            np.array([[3, 7, 1], [5, 0, 2]], np.int32),
            np.array([0, 3, 4]),
            np.array([2, 3, 4, 9, 0]),
            4,
        ),
        "block_table.compute_logits_indices": lambda: (np.array([0, 3, 4]),),
        "layers.rms_norm": lambda: (x[:, :3], np.ones(3), 1e-6, 2 * x[:, :3]),
        "layers.silu_and_mul": lambda: (x[:, :2],),
        "rope.rope_inv_freq": lambda: (8, 10000.0, {"rope_type": "yarn", "factor": 4.0}),
        "rope.apply_rope": lambda: (
            np.array([0, 7]),
            np.ones((2, 3, 8), np.float32),
            np.ones((2, 1, 8), np.float32),
            np.array([1.0, 0.1], np.float32),
        ),
        "rope.apply_mrope": lambda: (
            np.array([[0, 7], [0, 3], [0, 5]]),
            np.ones((2, 3, 8), np.float32),
            np.ones((2, 1, 8), np.float32),
            np.array([1.0, 0.1], np.float32),
            (1, 0, 1),
        ),
        "attention.reshape_and_cache": lambda: (
            np.ones((2, 2, 4), np.float32),
            np.zeros((2, 2, 4), np.float32),
            np.zeros((3, 2, 2, 4), np.float32),
            np.zeros((3, 2, 2, 4), np.float32),
            np.array([5, -1]),
        ),
        "attention.concat_and_cache_mla": lambda: (
            np.ones((2, 3), np.float32),
            np.zeros((2, 2), np.float32),
            np.zeros((3, 2, 5), np.float32),
            np.array([5, -1]),
        ),
        "attention.paged_attention": lambda: (
            np.ones((3, 4, 8), np.float32),
            np.ones((3, 2, 2, 8), np.float32),
            np.ones((3, 2, 2, 8), np.float32),
            np.array([[2, 0], [1, 1]]),
            np.array([0, 2, 3]),
            np.array([3, 1]),
            8**-0.5,
        ),
        "lora.lora_shrink": lambda: (
            np.ones((2, 4), np.float32),
            np.ones((3, 2, 4), np.float32),
            np.array([2, -1]),
        ),
        "lora.lora_expand": lambda: (
            np.ones((2, 2), np.float32),
            np.ones((3, 5, 2), np.float32),
            np.array([2, -1]),
            np.ones(3, np.float32),
            np.zeros((2, 5), np.float32),
        ),
        "pooling.pool": lambda: (x[:, :3].copy(), np.array([0, 1, 2]), "mean"),
        "pooling.normalize": lambda: (x[:, :3].copy(), 2),
        "pooling.classify": lambda: (x[:, :3].copy(), "softmax"),
        "pooling.cosine_similarity": lambda: (x[:, :3].copy(), x[::-1, :3].copy()),
        "quant.quantize": lambda: (np.array([[0.5, -1.0, 2.0, 0.0]], np.float32), 4, 2, False),
        "quant.dequantize": lambda: (
            np.array([[1, -2, 7, 0]], np.int8),
            np.array([[0.5, 0.25]], np.float32),
            np.array([[0, 1]], np.int8),
        ),
        "quant.pack_int32": lambda: (np.array([[1, -2, 7, 0, 3, -8, 0, 1]], np.int8), 4),
        "quant.unpack_int32": lambda: (np.array([[0x12345678]], np.int32), 4, 8),
        "quant.dequant_matmul": lambda: (
            np.ones((2, 8), np.float32),
            np.array([[0x12345678], [-1]], np.int32),
            np.array([[0.5, 0.25], [1.0, 2.0]], np.float32),
            None,
            4,
        ),
        "quant.quantize_fp8": lambda: (np.array([[0.5, -1.0, 2.0, 0.0]], np.float32), "e4m3"),
        "quant.dequantize_fp8": lambda: (
            np.array([[0x38, 0xC0, 0x7E, 0]], np.uint8),
            np.array([[0.5]], np.float32),
            "e5m2",
        ),
        "quant.dequant_matmul_fp8": lambda: (
            np.ones((2, 4), np.float32),
            np.array([[0x38, 0xC0, 0x7E, 0], [1, 2, 3, 4]], np.uint8),
            np.array([[0.5], [2.0]], np.float32),
            "e4m3",
            "dynamic",
        ),
        "attention.paged_decode_attention": lambda: (
            np.ones((2, 4, 8), np.float32),
            np.ones((3, 2, 2, 8), np.float32),
            np.ones((3, 2, 2, 8), np.float32),
            np.array([[2, 0], [1, 1]]),
            np.array([3, 0]),
            8**-0.5,
        ),
    }


def _public_names(module: Any) -> set[str]:
    names = getattr(module, "__all__", None)
    if names is None:
        names = [n for n in dir(module) if not n.startswith("_")]
    return {
        n
        for n in names
        if not isinstance(getattr(module, n, None), ModuleType) and n != "annotations"
    }


def _reference_public_names(module: ModuleType) -> set[str]:
    """Everything public the reference module has (its __all__ plus other public names)."""
    return set(getattr(module, "__all__", ())) | {
        n
        for n in dir(module)
        if not n.startswith("_") and not isinstance(getattr(module, n), ModuleType)
    }


def _ref_dir() -> str:
    return os.path.dirname(os.path.abspath(reference().__file__))


def _defined_in_reference(obj: Any) -> str | None:
    """Why `obj` counts as reference code, or None."""
    module = getattr(obj, "__module__", None) or ""
    if module.split(".")[0] == "pyagent_ref":
        return f"its __module__ is {module}"
    code = getattr(inspect.unwrap(obj), "__code__", None) if callable(obj) else None
    if code is not None and os.path.abspath(code.co_filename).startswith(_ref_dir()):
        return f"its code is in {code.co_filename}"
    return None


def _parameters(fn: Callable[..., Any]) -> tuple[tuple[str, str, Any], ...]:
    """(name, kind, default) of each parameter of `fn` (annotations may differ)."""
    try:
        sig = inspect.signature(fn)
    except ValueError:  # a builtin without a text signature
        return (("<no signature>", "", None),)
    return tuple((p.name, p.kind.name, p.default) for p in sig.parameters.values())


def _accel_root_name(ctx: Ctx) -> str:
    return ctx.impl.target.split(".")[0]


@spec.prop("_native")
def is_an_extension_module(ctx: Ctx) -> None:
    """<package>._native imports and is a compiled extension module (not Python source)."""
    name = f"{_accel_root_name(ctx)}._native"
    mod = importlib.import_module(name)
    loader = getattr(mod, "__loader__", None)
    path = getattr(mod, "__file__", "") or ""
    is_ext = isinstance(loader, importlib.machinery.ExtensionFileLoader) or path.endswith(
        tuple(importlib.machinery.EXTENSION_SUFFIXES)
    )
    assert is_ext, (
        f"{name} is not an extension module (loader {type(loader).__name__}, file {path!r})"
    )


def _ops(ctx: Ctx, module: str) -> tuple[Any, ModuleType]:
    accel = ctx.impl.ops_module(module)
    assert accel is not None, f"{ctx.impl.label} has no {module} module"
    return accel, getattr(reference(), module)


def _add_module_checks(module: str) -> None:
    def functions_are_not_the_reference(ctx: Ctx) -> None:
        """No function of the module is the reference's object or defined in pyagent_ref."""
        accel, ref = _ops(ctx, module)
        for name in sorted(_public_names(accel)):
            obj = getattr(accel, name)
            if not callable(obj):
                continue
            assert obj is not getattr(ref, name, None), (
                f"{module}.{name} is the pyagent_ref function itself"
            )
            why = _defined_in_reference(obj)
            assert why is None, f"{module}.{name} comes from pyagent_ref: {why}"

    def no_public_name_beyond_the_reference(ctx: Ctx) -> None:
        """Every public name of the module exists in the reference module (PEP 399)."""
        accel, ref = _ops(ctx, module)
        extra = sorted(_public_names(accel) - _reference_public_names(ref))
        assert not extra, f"{module} has public names the reference lacks: {extra}"

    def runs_no_reference_code(ctx: Ctx) -> None:
        """Calling each op executes no Python code of the reference module (no silent fallback)."""
        accel, ref = _ops(ctx, module)
        ref_file = os.path.abspath(inspect.getsourcefile(ref) or "")
        seen: list[str] = []

        def hook(frame: Any, event: str, arg: Any) -> None:
            if event == "call" and os.path.abspath(frame.f_code.co_filename) == ref_file:
                seen.append(frame.f_code.co_name)

        for key, make in _example_inputs().items():
            mod, op = key.split(".")
            fn = getattr(accel, op, None) if mod == module else None
            if fn is None:
                continue
            sys.setprofile(hook)
            try:
                fn(*make())
            finally:
                sys.setprofile(None)
            assert not seen, f"{module}.{op} ran reference code: {sorted(set(seen))}"

    def signatures_match_the_reference(ctx: Ctx) -> None:
        """Every function has the reference's parameters: names, order, kinds and defaults."""
        accel, ref = _ops(ctx, module)
        for name in sorted(_public_names(accel)):
            obj, want = getattr(accel, name), getattr(ref, name, None)
            if callable(obj) and callable(want):
                got, expected = _parameters(obj), _parameters(want)
                assert got == expected, (
                    f"{module}.{name}{got} differs from the reference {expected}"
                )

    spec.add(module, functions_are_not_the_reference)
    spec.add(module, no_public_name_beyond_the_reference)
    spec.add(module, signatures_match_the_reference)
    spec.add(module, runs_no_reference_code)


for _module in contract.modules():
    _add_module_checks(_module)


def ops_package_names(ctx: Ctx) -> None:
    """The ops package exposes no public name that pyagent_ref.ops lacks."""
    extra = sorted(_public_names(ctx.impl.root) - _reference_public_names(reference()) - {"ops"})
    assert not extra, f"{ctx.impl.label} has public names pyagent_ref.ops lacks: {extra}"


spec.add("_native", ops_package_names, name="no_public_name_beyond_the_reference")
