"""CPU tape: an emulation of device graph capture and replay for machines without one.

Capture runs a piece once under a `TorchDispatchMode` and records every aten op with the very
tensor objects it was called on. Tensors an op newly allocates are moved into a pool arena
(`pool.Arena`), so their addresses are fixed and a later capture can reuse freed bytes. Replay
re-runs the recorded ops in order on the same objects and writes each result back into the
recorded output tensor. So, like a device graph, a replay:
- reads its inputs from the addresses seen at capture (a tensor handed in fresh is not seen);
- repeats the Python-side decisions made at capture (nothing in Python runs at replay);
- writes its outputs into the same memory every time.

Custom ops defined in Python (every `repro::` op, `kernels/_library.py`; a `torch.library.custom_op`
of another namespace) are recorded *below*:
their body runs once, at capture, under the recorder, and the aten ops it issues are what the
tape holds. The custom op itself is never re-run, exactly as a device graph holds the kernels a
body launched and not the body: a host read inside the op, a per-shape cache, and the provider
`kernels.registry` picked are all frozen at capture (a provider selected later does not replay).

Outputs keep the aliasing a device allocator gives them: a result that is a view of an op's input,
or of a tensor the op keeps alive itself (a workspace: its storage is held beyond the op's
results), stays that tensor; only a genuinely new allocation is placed in the arena.

Host interaction a device capture refuses is refused here with the same wording and a `kind`
(`refusals.py`: host syncs, data-dependent shapes, copies to or from pageable host memory,
custom-op bodies included). The tape does not model streams.
"""
from __future__ import annotations

import contextlib
import weakref
from collections import Counter
from dataclasses import dataclass
from itertools import groupby

import torch
from torch.autograd.profiler import record_function
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_flatten, tree_unflatten

from ..errors import BadInput
from .pool import Arena
from .refusals import SYNC_OPS, CaptureError, check, collection_paused, host_methods_refused

aten = torch.ops.aten

DATA_DEPENDENT = SYNC_OPS  # the same set by its other name: ops whose output the host must wait for
# Allocation-only ops: nothing to redo at replay (their bytes are written by later ops).
ALLOC_ONLY = {
    aten.empty.memory_format,
    aten.empty_strided.default,
    aten.new_empty.default,
    aten.new_empty_strided.default,
    aten.empty_like.default,
}
# Namespaces whose ops are kernels (recorded as they are), never Python bodies to record below.
_KERNEL_NAMESPACES = {"aten", "prim", "prims", "c10d", "_c10d_functional", "_c10d_functional_autograd"}
_BACKEND_KEYS = {"cpu": "CPU", "cuda": "CUDA", "xpu": "XPU"}


