"""The machinery shared by the CLI and the pytest plugin.

- `Property`: one checkable statement about one op (a small function with a docstring),
  optionally driven by a hypothesis strategy. Spec modules declare them with `Spec.prop`.
- `Impl`: the implementation under test, resolved from a target module name.
- `Ctx`: what a property function receives: calls into the implementation with inputs
  converted to the chosen array library, calls into the reference on numpy inputs, and
  conversion of results back to numpy.
- `run_property`: runs one property against one implementation and returns an `Outcome`
  (PASS / FAIL / KNOWN / MISSING / SKIP), with the minimal counterexample and a one-line repro.
"""

from __future__ import annotations

import importlib
import sys
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import numpy as np

from . import divergences, profiles

ARRAYS = ("numpy", "torch")
DEFAULT_DEVICE = "cpu"
REFERENCE = "pyagent_ref"


class SuiteError(Exception):
    """The suite itself is inconsistent (e.g. the reference disagrees with a stated error
    class). Reported as a failure of the property, with this class name, so it is noticed."""


# --- properties -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Property:
    """One statement about an op that any conforming implementation satisfies."""

    module: str  # ops module, e.g. "sampling" ("native" for the PEP 399 checks)
    op: str  # the op it is about, e.g. "apply_top_k"
    name: str  # e.g. "keeps_exactly_the_tokens_at_or_above_kth"
    func: Callable[..., None]  # func(ctx) or func(ctx, case); raises AssertionError on violation
    strategy: Any = None  # hypothesis strategy of cases, or None for a fixed check
    uses: tuple[str, ...] = ()  # other ops of the module it calls (missing ones -> MISSING)
    # compares with pyagent_ref (skipped when the target is the reference on numpy)
    differential: bool = False

    @property
    def id(self) -> str:
        return f"{self.module}.{self.op}.{self.name}"

    @property
    def qualified_op(self) -> str:
        return f"{self.module}.{self.op}"

    @property
    def doc(self) -> str:
        return " ".join((self.func.__doc__ or "").strip().split("\n\n")[0].split())


class Spec:
    """The properties of one ops module (or of another contract, like `tokenize`), in
    declaration order.

    A spec of something other than an ops module may give `namespace(target)`: the
    implementation's namespace for it when the target module does not define one itself
    (None if there is none), and `not_run_here(op, array)`: why the properties of `op`
    cannot run in this environment (test data not installed, an array library the contract
    does not take), or None. Those properties are then skipped with that reason.
    """

    def __init__(
        self,
        module: str,
        ops: tuple[str, ...],
        *,
        namespace: Callable[[str], Any] | None = None,
        not_run_here: Callable[[str, str], str | None] | None = None,
    ):
        self.module = module
        self.ops = ops  # every op the module specifies, in report order
        self.namespace = namespace
        self.not_run_here = not_run_here
        self.properties: list[Property] = []

    def prop(
        self,
        op: str,
        given: Any = None,
        *,
        uses: tuple[str, ...] = (),
        differential: bool = False,
        name: str | None = None,
    ) -> Callable[[Callable[..., None]], Callable[..., None]]:
        """Decorator: declare `func` a property of `op` (driven by `given` if not None)."""

        def deco(func: Callable[..., None]) -> Callable[..., None]:
            self.add(op, func, given, uses=uses, differential=differential, name=name)
            return func

        return deco

    def add(
        self,
        op: str,
        func: Callable[..., None],
        given: Any = None,
        *,
        uses: tuple[str, ...] = (),
        differential: bool = False,
        name: str | None = None,
    ) -> None:
        """Declare `func` a property of `op`; `name` defaults to the function's name."""
        if op not in self.ops:
            raise SuiteError(f"{self.module}: {op!r} is not one of the module's ops")
        prop = Property(self.module, op, name or func.__name__, func, given, uses, differential)
        if any(p.id == prop.id for p in self.properties):
            raise SuiteError(f"duplicate property {prop.id}")
        self.properties.append(prop)


# --- cases ----------------------------------------------------------------------------------


def fmt(value: Any) -> str:
    """A compact one-line rendering of a case field (arrays keep their dtype)."""
    if isinstance(value, np.ndarray):
        body = np.array2string(
            value, separator=",", max_line_width=10**9, threshold=10**9, floatmode="unique"
        )
        return f"{value.dtype}{body.replace(' ', '').replace(chr(10), '')}"
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, np.ndarray) for v in value):
        return "[" + ",".join(fmt(v) for v in value) + "]"
    if isinstance(value, type):
        return value.__name__
    if isinstance(value, bytes) and len(value) > 8:
        return f"bytes.fromhex({value.hex()!r})"
    return repr(value)


