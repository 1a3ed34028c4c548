"""Which implementation ("provider") runs behind each `repro::` op: the one piece of global state.

Every op in `kernels` is a `repro::` torch op (`kernels/_library.py`) whose body asks this registry,
at call time, for the function of the provider selected for it: `reference` (plain, obviously
correct torch), `torch` (fast plain-torch paths), `triton` (our Triton kernels), `fla`
(flash-linear-attention, GDN only), `vllm_xpu` (vllm-xpu-kernels). Each op's folder declares its
providers in one table (`kernels/<op>/__init__.py`, registered by `declare`); a provider's module
is imported when its function is first needed, so one whose package or device is missing is
listed with the reason and never imported.

Default for an op: `torch` where it is registered, else `reference`. A selection never falls back
silently: an unknown op or provider, or one absent here, raises `KernelSelectionError` (a
`ValueError`; the CLI exits 2) naming it. A selection made while a graph is captured is frozen
into that graph (the body runs at capture time).

    registry.select("w8a8_linear", "reference")
    registry.configure("w8a8_linear=torch,gdn=reference")     # also env REPRO_KERNELS
    with registry.using(moe="reference"): ...

A name on the left of `=` may be an op or a group (`w8a8`, `norms`, `conv1d`, `gdn`, `moe`, or
`all`): the provider for each of the group's ops that has it, an error if none does.

*Batch-invariant* (`batch_invariant(op, provider)`): a row's result is the same bits whatever the
other rows of the batch are. Ours are, on purpose; production kernels often are not (a reduction
tree or a work-group size chosen by the number of tokens). A graph replayed at a padded batch is
compared with eager at the exact one, so the oracle needs this to tell batch variance from a hazard.

Plugins: modules that call `register(...)` when imported (a lab's own build of vllm-xpu-kernels, a
patched FLA), loaded by `load_plugins` before `configure` / `select`:

    registry.register("rms_norm", "mine", my_rms_norm, my_available, group="norms")  # my_kernels.py
    registry.load_plugins(["my_kernels"]); registry.configure("rms_norm=mine")

A module that is not found, or that raises while importing (a duplicate registration too), is one
`KernelSelectionError` line naming it and the cause. `$REPRO_PLUGINS` (comma separated) is loaded
when `kernels` is imported, before `$REPRO_KERNELS` applies; `--plugin MODULE` before `--kernels`.
"""
from __future__ import annotations

import functools
import importlib
import importlib.util
import os
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator

from kernels.calls import KernelCall, active, call, op_library, recording  # noqa: F401 (the registry's API)
from kernels.errors import KernelSelectionError

ENV_VAR = "REPRO_KERNELS"
PLUGINS_ENV_VAR = "REPRO_PLUGINS"  # modules to import before $REPRO_KERNELS applies
PREFERENCE = ("torch", "reference")  # default selection order
ALL = ("all", "*")
Availability = Callable[[], "tuple[bool, str]"]


def always() -> tuple[bool, str]:
    return True, "always available"


@dataclass(frozen=True)
class Source:
    """A provider as an op folder declares it: `where` is "module:function" (the module may be
    relative to the folder), imported on first use; None for one that `available` always refuses.
    `reference`: the provider that states this one's semantics in plain torch (what the independent
    third copy runs in its place, `references`)."""
    where: str | None
    available: Availability = always
    batch_invariant: bool = True
    reference: str = "reference"


class _Provider:
    """A registered provider: its function, or `where` = (module, name) to import it from when first asked."""
    __slots__ = ("_fn", "available", "batch_invariant", "reference", "where")

    def __init__(self, fn, available: Availability, batch_invariant: bool = True, reference: str = "reference"):
        self.where = tuple(fn.split(":", 1)) if isinstance(fn, str) else None
        self._fn = None if isinstance(fn, str) else fn
        self.available, self.batch_invariant, self.reference = available, bool(batch_invariant), reference

    @property
    def fn(self) -> Callable:
        if self._fn is None:
            if self.where is None:
                raise KernelSelectionError(f"this provider has no function: {self.available()[1]}")
            self._fn = getattr(importlib.import_module(self.where[0]), self.where[1])
        return self._fn


_providers: dict[str, dict[str, _Provider]] = {}
_groups: dict[str, list[str]] = {}
_selected: dict[str, str] = {}
_plugins: list[str] = []


