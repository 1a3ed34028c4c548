"""CPU tape: an emulation of device graph capture and replay for machines without one.

Capture runs a piece once under a `TorchDispatchMode` and records every aten / custom op
with the very tensor objects it was called on. Tensors an op creates are moved into a pool
arena (`pool.Arena`), so their addresses are fixed and a later capture can reuse freed bytes.
Replay re-runs the recorded ops in order on the same objects and writes each result back into
the recorded output tensor. So, like a device graph, a replay:
- reads its inputs from the addresses seen at capture (a tensor handed in fresh is not seen);
- repeats the Python-side decisions made at capture (nothing in Python runs at replay);
- writes its outputs into the same memory every time.
It does not model streams. Data-dependent ops (`.item()`, `nonzero`) are refused at capture,
as a device capture would fail or bake in a host value.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_flatten, tree_unflatten

from ..errors import BadInput
from .pool import Arena

aten = torch.ops.aten

# Ops whose result is a host value or whose output shape depends on data: a device graph cannot
# hold them (CUDA raises on the sync; on XPU the host value is silently frozen).
DATA_DEPENDENT = {
    aten._local_scalar_dense.default,
    aten.item.default,
    aten.nonzero.default,
    aten.masked_select.default,
    aten.is_nonzero.default,
    aten.equal.default,
    aten.unique_consecutive.default,
    aten._unique2.default,
    aten.repeat_interleave.Tensor,
}
# Allocation-only ops: nothing to redo at replay (their bytes are written by later ops).
ALLOC_ONLY = {
    aten.empty.memory_format,
    aten.empty_strided.default,
    aten.new_empty.default,
    aten.new_empty_strided.default,
    aten.empty_like.default,
}


class CaptureError(BadInput):
    """An op a graph cannot capture."""


def _sptr(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _mutates(func) -> bool:
    schema = getattr(func, "_schema", None)
    return bool(schema) and any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)


def _is_collective(func) -> bool:
    """`c10d::` collectives (`dist.all_reduce` dispatches `c10d.allreduce_`) write their tensor list in
    place without declaring it, and return a Work that the caller waits on outside dispatch."""
    return getattr(func, "namespace", None) == "c10d"


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


class TapeGraph:
    """The recorded ops of one capture; `replay()` re-runs them on the captured tensors."""

    def __init__(self, arena: Arena):
        self.arena = arena
        self.ops: list[_Op] = []
        self.blocks: list[tuple[int, int]] = []  # arena blocks this capture took

    def replay(self) -> None:
        with torch.inference_mode():
            for op in self.ops:
                if not op.fresh and not op.mutates:
                    continue  # a view: it already aliases the right bytes
                result = op.func(*op.args, **op.kwargs)
                if op.collective:
                    _wait_works(result)  # replay completes the collective before the next op reads it
                if op.fresh:
                    flat, _ = tree_flatten(result)
                    for i, target in op.fresh:
                        target.copy_(flat[i])

    def __len__(self) -> int:
        return len(self.ops)

    def kernel_names(self) -> list[str]:
        return [str(op.func) for op in self.ops]


class _Recorder(TorchDispatchMode):
    def __init__(self, graph: TapeGraph):
        super().__init__()
        self.graph = graph

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in DATA_DEPENDENT:
            raise CaptureError(
                f"{func} inside a captured piece: it needs a host value or a data-dependent shape, "
                "which a device graph cannot replay (move it out of the piece or make it static)")
        result = func(*args, **kwargs)
        if func in ALLOC_ONLY:
            fresh_ok = True
        else:
            fresh_ok = False
        in_ptrs = {_sptr(a) for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)}
        flat, spec = tree_flatten(result)
        fresh: list[tuple[int, torch.Tensor]] = []
        for i, t in enumerate(flat):
            if not isinstance(t, torch.Tensor) or _sptr(t) in in_ptrs or t.device.type != "cpu":
                continue  # aliases an input (a view, an in-place op's self, a no-op `to`)
            pooled, block = self.graph.arena.empty_like_strided(tuple(t.shape), tuple(t.stride()), t.dtype)
            if t.numel():
                pooled.copy_(t)
            self.graph.blocks.append(block)
            flat[i] = pooled
            fresh.append((i, pooled))
        if fresh_ok:
            fresh = []  # allocation only: replay has nothing to write
        coll = _is_collective(func)
        self.graph.ops.append(_Op(func, args, kwargs, fresh, _mutates(func) or coll, coll))
        return tree_unflatten(flat, spec)


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
        graph = TapeGraph(pool)
        with torch.inference_mode(), _Recorder(graph):
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
        return [graph.arena.span_of(b) for b in graph.blocks]


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