class Case:
    """The inputs of one example: named fields, rendered compactly on one line."""

    def __init__(self, **fields: Any):
        self.__dict__.update(fields)
        self._fields = tuple(fields)

    def __repr__(self) -> str:
        return ", ".join(f"{k}={fmt(getattr(self, k))}" for k in self._fields)


# --- the implementation under test ----------------------------------------------------------


@dataclass
class Impl:
    """An implementation: a namespace with one attribute per ops module."""

    target: str  # the name the user gave, e.g. "pyagent_accel"
    root: Any  # `<target>.ops` if it exists, else `<target>`
    label: str  # the resolved module name

    def ops_module(self, module: str) -> Any:
        """The implementation's namespace for `module`: `<root>.<module>`, else the one the
        module's spec derives from the target (`Spec.namespace`), else None."""
        found = getattr(self.root, module, None)
        spec = all_specs().get(module)
        if found is None and spec is not None and spec.namespace is not None:
            found = spec.namespace(self.target)
        return found

    def declared_missing(self, module: str, op: str) -> str | None:
        """The reason the implementation gives for lacking `module.op`, if it declares one."""
        declared = getattr(self.root, "CONFORMANCE_MISSING", None) or {}
        return declared.get(f"{module}.{op}", declared.get(f"{module}.*"))

    @property
    def version(self) -> str:
        """What the implementation says it is (VERSION or the package's __version__)."""
        found = getattr(self.root, "VERSION", None)
        if found is None:
            package = sys.modules.get(self.target.split(".")[0])
            found = getattr(package, "__version__", None)
        return str(found) if found else ""

    def op(self, module: str, op: str) -> Callable[..., Any] | None:
        """The implementation's function `module.op`, or None when it does not provide it."""
        if self.declared_missing(module, op) is not None:
            return None
        mod = self.ops_module(module)
        return None if mod is None else getattr(mod, op, None)

    @property
    def is_reference(self) -> bool:
        return self.target == REFERENCE or self.label == f"{REFERENCE}.ops"


def resolve(target: str) -> Impl:
    """Import `<target>.ops` if it exists, otherwise `<target>` (ImportError if neither)."""
    try:
        root = importlib.import_module(f"{target}.ops")
        return Impl(target, root, f"{target}.ops")
    except ModuleNotFoundError as exc:
        if exc.name not in (f"{target}.ops",):
            raise
    root = importlib.import_module(target)
    return Impl(target, root, target)


def reference() -> ModuleType:
    return importlib.import_module(f"{REFERENCE}.ops")


# --- array conversion -----------------------------------------------------------------------


def to_numpy(x: Any) -> Any:
    """numpy view of a result: arrays/tensors -> np.ndarray; tuples/lists element-wise."""
    if isinstance(x, np.ndarray):
        return x
    if type(x).__module__.startswith("torch"):
        return x.detach().cpu().numpy()
    if isinstance(x, tuple):
        return tuple(to_numpy(v) for v in x)
    if isinstance(x, list):
        return [to_numpy(v) for v in x]
    return x


def library_of(x: Any) -> str:
    """'numpy', 'torch' or the type name of `x`."""
    if isinstance(x, np.ndarray):
        return "numpy"
    if type(x).__module__.startswith("torch") and hasattr(x, "dtype"):
        return "torch"
    return type(x).__name__


def check_device(array: str, device: str) -> str:
    """`device` for inputs of `array`, checked before any property runs.

    numpy arrays live on the host, so numpy takes "cpu" only; torch takes any device name
    torch parses and can create a tensor on ("cpu", "cuda", "cuda:1", "mps", ...).
    Returns the name as torch spells it ("cpu" for numpy).
    Raises:
        ValueError: an unknown array library, numpy with another device, a malformed device
            name or a device this torch cannot use (the message names the value and why).
    """
    if array not in ARRAYS:
        raise ValueError(f"array must be one of {ARRAYS}, got {array!r}")
    if array == "numpy":
        if device != DEFAULT_DEVICE:
            raise ValueError(f"device {device!r} needs array torch: numpy arrays live on the cpu")
        return device
    import torch

    try:
        name = str(torch.device(device))
        torch.empty(1, device=name)
    except (RuntimeError, AssertionError, ValueError, TypeError) as exc:
        why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        msg = f"device {device!r} is not usable by torch {torch.__version__}: {why}"
        raise ValueError(msg) from None
    return name


