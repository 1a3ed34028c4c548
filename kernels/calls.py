"""The calls into a kernel's own package, recorded on demand.

A kernel finding (nondeterminism, batch variance) is reported with a script that imports only
torch and the kernel's own package. The boundary is `call(fn, ...)`: a provider calls its
package's function (FLA's, a wheel's torch op) through it, and `registry.impl` calls a plugin
through it. Under `recording()` each call is kept with its inputs before, its result and its
tensor arguments after (what it wrote). `op_library` names the modules that register a wheel's op
namespace, so a script can import them before it looks the op up. The registry re-exports these.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator

_op_libraries: dict[str, tuple[str, ...]] = {}


def op_library(namespace: str, *modules: str) -> None:
    """Importing `modules` registers the torch ops of `namespace` (`torch.ops.<namespace>`)."""
    _op_libraries[namespace] = modules


@dataclass
class KernelCall:
    fn: Callable
    args: tuple
    kwargs: dict
    result: object
    after: tuple

    @property
    def op(self) -> tuple[str, str] | None:
        """(namespace, name) when `fn` is a torch op (`torch.ops.<namespace>.<name>`), else None."""
        qualified = getattr(self.fn, "_qualified_op_name", None) or getattr(self.fn, "_name", None)
        if not isinstance(qualified, str) or "::" not in qualified:
            return None
        namespace, name = qualified.split("::", 1)
        return namespace, name.split(".")[0]

    @property
    def where(self) -> tuple[str, str, tuple[str, ...]]:
        """(module to import, attribute path in it, modules to import first) that find `fn` again."""
        if self.op is not None:
            namespace, name = self.op
            return "torch", f"ops.{namespace}.{name}", _op_libraries.get(namespace, ())
        return self.fn.__module__, self.fn.__qualname__, ()

    @property
    def name(self) -> str:
        module, path, _ = self.where
        return f"{module}.{path}"


_recording: list | None = None


@contextmanager
def recording() -> Iterator[list]:
    """Record every `call` made inside (a list of `KernelCall`, in call order)."""
    global _recording
    saved, _recording = _recording, []
    try:
        yield _recording
    finally:
        _recording = saved


def _snapshot(tree):
    import torch
    from torch.utils._pytree import tree_map
    return tree_map(lambda v: v.detach().clone() if isinstance(v, torch.Tensor) else v, tree)


def call(fn: Callable, *args, **kwargs):
    """Call `fn`, a function of a kernel's own package; recorded under `recording()`."""
    if _recording is None:
        return fn(*args, **kwargs)
    before, kw = _snapshot(args), _snapshot(kwargs)
    out = fn(*args, **kwargs)
    _recording.append(KernelCall(fn, before, kw, _snapshot(out), _snapshot(args)))
    return out


def active() -> bool:
    """Whether a `recording()` is open (then `registry.impl` routes package calls through `call`)."""
    return _recording is not None

