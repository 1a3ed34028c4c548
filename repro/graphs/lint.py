"""Capture-time lint: undeclared writes, checked around any call the runner chooses.

Two findings:
- `mutates-input`: an op whose schema writes a tensor (positional or keyword argument) that the
  island neither declared as its state nor created itself;
- `undeclared-mutation`: a custom op (non-aten namespace) that changes bytes its schema does not
  mark as written (what `torch.library.opcheck` calls an undeclared mutation; a compiler or a graph
  runtime that trusts the schema gets the data flow wrong). The check covers the *whole storage*
  behind every tensor argument, keyword arguments and tensor lists included, not only the bytes of
  the argument's view: a write through one argument's storage into a neighbouring region (a buffer
  sliced from the same allocation) is reported, naming the argument and the byte range. Bytes an
  argument declared as written covers are allowed; its storage outside the view is not.

Cost: each custom op call clones the storages of its tensor arguments (weights included) once, so
run the lint on a schedule, not on every call. The API is for the runner to decide when:

    lint = Lint("submod1", declared_state)        # a TorchDispatchMode, usable around any call
    with lint:
        out = piece()
    lint.problems                                 # [(kind, detail), ...]

    schedule = LintSchedule(every=16)             # first call of each key, then every 16th step
    if schedule.due(("submod1", size), step):
        out, problems = lint_call("submod1", declared_state, piece)

Warm-up calls are eager on every provider, so the lint sees the same ops on the tape and on a GPU.
"""
from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

UNDECLARED = "undeclared-mutation"  # the finding kind: an op writes what its schema does not declare

_KERNEL_NAMESPACES = ("aten", "prim", "prims")


def _written(func) -> set[int]:
    schema = getattr(func, "_schema", None)
    if schema is None:
        return set()
    return {i for i, a in enumerate(schema.arguments) if a.alias_info is not None and a.alias_info.is_write}


def _named_args(func, args, kwargs) -> list[tuple[int, str, object]]:
    """(schema index, name, value) of every argument given, positional or keyword."""
    schema = getattr(func, "_schema", None)
    if schema is None:
        return [(i, f"#{i}", a) for i, a in enumerate(args)] + [(-1, k, v) for k, v in kwargs.items()]
    out = []
    for i, a in enumerate(schema.arguments):
        if i < len(args):
            out.append((i, a.name, args[i]))
        elif a.name in kwargs:
            out.append((i, a.name, kwargs[a.name]))
    return out


def _tensors(x):
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, (list, tuple)):
        for y in x:
            yield from _tensors(y)