class Ctx:
    """What a property function receives (one per property run)."""

    def __init__(self, impl: Impl, array: str, module: str, device: str = DEFAULT_DEVICE):
        if array not in ARRAYS:
            raise ValueError(f"array must be one of {ARRAYS}, got {array!r}")
        self.impl = impl
        self.array = array
        self.device = device
        self.module = module
        self._ref = reference()

    # conversion
    def arr(self, x: Any) -> Any:
        """A numpy array as the chosen library's array (a fresh copy, on the run's device)."""
        if not isinstance(x, np.ndarray):
            return x
        if self.array == "torch":
            import torch

            return torch.from_numpy(np.array(x, copy=True)).to(self.device)
        return np.array(x, copy=True)

    LAYOUTS = ("padded rows", "every other column", "column-major")

    def strided(self, x: np.ndarray, layout: str = "every other column") -> Any:
        """`x` as a non-contiguous view of the chosen library, with the same values.

        "padded rows": rows of a wider array (unit stride along the last axis);
        "every other column": a stride of 2 elements along the last axis;
        "column-major": Fortran order (the first axis varies fastest).
        """
        if layout == "column-major":
            view = np.asfortranarray(x)
        else:
            wide = np.zeros((*x.shape[:-1], 2 * x.shape[-1] + 1), dtype=x.dtype)
            if layout == "padded rows":
                wide[..., : x.shape[-1]] = x
                view = wide[..., : x.shape[-1]]
            else:
                wide[..., : 2 * x.shape[-1] : 2] = x
                view = wide[..., : 2 * x.shape[-1] : 2]
        if self.array == "torch":
            import torch

            base = view.base if view.base is not None else view
            # moved whole, then viewed: the strides survive the copy to the device
            return (
                torch.from_numpy(base)
                .to(self.device)
                .as_strided(
                    view.shape,
                    tuple(st // view.itemsize for st in view.strides),
                    (view.__array_interface__["data"][0] - base.__array_interface__["data"][0])
                    // view.itemsize,
                )
            )
        return view

    def convert(self, value: Any) -> Any:
        """`arr` applied to numpy arrays and to the arrays of a list (per-request masks),
        leaving everything else (ints, bytes, lists of ints) alone."""
        if isinstance(value, list) and any(isinstance(v, np.ndarray) for v in value):
            return [self.convert(v) for v in value]
        return self.arr(value) if isinstance(value, np.ndarray) else value

    # calls
    def fn(self, op: str) -> Callable[..., Any]:
        """The implementation's function for `op` of this module."""
        f = self.impl.op(self.module, op)
        if f is None:
            raise SuiteError(f"{self.module}.{op} is missing but the property did not declare it")
        return f

    def ref_fn(self, op: str) -> Callable[..., Any]:
        return getattr(getattr(self._ref, self.module), op)

    def call_raw(self, op: str, *args: Any, **kwargs: Any) -> Any:
        """Call the implementation with numpy arguments converted to the chosen library."""
        args = tuple(self.convert(a) for a in args)
        kwargs = {k: self.convert(v) for k, v in kwargs.items()}
        return self.fn(op)(*args, **kwargs)

    def call(self, op: str, *args: Any, **kwargs: Any) -> Any:
        """`call_raw`, with the result converted to numpy."""
        return to_numpy(self.call_raw(op, *args, **kwargs))

    def ref(self, op: str, *args: Any, **kwargs: Any) -> Any:
        """The reference on the numpy arguments as given (the canonical answer)."""
        return to_numpy(self.ref_fn(op)(*args, **kwargs))

    def raises(self, op: str, *args: Any, **kwargs: Any) -> BaseException | None:
        """The exception the implementation raises for these arguments, or None."""
        try:
            self.call_raw(op, *args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - the class is what is being checked
            return exc
        return None

    def ref_raises(self, op: str, *args: Any, **kwargs: Any) -> BaseException | None:
        try:
            self.ref_fn(op)(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001
            return exc
        return None


# --- outcomes -------------------------------------------------------------------------------

PASS, FAIL, KNOWN, MISSING, SKIP = "PASS", "FAIL", "KNOWN", "MISSING", "SKIP"


@dataclass
class Outcome:
    prop: Property
    status: str
    message: str = ""  # the violation (FAIL/KNOWN) or the reason (MISSING/SKIP/KNOWN)
    counterexample: str = ""  # the minimal failing case, compactly
    blob: str = ""  # the hypothesis @reproduce_failure blob, if any
    repro: str = ""  # one shell line that reproduces the failure
    note: str = ""  # e.g. a registered divergence that did not show
    seconds: float = 0.0
    traceback: str = ""

    @property
    def failed(self) -> bool:
        return self.status == FAIL


def _blob_from_notes(exc: BaseException) -> str:
    for note in getattr(exc, "__notes__", ()):
        if "@reproduce_failure(" in note:
            inside = note.split("@reproduce_failure(", 1)[1]
            # ('6.170.15', b'AEEK')
            return inside.split("b'", 1)[1].split("'", 1)[0]
    return ""


def _message(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    name = type(exc).__name__
    return f"{name}: {first}" if first else name


def repro_line(
    target: str, prop: Property, array: str, profile: str, blob: str, device: str = DEFAULT_DEVICE
) -> str:
    line = (
        f"python -m conformance {target} {prop.module} --array {array} "
        f"--profile {profile} --only {prop.id}"
    )
    if device != DEFAULT_DEVICE:
        line += f" --device {device}"
    if blob:
        line += f" --blob {blob}"
    return line


def _execute(
    prop: Property, ctx: Ctx, last: list[Any], profile: str, blob: str | None, shrink: bool = True
) -> BaseException | None:
    """Run the property (under hypothesis if it has a strategy); the exception, if any."""
    from hypothesis import __version__ as hypothesis_version
    from hypothesis import given, reproduce_failure

    if prop.strategy is None:
        try:
            prop.func(ctx)
        except Exception as e:  # noqa: BLE001 - any exception is a finding
            return e
        return None

    def test(case: Any) -> None:
        last[0] = case
        prop.func(ctx, case)

    test.__name__ = prop.name
    test.__qualname__ = prop.id
    # Distinct examples per property under derandomize (the digest seeds the generator).
    test._hypothesis_internal_add_digest = prop.id.encode()  # type: ignore[attr-defined]
    if blob:
        test = reproduce_failure(hypothesis_version, blob.encode())(test)
    chosen = profiles.get(profile)
    if not shrink:
        from hypothesis import Phase, settings

        chosen = settings(chosen, phases=[Phase.explicit, Phase.reuse, Phase.generate])
    wrapped = chosen(given(prop.strategy)(test))
    try:
        wrapped()
    except Exception as e:  # noqa: BLE001
        return e
    return None


def run_property(
    prop: Property,
    impl: Impl,
    array: str = "numpy",
    profile: str = profiles.DEFAULT_PROFILE,
    blob: str | None = None,
    shrink: bool = True,
    device: str = DEFAULT_DEVICE,
) -> Outcome:
    """Run one property against `impl`; never raises for a violation (see `Outcome`).

    shrink=False skips hypothesis' shrinking (faster when only pass/fail matters).
    device: where the torch inputs are created (checked beforehand by `check_device`);
    results are compared on the host."""
    start = time.perf_counter()
    spec = all_specs().get(prop.module)
    why_not = spec.not_run_here(prop.op, array) if spec and spec.not_run_here else None
    if why_not is not None:
        return Outcome(prop, SKIP, why_not)
    missing = [op for op in (prop.op, *prop.uses) if impl.op(prop.module, op) is None]
    if prop.module != "native" and missing:
        reasons = [impl.declared_missing(prop.module, op) for op in missing]
        why = "; ".join(r for r in reasons if r) or "not provided"
        return Outcome(prop, MISSING, f"{', '.join(missing)}: {why}")
    if prop.differential and impl.is_reference and array == "numpy":
        runs_on_torch = not (spec and spec.not_run_here and spec.not_run_here(prop.op, "torch"))
        hint = " (run with --array torch to compare)" if runs_on_torch else ""
        return Outcome(prop, SKIP, f"the target is the reference{hint}")

    known = divergences.lookup(impl.target, prop.qualified_op, prop.name)
    if known is not None:
        shrink = False  # the minimal example of a known divergence is not worth the time
    ctx = Ctx(impl, array, prop.module, device)
    last: list[Any] = [None]
    exc: BaseException | None = None
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        # Floating-point warnings (-inf - -inf in a checker, exp underflow in an
        # implementation) are not conformance findings; results are checked instead.
        warnings.simplefilter("ignore", RuntimeWarning)
        exc = _execute(prop, ctx, last, profile, blob, shrink)

    seconds = time.perf_counter() - start
    if blob and type(exc).__name__ == "DidNotReproduce":
        return Outcome(prop, PASS, note="the --blob example passes now", seconds=seconds)
    if exc is None:
        note = f"registered divergence not observed: {known.reason}" if known else ""
        return Outcome(prop, PASS, note=note, seconds=seconds)
    outcome = Outcome(
        prop,
        FAIL,
        message=_message(exc),
        counterexample="" if last[0] is None else repr(last[0]),
        blob=_blob_from_notes(exc),
        seconds=seconds,
        traceback="".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
    )
    outcome.repro = repro_line(impl.target, prop, array, profile, outcome.blob, device)
    if known is not None:
        outcome.status = KNOWN
        outcome.note = known.reason
    return outcome


# --- the whole suite ------------------------------------------------------------------------


def all_specs() -> dict[str, Spec]:
    """The spec of every ops module, then of the other contracts (`tokenize`), by name."""
    from .specs import SPECS

    return SPECS()


def unspecified_modules() -> list[str]:
    """Ops modules of the reference that this suite has no spec for (yet)."""
    return [m for m in getattr(reference(), "MODULES", ()) if m not in all_specs()]


def native_checks_apply(impl: Impl) -> bool:
    return impl.target.split(".")[0] == "pyagent_accel"


def select(
    impl: Impl,
    modules: list[str] | None = None,
    only: list[str] | None = None,
    native: bool | None = None,
) -> list[Property]:
    """The properties to run: those of the given ops modules (all by default), filtered by
    `only` (fnmatch patterns or prefixes of property ids). The native (PEP 399) checks come
    first when `native` is True, or when it is None and the target is pyagent_accel."""
    from fnmatch import fnmatch

    specs = all_specs()
    unknown = [m for m in modules or () if m not in specs and m != "native"]
    if unknown:
        raise ValueError(f"unknown module(s) {unknown}; known: {sorted(specs)} and 'native'")
    wanted = list(modules or specs)
    props = [p for m in wanted if m in specs for p in specs[m].properties]
    if native is None:
        native = native_checks_apply(impl) and (not modules or "native" in modules or bool(props))
    if native or "native" in wanted:
        from .native import SPEC as NATIVE

        props = [*NATIVE.properties, *props]
    if only:
        props = [
            p for p in props if any(fnmatch(p.id, pat) or p.id.startswith(pat) for pat in only)
        ]
    return props


@dataclass
class Report:
    target: str
    label: str
    array: str
    profile: str
    outcomes: list[Outcome] = field(default_factory=list)
    device: str = DEFAULT_DEVICE
    seconds: float = 0.0
    version: str = ""

    @property
    def ok(self) -> bool:
        return not any(o.failed for o in self.outcomes)

    def ok_strict(self) -> bool:
        return self.ok and not any(o.status == MISSING for o in self.outcomes)


def run(
    target: str | Impl,
    modules: list[str] | None = None,
    array: str = "numpy",
    profile: str = profiles.DEFAULT_PROFILE,
    only: list[str] | None = None,
    blob: str | None = None,
    native: bool | None = None,
    progress: Callable[[Outcome], None] | None = None,
    device: str = DEFAULT_DEVICE,
) -> Report:
    """Run the suite (or the selected part) on `target` and return the report; torch
    inputs on `device` (ValueError at once if `check_device` rejects it)."""
    device = check_device(array, device)
    impl = target if isinstance(target, Impl) else resolve(target)
    props = select(impl, modules, only, native)
    report = Report(impl.target, impl.label, array, profile, device=device)
    start = time.perf_counter()
    for prop in props:
        outcome = run_property(prop, impl, array, profile, blob, device=device)
        report.outcomes.append(outcome)
        if progress:
            progress(outcome)
    report.seconds = time.perf_counter() - start
    report.version = impl.version
    return report


def iter_properties() -> Iterator[Property]:
    """Every property of every spec module (without the native checks)."""
    for spec in all_specs().values():
        yield from spec.properties
