"""The accelerator's declarations agree with the reference's and with its runtime.

PEP 399 between pyagent_ref and pyagent_accel covers names and signatures as well as
results: each `pyagent_accel.ops` module has the reference module's `__all__`, its
`.pyi` stub declares the reference's signatures (parameter names, kinds, defaults and
annotations), and the runtime functions have the stub's parameters. `_native.pyi`
declares exactly what `_native` registers. This is `mypy.stubtest` in miniature: the
signatures are read with `ast` from the stubs and with `inspect` from the runtime.
"""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path
from types import ModuleType
from typing import Any

import pyagent_accel._native as native
import pyagent_accel.ops as accel_ops
import pytest

import pyagent_accel
import pyagent_ref.ops as ref_ops

MODULES = ref_ops.MODULES
PACKAGE = Path(pyagent_accel.__file__).parent


def stub(path: Path) -> dict[str, ast.stmt]:
    """The top-level declarations of a stub by name: defs, classes, annotated names,
    assignments (including `__all__`)."""
    decls: dict[str, ast.stmt] = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            decls[node.name] = node
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            decls[node.target.id] = node
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    decls[target.id] = node
    return decls


def stub_all(decls: dict[str, ast.stmt]) -> list[str]:
    node = decls["__all__"]
    assert isinstance(node, ast.Assign)
    return list(ast.literal_eval(node.value))


def source(annotation: Any) -> str | None:
    """An annotation as normalised source text (None when there is none)."""
    if annotation is None or annotation is inspect.Parameter.empty:
        return None
    text = annotation if isinstance(annotation, str) else ast.unparse(annotation)
    return ast.unparse(ast.parse(text, mode="eval"))


Param = tuple[str, Any, Any, Any]  # name, kind, default, annotation source


def stub_signature(node: ast.FunctionDef) -> tuple[list[Param], str | None]:
    args = node.args
    positional = args.posonlyargs + args.args
    defaults: list[Any] = [inspect.Parameter.empty] * (len(positional) - len(args.defaults))
    defaults += [ast.literal_eval(d) for d in args.defaults]
    kinds = [inspect.Parameter.POSITIONAL_ONLY] * len(args.posonlyargs)
    kinds += [inspect.Parameter.POSITIONAL_OR_KEYWORD] * len(args.args)
    params = [
        (a.arg, kind, default, source(a.annotation))
        for a, kind, default in zip(positional, kinds, defaults, strict=True)
    ]
    for a, default in zip(args.kwonlyargs, args.kw_defaults, strict=True):
        value = inspect.Parameter.empty if default is None else ast.literal_eval(default)
        params.append((a.arg, inspect.Parameter.KEYWORD_ONLY, value, source(a.annotation)))
    assert args.vararg is None and args.kwarg is None, f"{node.name}: *args in a stub"
    return params, source(node.returns)


def runtime_signature(fn: Any) -> tuple[list[Param], str | None]:
    sig = inspect.signature(fn)
    params = [(p.name, p.kind, p.default, source(p.annotation)) for p in sig.parameters.values()]
    return params, source(sig.return_annotation)


def without_annotations(params: list[Param]) -> list[Param]:
    return [(name, kind, default, None) for name, kind, default, _ in params]


def public(module: ModuleType) -> set[str]:
    return {n for n in dir(module) if not n.startswith("_")}


def modules(name: str) -> tuple[ModuleType, ModuleType, dict[str, ast.stmt]]:
    accel = importlib.import_module(f"pyagent_accel.ops.{name}")
    ref = importlib.import_module(f"pyagent_ref.ops.{name}")
    return accel, ref, stub(PACKAGE / "ops" / f"{name}.pyi")


@pytest.mark.parametrize("name", MODULES)
def test_all_is_the_reference_all(name):
    accel, ref, decls = modules(name)
    assert accel.__all__ == ref.__all__
    assert stub_all(decls) == ref.__all__


@pytest.mark.parametrize("name", MODULES)
def test_stub_declares_the_reference_signatures(name):
    """Every function of the reference's `__all__` is in the stub with the reference's
    signature, annotations included; every public name of the stub is the reference's."""
    _, ref, decls = modules(name)
    for op in ref.__all__:
        assert op in decls, f"{name}.pyi does not declare {op}"
        if inspect.isfunction(getattr(ref, op)):
            node = decls[op]
            assert isinstance(node, ast.FunctionDef), f"{name}.pyi: {op} is not a def"
            assert stub_signature(node) == runtime_signature(getattr(ref, op)), f"{name}.{op}"
    extra = {n for n in decls if not n.startswith("_")} - public(ref)
    assert not extra, f"{name}.pyi declares names the reference lacks: {sorted(extra)}"


