"""Patch files: a change to the installed vLLM (a PR's hunk, a fork's local change) applied when the
seam has loaded it, so a run, hunt or report judges vLLM as patched (`--patch FILE`, repeatable).

The contract, all of it:

- A patch is one Python file with a docstring, whose first line names the change (`vLLM PR #53059:
  ...`), and a function `apply(vllm)` of one parameter. The file must not import vLLM itself: it is
  read, and checked, where vLLM is not installed.
- `apply` is called once the seam has loaded vLLM (`load.load()`), before any decision is made.
  `vllm` holds the loaded modules by the seam's names (`vllm.gpu_model_runner`, `vllm.gdn_attn`,
  `vllm.scheduler`, ...: the release module's `MODULES`), `vllm.version` (the installed release),
  and `vllm.replace(owner, name, value)`, the one way a patch changes anything: it sets
  `owner.name = value` and returns the value it replaced. It refuses a name `owner` does not have,
  so a hunk written against another release fails loudly instead of changing nothing.
- `apply` must replace at least one attribute; every replacement is undone when the run, hunt or
  rerun it was applied for ends, so one process can judge several patches in turn (a blind hunt
  tries each shipped patch on its minimal sequence).

Patches apply in the order given. A file that does not keep the contract is refused in one line
(exit 2) before any work starts; an `apply` that raises is refused the same way when it runs.
"""
from __future__ import annotations

import ast
import contextlib
import functools
import inspect
import types
from dataclasses import dataclass
from pathlib import Path

from ..errors import BadInput


@dataclass(frozen=True)
class Patch:
    path: str  # as the user named it
    title: str  # the docstring's first line
    apply: object  # the file's `apply(vllm)`

    @property
    def name(self) -> str:
        return Path(self.path).stem


def _refuse(path, why: str) -> BadInput:
    return BadInput(f"--patch {path}: {why} (a patch file defines `apply(vllm)` and a docstring naming the change: "
                    "repro/upstream/patches.py)")


@functools.lru_cache(maxsize=None)
def read(path: str) -> Patch:
    """The patch file at `path`, checked against the contract (module docstring) without vLLM."""
    p = Path(path)
    if p.suffix != ".py" or not p.is_file():
        raise _refuse(path, "not a Python file" if p.exists() else "no such file")
    try:
        source = p.read_text()
        tree = ast.parse(source, str(p))
    except (OSError, UnicodeDecodeError, SyntaxError) as e:
        raise _refuse(path, f"cannot be read as Python ({type(e).__name__}: {e})") from None
    doc = ast.get_docstring(tree)
    if not doc or not doc.strip():
        raise _refuse(path, "it has no docstring")
    for node in ast.walk(tree):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module or ""] if isinstance(node, ast.ImportFrom) else []
        if any(n.split(".")[0] == "vllm" for n in names):
            raise _refuse(path, f"it imports {names[0]} (reach vLLM through `apply`'s argument)")
    scope: dict = {"__name__": f"repro_patch_{p.stem}", "__file__": str(p)}
    try:
        exec(compile(tree, str(p), "exec"), scope)
    except Exception as e:  # the user's file: any error is theirs, said in one line
        raise _refuse(path, f"running it raised {type(e).__name__}: {e}") from None
    fn = scope.get("apply")
    if not callable(fn) or len(inspect.signature(fn).parameters) != 1:
        raise _refuse(path, "it has no function `apply(vllm)` of one parameter")
    return Patch(path, doc.strip().splitlines()[0], fn)


class Patching(types.SimpleNamespace):
    """What `apply(vllm)` is given (module docstring); `undo()` restores every replacement."""

    def __init__(self, up):
        super().__init__(**vars(up))
        self._undo: list = []

    def replace(self, owner, name: str, value):
        """Set `owner.name = value` (recorded for `undo`); returns the value it replaced, as stored
        on `owner` (a staticmethod stays a staticmethod: `inspect.getattr_static`)."""
        if not hasattr(owner, name):
            raise AttributeError(f"{getattr(owner, '__name__', owner)!s} has no attribute {name!r} in vLLM "
                                 f"{self.version}")
        old = inspect.getattr_static(owner, name)
        self._undo.append((owner, name, old))
        setattr(owner, name, value)
        return old

    def undo(self) -> None:
        while self._undo:
            owner, name, old = self._undo.pop()
            setattr(owner, name, old)

    @property
    def replaced(self) -> int:
        return len(self._undo)


@contextlib.contextmanager
def applied(up, paths):
    """vLLM (`up`, `load.load()`) with the patch files `paths` applied, in order, for the duration."""
    done: list[Patching] = []
    try:
        for path in paths:
            patch, patching = read(path), Patching(up)
            done.append(patching)
            try:
                patch.apply(patching)
            except Exception as e:  # the user's hunk: refused in one line, vLLM restored
                raise _refuse(path, f"apply failed on vLLM {up.version}: {type(e).__name__}: {e}") from None
            if not patching.replaced:
                raise _refuse(path, "apply replaced nothing (every change goes through vllm.replace)")
        yield up
    finally:
        for patching in reversed(done):
            patching.undo()


SHIPPED = Path(__file__).resolve().parents[2] / "patches"


def shipped() -> list[str]:
    """The patch files this repository ships (`patches/`), by path."""
    return sorted(str(p) for p in SHIPPED.glob("*.py")) if SHIPPED.is_dir() else []
