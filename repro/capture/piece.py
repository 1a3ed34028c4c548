"""One capture primitive, in the spirit of vLLM's `CUDAGraphWrapper` and nano-vllm's capture loop.

`Piece` says how one runnable becomes a graph: a warm-up call (through the capture-time lint when
the runner asks), the capture into a pool on a stream, then its outputs held strongly (the
intermediates go back to the pool) or by weak reference (vLLM's `weak_ref_output`: the pool may
hand their bytes to a later capture). `IslandRunner` composes it the way the `moe` island and the
tensor-parallel slice are run: a static `input_ids` buffer addressed by slicing, batches padded
with zeros to the next capture size, one graph per size captured lazily into one shared pool.
The decode chain's runner (`runner.py`) composes the same `Piece` for each of its pieces.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable

import torch

from ..control.dispatch import DEFAULT_SIZES, pad_size

@dataclass
class Graph:
    """One piece captured at one size, and the outputs its replays write."""
    graph: object
    outputs: dict

    def replay(self) -> dict:
        self.graph.replay()
        return self.outputs


def _call(fn):
    return fn()


class Piece:
    """How one runnable is captured (see the module docstring). `warmup(fn)` runs the warm-up call
    (default: plain); `around()` is entered for the capture itself (e.g. the communicator's
    capturing flag); `relaxed` lets work on streams the capture does not follow be legal."""

    def __init__(self, provider, pool, *, weak: bool = False, warmup: Callable | None = None,
                 stream=None, relaxed: bool = False, around=contextlib.nullcontext):
        self.provider, self.pool, self.weak = provider, pool, weak
        self.warmup, self.stream, self.relaxed, self.around = warmup or _call, stream, relaxed, around

    def capture(self, fn) -> Graph:
        self.warmup(fn)
        kw = {"capture_error_mode": "relaxed"} if self.relaxed and self.provider.supports_streams else {}
        with self.around():
            g, out = self.provider.capture(fn, self.pool, self.stream, **kw)
        return Graph(g, self._weaken(g, out) if self.weak else self._keep(g, out))

    def _keep(self, g, out: dict) -> dict:
        self.provider.release_all_but(g, list(out.values()))
        return out

    def _weaken(self, g, out: dict) -> dict:
        weak = getattr(self.provider, "weak_alias", None)
        if weak is None:  # the tape: the tensors stay, their blocks go back to the pool
            self.provider.release_all_but(g, [])
            return out
        aliased = {k: weak(v) for k, v in out.items()}
        return out if any(v is None for v in aliased.values()) else aliased  # no weak tensors here


class IslandRunner:
    """One island body `body(input_ids) -> dict` as one graph per padded size (module docstring).
    `run(token_ids)` returns the outputs (the captured ones, padded, or an eager call's above the
    largest size) and the live row count; read them before the next `run`."""

    def __init__(self, body, provider, sizes=DEFAULT_SIZES, max_tokens: int = 64, around=contextlib.nullcontext):
        self.body, self.provider, self.sizes = body, provider, tuple(sorted(sizes))
        self.input_ids = torch.zeros(max(max_tokens, self.sizes[-1]), dtype=torch.long, device=provider.device)
        self.piece = Piece(provider, provider.new_pool("shared"), around=around)
        self.graphs: dict[int, Graph] = {}
        self.replays = self.captures = 0

    def run(self, token_ids) -> tuple[dict, int]:
        n = len(token_ids)
        size = pad_size(n, self.sizes)
        with torch.inference_mode():
            src = torch.as_tensor(token_ids, dtype=torch.long)
            self.input_ids[:n].copy_(src, non_blocking=src.is_pinned())  # pinned (prepared): no stream sync
            if size is None:
                return self.body(self.input_ids[:n]), n
            self.input_ids[n:size].zero_()
            if size not in self.graphs:
                ids = self.input_ids[:size]
                self.graphs[size] = self.piece.capture(lambda: self.body(ids))
                self.captures += 1
            self.replays += 1
            return self.graphs[size].replay(), n

    def release(self) -> None:
        """Drop every graph (a live graph holding a captured collective hangs `destroy_process_group`)."""
        self.provider.synchronize()
        for g in self.graphs.values():
            reset = getattr(g.graph, "reset", None)
            if callable(reset):
                reset()
        self.graphs.clear()
        self.piece.pool = self.provider.new_pool("shared")  # the old one's graphs are all released


class OverIslandRunner:
    """A runner built on an `IslandRunner` (`self.runner`): its replay and capture counts."""

    runner: IslandRunner

    @property
    def replays(self) -> int:
        return self.runner.replays

    @property
    def captures(self) -> int:
        return self.runner.captures