def register(op: str, provider: str, fn: Callable | str | None, available: Availability | None = None,
             *, group: str | None = None, batch_invariant: bool = True, reference: str = "reference") -> None:
    """`fn` (a function, or "module:function" imported on first use) as `provider` for `op`; `available()`
    -> (bool, reason) is asked when needed; `batch_invariant=False`: a row's result may depend on the batch;
    `reference`: the provider stating its semantics in plain torch (`references`)."""
    table = _providers.setdefault(op, {})
    if provider in table:
        raise ValueError(f"provider {provider!r} registered twice for op {op!r}")
    table[provider] = _Provider(fn, available or always, batch_invariant, reference)
    if group is not None and op not in _groups.setdefault(group, []):
        _groups[group].append(op)


def declare(package: str, group: str, table: dict[str, dict[str, Source]]) -> None:
    """Register an op folder's table (op -> provider -> `Source`) in its order; `package`: its `__name__`."""
    for op, entries in table.items():
        for provider, src in entries.items():
            module, _, name = (src.where or "").partition(":")
            fn = f"{importlib.util.resolve_name(module, package)}:{name}" if src.where else None
            register(op, provider, fn, src.available, group=group, batch_invariant=src.batch_invariant,
                     reference=src.reference)


def where(op: str, provider: str) -> tuple[str, str] | None:
    """(module, function) a declared provider is imported from; None for one registered as a function."""
    return _entry(op, provider).where


def _entry(op: str, provider: str) -> _Provider:
    if provider not in _table(op):
        raise KernelSelectionError(f"unknown provider {provider!r} for kernel op {op!r}; registered: {', '.join(_table(op))}")
    return _providers[op][provider]


def batch_invariant(op: str, provider: str | None = None) -> bool:
    """Whether `provider` (default: the selected one) gives a row the same bits in any batch."""
    return _entry(op, selected(op) if provider is None else provider).batch_invariant


def references() -> dict[str, str]:
    """op -> the provider an independent reference runs for it now: the `reference` of the one
    selected (`reference` itself for every op but a fused one, whose semantics differ from the
    composition's: `gdn_attention`'s `xpu_semantics`)."""
    out = {}
    for op in ops():
        ref = _entry(op, selected(op)).reference
        if ref in _table(op):
            out[op] = ref
    return out


def load_plugins(names) -> list[str]:
    """Import plugin modules (each calls `register(...)`) in order: an iterable of names or one
    comma-separated string (as `$REPRO_PLUGINS`). Returns the names imported. One that is not
    found or fails to import raises `KernelSelectionError` (one line); those before it stay loaded."""
    if isinstance(names, str):
        names = names.split(",")
    loaded = []
    for name in (n.strip() for n in names):
        if not name:
            continue
        try:
            importlib.import_module(name)
        except Exception as e:
            missing = isinstance(e, ModuleNotFoundError) and e.name is not None and \
                (name == e.name or name.startswith(e.name + "."))
            why = f": no module named {e.name!r} on sys.path" if missing else f" failed to import: {_one_line(e)}"
            raise KernelSelectionError(f"kernel plugin {name!r}{why}") from e
        loaded.append(name)
        if name not in _plugins:
            _plugins.append(name)
    return loaded


def plugins() -> list[str]:
    """The plugin modules loaded so far, in order (a result records them, so a report can again)."""
    return list(_plugins)


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def ops() -> list[str]:
    return sorted(_providers)


def groups() -> dict[str, list[str]]:
    return {g: list(members) for g, members in _groups.items()}


def _table(op: str) -> dict[str, _Provider]:
    if op not in _providers:
        raise KernelSelectionError(f"unknown kernel op {op!r}; known ops: {', '.join(ops())}")
    return _providers[op]


def providers(op: str) -> dict[str, tuple[bool, str]]:
    """Provider name -> (available, reason) for `op`."""
    return {name: _availability(p) for name, p in _table(op).items()}


def _availability(p: _Provider) -> tuple[bool, str]:
    ok, reason = p.available()
    return bool(ok), str(reason)


def _check(op: str, provider: str) -> None:
    ok, reason = _availability(_entry(op, provider))
    if not ok:
        raise KernelSelectionError(f"provider {provider!r} for kernel op {op!r} is absent here: {reason}")


def _targets(name: str, provider: str) -> list[str]:
    """The ops that `name=provider` selects (an op, a group, or all)."""
    if name in _providers:
        return [name]
    if name in _groups or name in ALL:
        members = _groups[name] if name in _groups else ops()
        chosen = [op for op in members if provider in _providers[op]]
        if not chosen:
            raise KernelSelectionError(
                f"no op in {name!r} ({', '.join(members)}) has a provider {provider!r}")
        # A group takes the members the provider can run here (fla has no spec decode); an absent
        # provider for every member is refused with the first member's reason.
        present = [op for op in chosen if _availability(_entry(op, provider))[0]]
        return present or chosen[:1]
    raise KernelSelectionError(
        f"unknown kernel op or group {name!r}; ops: {', '.join(ops())}; "
        f"groups: {', '.join(sorted(_groups))}, all")


