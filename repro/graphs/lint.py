"""Capture-time lint, run over a piece's warm-up call (eager, on every provider).

It reports ops whose schema mutates a tensor the island did not declare as its state or its
own intermediate, and custom ops (non-aten namespaces) that change an argument their schema
does not mark as written (what `torch.library.opcheck` calls an undeclared mutation; a
compiler or a graph runtime that trusts the schema gets the data flow wrong).
"""
from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


def _written(func) -> set[int]:
    schema = getattr(func, "_schema", None)
    if schema is None:
        return set()
    return {i for i, a in enumerate(schema.arguments) if a.alias_info is not None and a.alias_info.is_write}


class Lint(TorchDispatchMode):
    def __init__(self, island: str, declared: dict[str, torch.Tensor]):
        super().__init__()
        self.island = island
        self.declared = {t.untyped_storage().data_ptr(): n for n, t in declared.items()}
        self.created: set[int] = set()
        self.problems: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        custom = func.namespace not in ("aten", "prim", "prims")
        written = _written(func)
        before = {}
        if custom:
            for i, a in enumerate(args):
                if isinstance(a, torch.Tensor) and i not in written:
                    before[i] = a.clone()
        out = func(*args, **kwargs)
        for i in written:
            a = args[i] if i < len(args) else None
            if isinstance(a, torch.Tensor):
                p = a.untyped_storage().data_ptr()
                if p not in self.declared and p not in self.created:
                    self.problems.append(("mutates-input",
                                          f"{func} writes argument {i}, which {self.island} does not own or declare as state"))
        for i, old in before.items():
            if not _same_bytes(old, args[i]):
                name = func._schema.arguments[i].name
                self.problems.append(("undeclared-mutation", f"{func} changes `{name}` but its schema does not "
                                      "declare it mutated (torch.library.opcheck reports this)"))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self.created.add(t.untyped_storage().data_ptr())
        return out


def _same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise (an uninitialised buffer may hold NaNs, which never compare equal)."""
    if a.numel() == 0:
        return True
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))
