"""Capturing the decode chain for one graph key, per runtime mode, the way vLLM captures it.

- FULL: submod0 -> gdn_core -> submod1 as one graph over the persistent buffers (the GDN core's
  metadata included: a replay reads whatever the builder's buffers hold), outputs held by weak
  reference.
- PIECEWISE: graph 0 (submod0) and graph 1 (submod1) with the splitting op `gdn_core` eager
  between them; graph 0's outputs are held strongly (they feed the splitting op and graph 1), or
  weakly under `weak_first_output`; an eager family leaves its piece uncaptured.

Around each capture the capture-time checks run: a warm-up through the lint (an undeclared
mutation), Python attributes compared before and after (a value set during capture is frozen into
the graph), the forward-context values the capture read (a later step that differs replays the
frozen value), and, piecewise, which of graph 0's held outputs graph 1's replay writes over.

A key is captured on the first step that dispatches it, into one pool the runner's graphs share
(`ChainCapture.entry`), and again only where a forward-context value its graphs froze has changed
and the runner's options say `recapture`; `forget` drops a size's graphs so its next step captures
them again.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import torch

from ..graphs.lint import Lint
from ..islands.gdn import Submod1
from ..control.dispatch import BatchDescriptor
from ..control.meta import GDNMeta
from ..knobs.modes import Runtime
from ..islands.layer import LayerCopy
from ..knobs.options import RunnerOptions
from .buffers import StaticInputs
from .finding import Notes
from .piece import Piece


@dataclass
class Captured:
    """The chain's graphs of one key: one piece in FULL, two (graph 0, graph 1) in PIECEWISE, None
    where a family runs eagerly."""
    size: int  # the tokens it runs
    pieces: list = field(default_factory=list)  # Graph or None, per piece
    ins1: dict | None = None  # submod1's static inputs when they are not graph 0's outputs
    owned0: dict | None = None  # clone-outputs: runner-owned copies of graph 0's outputs
    watched: dict = field(default_factory=dict)  # python attributes at capture
    frozen: dict = field(default_factory=dict)  # forward-context values read during capture
    step: int = 0


def span(t: torch.Tensor) -> tuple[int, int]:
    return t.data_ptr(), t.data_ptr() + max(t.numel(), 1) * t.element_size()


class ChainCapture:
    """Captures one copy's chain (`capture(runtime, desc, meta, step)`) on `stream`, into one shared
    pool (`pool`), and keeps each key's graphs (`captured`, `entry`); `opts()` gives the runner's
    options at each call; findings go to `notes`."""

    def __init__(self, copy: LayerCopy, provider, inputs: StaticInputs, opts, notes: Notes, stream=None):
        self.copy, self.provider, self.inputs = copy, provider, inputs
        self.opts, self.notes, self.stream = opts, notes, stream
        self.pool = provider.new_pool("shared")
        self.captured: dict[BatchDescriptor, Captured] = {}
        self.captures = 0

    def entry(self, runtime: Runtime, desc: BatchDescriptor, step: int, path) -> Captured:
        """The graphs of this key, captured now if needed (or again when a forward-context value they
        froze has changed and `recapture` says so); a FULL capture is built over the metadata `path`
        (the runner's control path) builds for capture."""
        cap = self.captured.get(desc)
        if cap is not None and cap.frozen:
            now = self.copy.ctx.values()
            changed = {k: (v, now.get(k)) for k, v in cap.frozen.items() if now.get(k) != v}
            if changed:
                self._note_frozen(desc, changed)
                if self.opts().recapture:
                    cap = None
        if cap is None:
            meta = path.capture_metadata(desc) if runtime is Runtime.FULL else None
            cap = self.captured[desc] = self.capture(runtime, desc, meta, step)
        return cap

    def _note_frozen(self, desc, changed):
        for k, (was, now) in changed.items():
            self.notes.add("python-state", "forward-context",
                           f"{k} was {was!r} when {desc} was captured and differs at a later replay: "
                           "forward read it during capture, so replay uses the frozen value")

    def forget(self, size: int) -> None:
        """Drop the graphs of one capture size: the next step of that size captures it again. With
        no graph left the pool is replaced: a capture into a pool whose every graph was released
        fails CUDA's allocator assert (`graphs.refusals.RELEASED_POOL_PHRASE`)."""
        for desc in [d for d in self.captured if d.num_tokens == size]:
            del self.captured[desc]
        if not self.captured:
            self.pool = self.provider.new_pool("shared")

    def piece(self, pool=None, weak: bool = False) -> Piece:
        o: RunnerOptions = self.opts()
        return Piece(self.provider, pool or self.pool, weak=weak, warmup=self.linted, stream=self.stream,
                     relaxed=o.relaxed_capture)

    def linted(self, fn):
        """`fn()` under the lint: a write the op's schema does not declare is a finding."""
        lint = Lint("the piece", self.copy.gdn_core.state())
        with lint:
            out = fn()
        for kind, detail in lint.problems:
            self.notes.add(kind, "lint", detail)
        return out

    @contextlib.contextmanager
    def protect_state(self):
        """Warm-up and capture run the ops on the tape (and warm-up everywhere): keep the state
        caches as they were, as a capture on dummy slots would."""
        saved = {k: v.clone() for k, v in self.copy.gdn_core.state().items()}
        try:
            yield
        finally:
            for k, v in self.copy.gdn_core.state().items():
                v.copy_(saved[k])

    def _watch(self) -> dict:
        return {isl.name: isl.watched() for isl in self.copy.islands()}

    def capture(self, runtime: Runtime, desc: BatchDescriptor, meta: GDNMeta | None, step: int) -> Captured:
        """The graphs of key `desc` (`meta`: the capture-time metadata a FULL graph is built over)."""
        c, size = self.copy, desc.num_tokens
        cap = Captured(size, step=step)
        before = self._watch()
        c.ctx.reads.clear()
        self.captures += 1
        with torch.inference_mode():
            if runtime is Runtime.FULL:
                self._full(cap, meta)
            else:
                self._piecewise(cap)
        after = self._watch()
        for name in before:
            for k, v in after[name].items():
                if before[name].get(k, v) != v:
                    self.notes.add("python-state", name, f"{name}.{k} was {before[name].get(k)!r}, set to {v!r} "
                                   f"during capture of size {size}: the graph freezes it")
        cap.watched = after
        if runtime is Runtime.PIECEWISE:
            self._alias_map(cap)
        ctx = c.ctx.values()
        cap.frozen = {k: ctx.get(k) for k in c.ctx.reads}
        return cap

    def _full(self, cap: Captured, meta: GDNMeta) -> None:
        c, ids = self.copy, self.inputs.input_ids[:cap.size]

        def chain():
            o0, _, o1 = c.chain(ids, meta)
            return {**o0, **o1}
        with self.protect_state():
            cap.pieces = [self.piece(weak=True).capture(chain)]

    def _piecewise(self, cap: Captured) -> None:
        c, o = self.copy, self.opts()
        eager = o.eager_families
        ids = self.inputs.input_ids[:cap.size]
        g0 = None
        if "submod0" not in eager:
            # graph 0's outputs feed graph 1: held strongly (vLLM), or weakly under shared-pool-weakref
            g0 = self.piece(weak=o.weak_first_output).capture(lambda: c.submod0(input_ids=ids))
        cap.pieces.append(g0)
        o0 = g0.outputs if g0 is not None else c.submod0(input_ids=ids)
        clone = o.clone_outputs and g0 is not None
        if clone:
            # Runner-owned copies of graph 0's outputs, outside the pool, filled after each
            # replay: whoever holds graph 0's outputs holds these, not pool memory.
            cap.owned0 = {k: v.clone() for k, v in o0.items() if k != "core_out"}
        ins = {k: o0[k] for k in Submod1.inputs}
        if g0 is None or clone:
            # graph 1 reads runner-owned buffers filled each step: out of the pool, and apart
            # from what holders of graph 0's outputs see
            ins = {k: v.clone() for k, v in ins.items()}
            cap.ins1 = ins
        if "submod1" in eager or "moe" in eager:
            cap.pieces.append(None)
            cap.ins1 = ins
            return
        pool1 = self.provider.new_pool("private") if o.private_pool else None
        cap.pieces.append(self.piece(pool1, weak=True).capture(lambda: c.submod1(**ins)))

    def _alias_map(self, cap: Captured) -> None:
        """Graph 0's outputs are held until the end of the step (the splitting op and the caller
        read them); report bytes of them that graph 1's replay writes."""
        g0, g1 = cap.pieces
        if g0 is None:
            return
        held = {k: span(v) for k, v in g0.outputs.items()}
        writes = list(self.provider.written_spans(g1.graph)) if g1 is not None else []
        writes += [span(v) for v in (g1.outputs if g1 is not None else {}).values()]
        for k, (a, b) in held.items():
            if any(a < y and x < b for x, y in writes):
                self.notes.add("alias", "submod1", f"size {cap.size}: graph 1's replay writes bytes that hold graph "
                               f"0's output `{k}`, which the splitting op and the caller still read")