def _sptr(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _storage_bytes(t: torch.Tensor) -> torch.Tensor:
    """The whole storage behind `t`, as uint8 (a view: no copy)."""
    s = t.untyped_storage()
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(s, 0, (s.nbytes(),), (1,))


def _view_bytes(t: torch.Tensor, nbytes: int) -> torch.Tensor:
    """bool [nbytes]: the bytes of its storage that the view `t` covers."""
    mask = torch.zeros(nbytes, dtype=torch.bool, device=t.device)
    e = t.element_size()
    if t.numel() == 0 or nbytes < e:
        return mask
    if t.is_contiguous():
        mask[t.storage_offset() * e: (t.storage_offset() + t.numel()) * e] = True
        return mask
    elems = torch.arange(nbytes // e, device=t.device).as_strided(t.shape, t.stride(), t.storage_offset())
    mask[: (nbytes // e) * e].view(-1, e)[elems.reshape(-1)] = True
    return mask


def _ranges(changed: torch.Tensor, limit: int = 3) -> str:
    """'[a, b), ...' of the True runs of a bool vector (at most `limit` shown)."""
    idx = changed.nonzero().flatten().tolist()
    runs: list[list[int]] = []
    for i in idx:
        if runs and runs[-1][1] == i:
            runs[-1][1] = i + 1
        else:
            runs.append([i, i + 1])
    shown = ", ".join(f"[{a}, {b})" for a, b in runs[:limit])
    return shown + (f" and {len(runs) - limit} more" if len(runs) > limit else "")


class Lint(TorchDispatchMode):
    """Reports undeclared writes of the ops run while it is active (see the module docstring).
    `declared`: name -> tensor the island declares as its state (written legitimately)."""

    def __init__(self, island: str, declared: dict[str, torch.Tensor]):
        super().__init__()
        self.island = island
        self.declared = {t.untyped_storage().data_ptr(): n for n, t in declared.items()}
        self.created: set[int] = set()
        self.problems: list[tuple[str, str]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        named = _named_args(func, args, kwargs)
        written = _written(func)
        custom = func.namespace not in _KERNEL_NAMESPACES
        snaps = self._snapshot(named) if custom else {}
        out = func(*args, **kwargs)
        for i, name, value in named:
            if i not in written:
                continue
            for t in _tensors(value):
                p = _sptr(t)
                if p not in self.declared and p not in self.created:
                    which = f"argument {i}" if i < len(args) else f"keyword argument `{name}`"
                    self.problems.append(("mutates-input", f"{func} writes {which}, which {self.island} does not "
                                          "own or declare as state"))
        if snaps:
            self._compare(func, named, written, snaps)
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self.created.add(_sptr(t))
        return out

    @staticmethod
    def _snapshot(named) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
        """storage address -> (its bytes as a uint8 view, a copy taken before the op)."""
        snaps = {}
        for _, _, value in named:
            for t in _tensors(value):
                p = _sptr(t)
                if p not in snaps and t.untyped_storage().nbytes():
                    live = _storage_bytes(t)
                    snaps[p] = (live, live.clone())
        return snaps

    def _compare(self, func, named, written, snaps) -> None:
        allowed: dict[int, torch.Tensor] = {}  # storage -> bytes a declared-written view covers
        for i, _, value in named:
            if i in written:
                for t in _tensors(value):
                    live, _ = snaps[_sptr(t)]
                    allowed[_sptr(t)] = allowed.get(_sptr(t), torch.zeros_like(live, dtype=torch.bool)) | \
                        _view_bytes(t, live.numel())
        reported: set[int] = set()
        for i, name, value in named:
            for t in _tensors(value):
                p = _sptr(t)
                if p in reported or p not in snaps:
                    continue
                live, before = snaps[p]
                changed = live != before
                if p in allowed:
                    changed &= ~allowed[p]
                if not bool(changed.any()):
                    continue
                reported.add(p)
                inside = changed & _view_bytes(t, live.numel())
                if i not in written and bool(inside.any()):
                    detail = (f"{func} changes `{name}` but its schema does not declare it mutated "
                              "(torch.library.opcheck reports this)")
                else:
                    detail = (f"{func} writes bytes {_ranges(changed & ~inside)} of `{name}`'s storage, outside "
                              f"its view (bytes {_ranges(_view_bytes(t, live.numel()))}): a neighbouring buffer "
                              "its schema does not name")
                self.problems.append((UNDECLARED, detail))


def lint_call(island: str, declared: dict[str, torch.Tensor], fn):
    """Run `fn()` under a fresh `Lint`: (its result, the problems found)."""
    lint = Lint(island, declared)
    with lint:
        out = fn()
    return out, lint.problems


class LintSchedule:
    """When to lint: the first call of every key (a piece and its padded size, say), then every
    `every` steps (0: first calls only). The runner asks `due(key, step)` before a call."""

    def __init__(self, every: int = 0):
        if every < 0:
            raise ValueError(f"LintSchedule(every={every}): must be >= 0")
        self.every = every
        self.seen: set = set()

    def due(self, key, step: int) -> bool:
        first = key not in self.seen
        self.seen.add(key)
        return first or (self.every > 0 and step % self.every == 0)