def _sptr(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


_MUTATES: dict = {}


def _mutates(func) -> bool:
    hit = _MUTATES.get(func)
    if hit is None:
        schema = getattr(func, "_schema", None)
        hit = _MUTATES[func] = bool(schema) and any(a.alias_info is not None and a.alias_info.is_write
                                                    for a in schema.arguments)
    return hit


def _arg_tensors(args, kwargs) -> list[torch.Tensor]:
    """The tensors among an op's arguments, in `tree_flatten` order. An aten schema nests at most
    one list deep (`Tensor[]`, `Tensor?[]`): walked here directly, since `tree_flatten` cost more
    than the recording itself on small ops (a third of the tape's capture time); anything deeper
    goes through it."""
    out = []
    for a in (*args, *kwargs.values()):
        if isinstance(a, torch.Tensor):
            out.append(a)
        elif type(a) in (list, tuple) and not any(isinstance(x, (list, tuple, dict)) for x in a):
            out += [x for x in a if isinstance(x, torch.Tensor)]
        elif isinstance(a, (list, tuple, dict)):
            return [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
    return out


def _flatten(result) -> tuple[list, object]:
    """`tree_flatten` of an op's result, directly for a tensor or a plain tuple or list of tensors."""
    if isinstance(result, torch.Tensor):
        return [result], None
    if (type(result) is tuple or type(result) is list) and all(isinstance(t, torch.Tensor) for t in result):
        return list(result), type(result)
    return tree_flatten(result)


def _unflatten(flat: list, spec):
    if spec is None:
        return flat[0]
    if spec is tuple or spec is list:
        return spec(flat)
    return tree_unflatten(flat, spec)


def _is_collective(func) -> bool:
    """`c10d::` collectives (`dist.all_reduce` dispatches `c10d.allreduce_`) write their tensor list in
    place without declaring it, and return a Work that the caller waits on outside dispatch."""
    return getattr(func, "namespace", None) == "c10d"


def _python_body(func) -> bool:
    """A custom op whose kernel is Python (a `repro::` op, or a `torch.library.custom_op`): record
    what its body issues."""
    ns = getattr(func, "namespace", None)
    if ns is None or ns in _KERNEL_NAMESPACES:
        return False
    if ns == "repro":
        return True
    from torch._library.custom_ops import OPDEFS
    return func._schema.name in OPDEFS


def _held_elsewhere(t: torch.Tensor, results_on_storage: int) -> bool:
    """The storage of an op's result has owners besides the op's results: the op returned a view
    of a tensor it keeps (a workspace), not a new allocation. (+1: the storage object asked here.)"""
    return torch._C._storage_Use_Count(t.untyped_storage()._cdata) > results_on_storage + 1


def _wait_works(result) -> None:
    for w in tree_flatten(result)[0]:
        if not isinstance(w, torch.Tensor) and hasattr(w, "wait"):
            w.wait()


@dataclass
class _Op:
    func: object
    args: tuple
    kwargs: dict
    fresh: list[tuple[int, torch.Tensor]]  # (index in flattened result, recorded output tensor)
    mutates: bool
    collective: bool = False
    workspace: bool = False  # returned a view of memory it keeps: re-run it, nothing to copy
    within: str | None = None  # the custom op whose body issued it (innermost), for profiles


class TapeGraph:
    """The recorded ops of one capture; `replay()` re-runs them on the captured tensors."""

    def __init__(self, arena: Arena):
        self.arena = arena
        self.ops: list[_Op] = []
        self.blocks: list[tuple[int, int]] = []  # arena blocks this capture took
        self.sizes: dict[tuple[int, int], int] = {}  # their sizes when taken (offsets are reused)

    def replay(self) -> None:
        with torch.inference_mode():
            if not torch._C._autograd._profiler_enabled():
                self._run(self.ops)
                return
            # Under a profiler, the ops a custom op's body issued are grouped under its name (a
            # device profile names the kernels; here the aten ops and the op they came from).
            for within, ops in groupby(self.ops, key=lambda op: op.within):
                with record_function(within) if within else contextlib.nullcontext():
                    self._run(ops)

    @staticmethod
    def _run(ops) -> None:
        for op in ops:
            if not op.fresh and not op.mutates and not op.workspace:
                continue  # a view: it already aliases the right bytes
            result = op.func(*op.args, **op.kwargs)
            if op.collective:
                _wait_works(result)  # replay completes the collective before the next op reads it
            if op.fresh:
                flat, _ = _flatten(result)
                for i, target in op.fresh:
                    target.copy_(flat[i])

    def __len__(self) -> int:
        return len(self.ops)

    def kernel_names(self) -> list[str]:
        return [str(op.func) for op in self.ops]


class _Recorder(TorchDispatchMode):
    def __init__(self, graph: TapeGraph, device: torch.device):
        super().__init__()
        self.graph = graph
        self.key = torch._C.DispatchKeySet(getattr(torch._C.DispatchKey, _BACKEND_KEYS[device.type]))
        self.within: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        check(func, args, kwargs)
        if _python_body(func):
            # Run the body's kernel (below this mode's key) with the recorder active again, so the
            # ops it issues are recorded and the op itself is not.
            self.within.append(str(func))
            try:
                with self:
                    return func.redispatch(self.key, *args, **kwargs)
            finally:
                self.within.pop()
        result = func(*args, **kwargs)
        in_ptrs = {_sptr(a) for a in _arg_tensors(args, kwargs)}
        flat, spec = _flatten(result)
        per_storage = None  # distinct result tensors per storage, counted when first needed
        fresh: list[tuple[int, torch.Tensor]] = []
        workspace = False
        for i, t in enumerate(flat):
            if not isinstance(t, torch.Tensor) or _sptr(t) in in_ptrs or t.device.type != "cpu":
                continue  # aliases an input (a view, an in-place op's self, a no-op `to`)
            if per_storage is None and t.numel():
                outs = {id(u): u for u in flat if isinstance(u, torch.Tensor)}
                per_storage = Counter(_sptr(u) for u in outs.values()) if len(outs) > 1 else {_sptr(t): 1}
            if t.numel() and _held_elsewhere(t, per_storage[_sptr(t)]):
                workspace = True  # a view of memory the op keeps: the allocator gives no new block
                continue
            pooled, block = self.graph.arena.empty_like_strided(tuple(t.shape), tuple(t.stride()), t.dtype)
            if t.numel():
                pooled.copy_(t)
            self.graph.blocks.append(block)
            self.graph.sizes[block] = self.graph.arena.live[block]
            flat[i] = pooled
            fresh.append((i, pooled))
        if func in ALLOC_ONLY:
            fresh = []  # allocation only: replay has nothing to write
        coll = _is_collective(func)
        self.graph.ops.append(_Op(func, args, kwargs, fresh, _mutates(func) or coll, coll, workspace,
                                  self.within[-1] if self.within else None))
        return _unflatten(flat, spec)


class TapeProvider:
    """The graph provider interface on the CPU tape (see `graphs.base` for the contract)."""

    name = "cpu-tape"
    supports_streams = False

    def __init__(self, device="cpu"):
        self.device = torch.device(device)

    def new_pool(self, name="pool") -> Arena:
        return Arena(self.device, name)

    def capture(self, fn, pool: Arena, stream=None):
        if stream is not None:
            raise BadInput("the CPU tape has no streams")
        if pool.released:
            raise CaptureError("released-pool", f"a capture into pool {pool.name!r}",
                               "every graph captured into it was released; capture into a new pool")
        graph = TapeGraph(pool)
        pool.add_user()
        weakref.finalize(graph, pool.drop_user)
        with (torch.inference_mode(), collection_paused(), host_methods_refused(_Recorder),
              _Recorder(graph, self.device)):
            out = fn()
        return graph, out

    def release(self, graph: TapeGraph, tensors) -> None:
        """Hand the pool blocks behind `tensors` back (they stay readable: a weak reference)."""
        for block in _blocks_under(graph, tensors):
            graph.arena.release(block)

    def release_all_but(self, graph: TapeGraph, keep) -> None:
        """End of capture: intermediates go back to the pool, blocks under `keep` stay owned."""
        kept = set(_blocks_under(graph, keep))
        for block in graph.blocks:
            if block not in kept:
                graph.arena.release(block)

    def escape(self):
        """Work done inside this context is not recorded (a queue the capture does not follow)."""
        return _disable_current_modes()

    def synchronize(self) -> None:
        pass

    def written_spans(self, graph: TapeGraph) -> list[tuple[int, int]]:
        """Bytes a replay of `graph` writes: every pool block its capture took."""
        return [graph.arena.span_of(b, graph.sizes.get(b)) for b in graph.blocks]


def _blocks_under(graph: TapeGraph, tensors) -> list[tuple[int, int]]:
    found = []
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            continue
        p = t.data_ptr()
        for block in graph.blocks:
            seg, off = block
            base = graph.arena.segments[seg].data_ptr() + off
            if base <= p < base + graph.arena.live.get(block, 0) or (p == base):
                found.append(block)
    return found