def _resolve(selections: dict[str, str]) -> dict[str, str]:
    """Validate every `name=provider` and expand groups, before anything is changed."""
    out: dict[str, str] = {}
    for name, provider in selections.items():
        for op in _targets(name, provider):
            _check(op, provider)
            out[op] = provider
    return out


def select(op: str, provider: str) -> None:
    """Select `provider` for `op` (or for every op of a group that has it)."""
    _selected.update(_resolve({op: provider}))


def selected(op: str) -> str:
    """The provider that runs `op` now."""
    table = _table(op)
    if op in _selected:
        return _selected[op]
    for name in PREFERENCE:
        if name in table and _availability(table[name])[0]:
            return name
    raise KernelSelectionError(f"kernel op {op!r} has no available default provider")


def impl(op: str) -> Callable:
    """The function of the selected provider (what op bodies call). While `recording()`, a
    provider from outside this package (a plugin) is called through `call`, so it is recorded."""
    fn = _providers[op][selected(op)].fn
    if active() and getattr(fn, "__module__", "").split(".")[0] != __name__.split(".")[0]:
        return functools.partial(call, fn)
    return fn


def parse(spec: str) -> dict[str, str]:
    """`"w8a8_linear=torch, gdn=reference"` -> {"w8a8_linear": "torch", "gdn": "reference"}."""
    out: dict[str, str] = {}
    for item in spec.split(","):
        item = item.strip()
        if not item:
            continue
        name, sep, provider = item.partition("=")
        if not sep or not name.strip() or not provider.strip():
            raise KernelSelectionError(f"bad kernel selection {item!r}: expected OP=PROVIDER")
        if name.strip() in out:  # the later one would silently win
            raise KernelSelectionError(f"kernel op {name.strip()!r} is chosen twice ({out[name.strip()]} and "
                                       f"{provider.strip()}): choose one")
        out[name.strip()] = provider.strip()
    return out


def configure(spec: str) -> dict[str, str]:
    """Apply a selection string; all-or-nothing. Returns the resulting op -> provider map."""
    resolved = _resolve(parse(spec))
    _selected.update(resolved)
    return resolved


def configure_from_env(environ: dict | None = None) -> dict[str, str]:
    """Import `$REPRO_PLUGINS`, then apply `$REPRO_KERNELS` (once, when `kernels` is imported):
    a plugin imports `kernels` itself, so a selection applied before it loaded could not name it."""
    env = os.environ if environ is None else environ
    plugins = env.get(PLUGINS_ENV_VAR, "")
    try:
        load_plugins(plugins)
    except KernelSelectionError as e:
        raise KernelSelectionError(f"${PLUGINS_ENV_VAR}={plugins!r}: {e}") from None
    spec = env.get(ENV_VAR, "")
    try:
        return configure(spec)
    except KernelSelectionError as e:
        raise KernelSelectionError(f"${ENV_VAR}={spec!r}: {e}") from None


def reset() -> None:
    """Forget explicit selections (back to defaults)."""
    _selected.clear()


@contextmanager
def using(**selections: str) -> Iterator[dict[str, str]]:
    """Temporarily select providers: `with using(moe="reference", gdn="torch"): ...`."""
    resolved = _resolve(selections)
    saved = {op: _selected.get(op) for op in resolved}
    _selected.update(resolved)
    try:
        yield resolved
    finally:
        for op, prev in saved.items():
            if prev is None:
                _selected.pop(op, None)
            else:
                _selected[op] = prev


@contextmanager
def defaults() -> Iterator[None]:
    """Forget every explicit selection for a while (CPU work in a run that selected GPU kernels)."""
    saved = dict(_selected)
    _selected.clear()
    try:
        yield
    finally:
        _selected.clear()
        _selected.update(saved)


def describe() -> dict[str, dict]:
    """op -> {"selected": name, "providers": {name: {"available": bool, "reason": str,
    "batch_invariant": bool}}}."""
    return {op: {"selected": selected(op),
                 "providers": {n: {"available": a, "reason": r, "batch_invariant": _table(op)[n].batch_invariant}
                               for n, (a, r) in providers(op).items()}}
            for op in ops()}