@pytest.mark.parametrize("name", MODULES)
def test_runtime_matches_the_stub(name):
    """Every name of the stub exists at runtime; functions have the stub's parameters
    (names, kinds, defaults) and constants the reference's values."""
    accel, ref, decls = modules(name)
    for decl, node in decls.items():
        if decl == "__all__" or decl.startswith("_"):
            continue
        assert hasattr(accel, decl), f"pyagent_accel.ops.{name} lacks {decl}"
        value = getattr(accel, decl)
        if isinstance(node, ast.FunctionDef):
            params, _ = runtime_signature(value)
            stub_params, _ = stub_signature(node)
            assert without_annotations(params) == without_annotations(stub_params), f"{name}.{decl}"
        elif not callable(value):
            assert value == getattr(ref, decl), f"{name}.{decl}"


def test_ops_package_stub():
    decls = stub(PACKAGE / "ops" / "__init__.pyi")
    assert stub_all(decls) == accel_ops.__all__
    assert accel_ops.MODULES == ref_ops.MODULES
    assert set(accel_ops.__all__) <= set(ref_ops.__all__)


def test_native_stub_matches_the_extension():
    """`_native.pyi` declares each registered function with its parameters, each class
    with its members, and nothing else."""
    decls = stub(PACKAGE / "_native.pyi")
    registered = public(native)
    assert set(decls) == registered, (
        f"stub only: {sorted(set(decls) - registered)}, "
        f"runtime only: {sorted(registered - set(decls))}"
    )
    for decl, node in decls.items():
        value = getattr(native, decl)
        if isinstance(node, ast.FunctionDef):
            params, _ = runtime_signature(value)
            stub_params, _ = stub_signature(node)
            assert without_annotations(params) == without_annotations(stub_params), decl
        elif isinstance(node, ast.ClassDef):
            members = {n.target.id for n in node.body if isinstance(n, ast.AnnAssign)}  # type: ignore[union-attr]
            assert members == {n for n in dir(value) if n.isupper()}, decl


# --- pyagent_accel.structured: the token level, twin of pyagent_ref.structured's --------------

STRUCTURED = ("automata", "earley", "vocab", "matcher")
REFERENCE_CLASSES = {"EarleyParser": "earley", "TokenTrie": "vocab", "GrammarMatcher": "matcher"}


def methods(node: ast.ClassDef) -> dict[str, ast.FunctionDef]:
    return {n.name: n for n in node.body if isinstance(n, ast.FunctionDef)}


@pytest.mark.parametrize("name", STRUCTURED)
def test_structured_modules_match_their_stubs(name):
    """Each module's `__all__` is its stub's; each class of the stub exists with the
    stub's methods and their parameters."""
    module = importlib.import_module(f"pyagent_accel.structured.{name}")
    decls = stub(PACKAGE / "structured" / f"{name}.pyi")
    assert stub_all(decls) == module.__all__
    for decl, node in decls.items():
        if not isinstance(node, ast.ClassDef):
            continue
        cls = getattr(module, decl)
        for method, fn in methods(node).items():
            if any(isinstance(d, ast.Name) and d.id == "property" for d in fn.decorator_list):
                continue
            params, _ = runtime_signature(getattr(cls, method))
            stub_params, _ = stub_signature(fn)
            assert without_annotations(params) == without_annotations(stub_params), (
                f"{name}.{decl}.{method}"
            )


def test_structured_package_stub():
    import pyagent_accel.structured as package

    assert stub_all(stub(PACKAGE / "structured" / "__init__.pyi")) == package.__all__


@pytest.mark.parametrize(("cls", "module"), REFERENCE_CLASSES.items())
def test_structured_classes_have_the_reference_methods(cls, module):
    """The public methods of the reference's class, with its parameters (the
    constructors take the accelerator's own parser and trie)."""
    accel = getattr(importlib.import_module(f"pyagent_accel.structured.{module}"), cls)
    ref = getattr(importlib.import_module(f"pyagent_ref.structured.{module}"), cls)
    for method in [n for n in vars(ref) if not n.startswith("_") and callable(vars(ref)[n])]:
        if isinstance(inspect.getattr_static(ref, method), staticmethod):
            continue
        assert hasattr(accel, method), f"{cls} lacks {method}"
        params, _ = runtime_signature(getattr(accel, method))
        ref_params, _ = runtime_signature(getattr(ref, method))
        assert without_annotations(params) == without_annotations(ref_params), f"{cls}.{method}"
