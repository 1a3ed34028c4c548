"""Eager and graph runners over one copy of a GDN layer's islands, mirroring vLLM's runner.

Graph runner, both modes (`docs/DESIGN.md`): capture sizes, pad a batch to the next
size, persistent input buffers addressed by slicing (one max-size buffer for every step,
mixed steps included), graphs captured lazily on the first step that needs a size into one
shared pool, a warm-up run before each capture, outputs of the last piece held by weak
reference (vLLM's `weak_ref_output`), the splitting op `gdn_core` eager between pieces in
`piecewise`, and the whole decode chain as one graph in `full` (mixed steps run eagerly, as
FULL_DECODE_ONLY does). Hazards and repairs change exactly one mechanism each
(`hazards.py` describes them).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field, replace

import torch

from ..control.batch import StepBatch, StepInputs
from .piece import DEFAULT_SIZES, Graph, IslandRunner, OverIslandRunner, Piece, pad_size
from ..graphs.lint import Lint, LintSchedule
from ..islands.gdn import GDNMeta, Submod0, Submod1
from ..islands.layer import LayerCopy, collect
from ..knobs.options import HostCopy, Mode, Pad, RunnerOptions
from .finding import Finding
from .race import HostReadback, RaceLog, device_delay, is_poison, poison_

__all__ = ["DEFAULT_SIZES", "EagerRunner", "Finding", "GraphRunner", "HostReadback", "PieceRunner", "RaceLog",
           "pad_size"]


class EagerRunner:
    """The reference: every island eager, exact shapes, no padding."""

    def __init__(self, copy: LayerCopy):
        self.copy = copy

    def step(self, batch: StepBatch) -> dict[str, torch.Tensor]:
        c = self.copy
        c.set_context(batch.num_tokens)
        d = batch.on(c.device)  # from the batch's prepared host buffer: no stream sync
        with torch.inference_mode():
            o0, core, o1 = c.chain(d.ids, d.meta)
            ids = c.head(hidden=o1["hidden"])["token_ids"]
        return collect(o0, o1, ids, batch.num_tokens, core)


@dataclass
class _Captured:
    """The chain's graphs at one size: one piece in `full`, two (graph 0, graph 1) in `piecewise`,
    None where a family runs eagerly."""
    size: int
    pieces: list = field(default_factory=list)  # Graph or None, per piece
    ins1: dict | None = None  # submod1's static inputs when they are not graph 0's outputs
    owned0: dict | None = None  # clone-outputs: runner-owned copies of graph 0's outputs
    watched: dict = field(default_factory=dict)  # python attributes at capture
    frozen: dict = field(default_factory=dict)  # forward-context values read during capture
    step: int = 0


class GraphRunner:
    """The replay copy's runner (module docstring). `opts` (from `hazards.options_for`) says how it
    pads, holds, copies, pools, replays and reads back; nothing here reads a hazard's name."""

    def __init__(self, copy: LayerCopy, provider, mode: str = "piecewise", sizes=DEFAULT_SIZES,
                 opts: RunnerOptions = RunnerOptions(), max_tokens: int = 64, stream=None):
        self.copy, self.provider, self.mode = copy, provider, Mode(mode)
        self.sizes, self.opts = tuple(sorted(sizes)), opts
        self.sentinel = copy.cache.sentinel
        dev = copy.device
        n = max(max_tokens, max(self.sizes))
        # Persistent buffers, sliced per step (vLLM's input_ids / state-index buffers).
        self.input_ids = torch.zeros(n, dtype=torch.long, device=dev)
        self.token_slot = torch.full((n,), self.sentinel, dtype=torch.int32, device=dev)
        self.pool = provider.new_pool("shared")
        self.captured: dict[int, _Captured] = {}
        self._findings: list[Finding] = []
        self.replays = 0
        self.captures = 0
        self.stream = stream
        self._host: HostReadback | None = None
        self._noted: set = set()
        self._side = None  # side stream of a side-stream replay
        self._side_race = RaceLog(
            "the main stream read graph outputs before the side-stream replay that writes them landed",
            f"outputs poisoned with NaN on the main stream before each replay, the side stream delayed "
            f"{opts.amplify_us:g} us by device work queued before the replay")
        self._amplified = False  # this step replayed on a delayed side stream
        self._producer_start = None  # timed event before this step's last delayed replay
        self._step = -1  # the step being run (what the race logs report)
        self._lint = LintSchedule(opts.lint_every)  # when the eager splitting op is linted
        for isl in copy.islands():
            isl.escape = provider.escape

    def _piece(self, pool=None, weak: bool = False) -> Piece:
        return Piece(self.provider, pool or self.pool, weak=weak, warmup=self._linted, stream=self.stream,
                     relaxed=self.opts.relaxed_capture)

    # ---- static buffers -------------------------------------------------------------------
    def _pad_value(self) -> int:
        if self.opts.pad is Pad.OTHER:
            return 0 if self.sentinel != 0 else -1
        return self.sentinel

    def _fill(self, batch: StepBatch, size: int, d: StepInputs) -> None:
        n = batch.num_tokens
        self.input_ids[:n].copy_(d.ids)
        self.token_slot[:n].copy_(d.token_slots)
        if size > n and self.opts.pad is not Pad.STALE:
            # nano-vllm's `slot_mapping.fill_(-1)`: padded rows carry the kernel's sentinel.
            self.input_ids[n:size].zero_()
            self.token_slot[n:size].fill_(self._pad_value())

    # ---- capture --------------------------------------------------------------------------
    def _graphable(self, batch: StepBatch) -> int | None:
        size = pad_size(batch.num_tokens, self.sizes)
        if size is None:
            return None
        if self.mode is Mode.FULL and not batch.uniform_decode:
            return None
        return size

    def _decode_meta(self, size: int) -> GDNMeta:
        return GDNMeta(query_start_loc=torch.arange(size + 1, dtype=torch.int32, device=self.copy.device),
                       state_indices=self.token_slot[:size], has_initial_state=None,
                       num_decodes=size, num_tokens=size)

    @contextlib.contextmanager
    def _protect_state(self):
        """Warm-up and capture run the ops on the tape (and warm-up everywhere): keep the state
        caches as they were, as a capture on dummy slots would."""
        saved = {k: v.clone() for k, v in self.copy.gdn_core.state().items()}
        try:
            yield
        finally:
            for k, v in self.copy.gdn_core.state().items():
                v.copy_(saved[k])

    def _watch(self):
        return {isl.name: isl.watched() for isl in self.copy.islands()}

    def _capture(self, size: int, batch: StepBatch) -> _Captured:
        c = self.copy
        cap = _Captured(size, step=batch.step)
        before = self._watch()
        c.ctx.reads.clear()
        self.captures += 1
        with torch.inference_mode():
            if self.mode is Mode.FULL:
                self._capture_full(cap)
            else:
                self._capture_piecewise(cap)
        after = self._watch()
        for name in before:
            for k, v in after[name].items():
                if before[name].get(k, v) != v:
                    self._note("python-state", name, f"{name}.{k} was {before[name].get(k)!r}, set to {v!r} "
                               f"during capture of size {size}: the graph freezes it")
        cap.watched = after
        if self.mode is Mode.PIECEWISE:
            self._alias_map(cap)
        ctx = c.ctx.values()
        cap.frozen = {k: ctx.get(k) for k in c.ctx.reads}
        return cap

    def _capture_full(self, cap: _Captured) -> None:
        c, ids, meta = self.copy, self.input_ids[:cap.size], self._decode_meta(cap.size)

        def chain():
            o0, _, o1 = c.chain(ids, meta)
            return {**o0, **o1}
        with self._protect_state():
            cap.pieces = [self._piece(weak=True).capture(chain)]

    def _capture_piecewise(self, cap: _Captured) -> None:
        c, eager = self.copy, self.opts.eager_families
        ids = self.input_ids[:cap.size]
        g0 = None
        if "submod0" not in eager:
            # graph 0's outputs feed graph 1: held strongly (vLLM), or weakly under shared-pool-weakref
            g0 = self._piece(weak=self.opts.weak_first_output).capture(lambda: c.submod0(input_ids=ids))
        cap.pieces.append(g0)
        o0 = g0.outputs if g0 is not None else c.submod0(input_ids=ids)
        clone = self.opts.clone_outputs and g0 is not None
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
        pool1 = self.provider.new_pool("private") if self.opts.private_pool else None
        cap.pieces.append(self._piece(pool1, weak=True).capture(lambda: c.submod1(**ins)))

    def _alias_map(self, cap: _Captured) -> None:
        """Graph 0's outputs are held until the end of the step (the splitting op and the caller
        read them); report bytes of them that graph 1's replay writes."""
        g0, g1 = cap.pieces
        if g0 is None:
            return
        held = {k: _span(v) for k, v in g0.outputs.items()}
        writes = list(self.provider.written_spans(g1.graph)) if g1 is not None else []
        writes += [_span(v) for v in (g1.outputs if g1 is not None else {}).values()]
        for k, (a, b) in held.items():
            if any(a < y and x < b for x, y in writes):
                self._note("alias", "submod1", f"size {cap.size}: graph 1's replay writes bytes that hold graph 0's "
                           f"output `{k}`, which the splitting op and the caller still read")

    def _linted(self, fn):
        lint = Lint("the piece", self.copy.gdn_core.state())
        with lint:
            out = fn()
        for kind, detail in lint.problems:
            self._note(kind, "lint", detail)
        return out

    def _note(self, kind, island, detail):
        if (kind, detail) not in self._noted:
            self._noted.add((kind, detail))
            self._findings.append(Finding(kind, island, detail))

    @property
    def findings(self) -> list[Finding]:
        """What the runner noted, then what the race amplifier forced (read from the device here)."""
        races = [log.finding() for log in (self._side_race, self._host.log if self._host else None) if log]
        return self._findings + [f for f in races if f is not None]

    # ---- step -----------------------------------------------------------------------------
    def _ready(self, batch: StepBatch, d: StepInputs) -> _Captured | None:
        """Fill the static buffers, set the forward context and capture this size if needed;
        None: the step runs eagerly."""
        c = self.copy
        size = self._graphable(batch)
        self._fill(batch, size or batch.num_tokens, d)
        c.set_context(batch.num_tokens)
        if size is None:
            return None
        cap = self.captured.get(size)
        if cap is not None and cap.frozen:
            now = c.ctx.values()
            changed = {k: (v, now.get(k)) for k, v in cap.frozen.items() if now.get(k) != v}
            if changed:
                self._note_frozen(size, changed)
                if self.opts.recapture:
                    cap = None
        if cap is None:
            cap = self.captured[size] = self._capture(size, batch)
        return cap

    def step(self, batch: StepBatch) -> dict[str, torch.Tensor]:
        c = self.copy
        d = batch.on(c.device)  # this copy's own inputs, one copy from the batch's host buffer
        cap = self._ready(batch, d)
        if cap is None:
            return self._eager_step(batch, d)
        n = batch.num_tokens
        self._step, self._amplified, self._producer_start = batch.step, False, None
        with torch.inference_mode():
            if self.mode is Mode.FULL:
                o = self._replay(cap.pieces[0])
                held = {k: o[k] for k in Submod0.outputs}
                o1 = {k: o[k] for k in Submod1.outputs}
                fresh = None
            else:
                held, fresh, o1 = self._step_piecewise(cap, batch, d)
            o1 = self._consume(o1)
            ids = c.head(hidden=o1["hidden"][:n])["token_ids"]
            out = collect(held, o1, ids, n, fresh)
            if self._amplified:
                # The consumer reads now: snapshot what it sees, so the comparison and the race flag
                # judge the same bytes (views would be read later in the queue, when a racing
                # side-stream replay may have landed: detection would depend on timing again).
                out = {k: v.clone() for k, v in out.items()}
                # what the step hands back holds the poison: a consumer read before a replay landed
                # (flagged on the consumer's stream, after its reads; no synchronisation here)
                floats = [is_poison(v).any() for v in out.values() if v.is_floating_point()]
                self._side_race.hit_device(batch.step, torch.stack(floats).any())
                timed = getattr(self.provider, "timed_event", None)
                if timed is not None and self._producer_start is not None:
                    read = timed()
                    read.record()
                    self._side_race.order_device(batch.step, read, self._producer_start)
        return out

    def _step_piecewise(self, cap: _Captured, batch: StepBatch, d: StepInputs):
        c, n, size = self.copy, batch.num_tokens, cap.size
        o0 = self._run_piece(cap.pieces[0], lambda: c.submod0(input_ids=self.input_ids[:size]))
        self.clear_core_out(o0, size)
        held = o0
        if cap.owned0 is not None:
            for k, v in cap.owned0.items():
                v.copy_(o0[k])
            held = {**o0, **cap.owned0}
        meta = d.meta
        kind = (batch.num_decodes > 0, batch.num_tokens > batch.num_decodes)
        core = (lambda: c.core(o0, meta, n))
        fresh = self._linted(core) if self._lint.due(kind, batch.step) else core()
        if fresh.data_ptr() != o0["core_out"].data_ptr():
            self._note("alias", "gdn_core", "gdn_core returned a fresh tensor, not the core_out buffer graph 1 "
                       "captured: graph 1 reads the stale buffer unless the fresh tensor is copied into it")
            if self.opts.copy_inputs:
                o0["core_out"][:n].copy_(fresh)
        ins = cap.ins1
        if ins is not None:  # submod1 reads runner-owned buffers: fill them
            for k in ins:
                if ins[k].data_ptr() != o0[k].data_ptr():
                    ins[k].copy_(o0[k])
        o1 = self._run_piece(cap.pieces[1], lambda: c.submod1(core_out=fresh, z=o0["z"][:n],
                                                               residual=o0["residual"][:n]))
        if cap.owned0 is not None:
            fresh = ins["core_out"][:n]  # the holder's copy, out of the pool
        return held, fresh, o1

    @staticmethod
    def clear_core_out(o0: dict, size: int) -> None:
        """Issue 16.4, pad rows deterministic. vLLM allocates the GDN output buffer with
        `torch.zeros`; Submod0 allocates it with `torch.empty`, so the rows the splitting op does
        not write (the pad rows graph 1 reads, or every row when it returns a fresh tensor) held
        whatever the pool or allocator left there, NaN included, and a fault that mixes rows was
        caught on some runs only. Zeroed after graph 0, before the splitting op writes its rows,
        a run is a pure function of its seed. (Additive hook owned by the oracle branch.)"""
        o0["core_out"][:size].zero_()

    def set_options(self, **changes) -> None:
        """Change runner options between steps (a scheduler moving the consumer to another stream)."""
        self.opts = replace(self.opts, **changes)

    def forget(self, size: int) -> None:
        """Drop the graphs of one capture size: the next step of that size captures it again. With
        no graph left the pool is replaced: a capture into a pool whose every graph was released
        fails CUDA's allocator assert (`graphs.refusals.RELEASED_POOL_PHRASE`)."""
        self.captured.pop(size, None)
        if not self.captured:
            self.pool = self.provider.new_pool("shared")

    def replayer(self, batch: StepBatch):
        """A callable that replays this batch's captured size as a step would, without refilling
        the inputs or reading the outputs (what `repro bench` times). Captures it if needed."""
        cap = self._ready(batch, batch.on(self.copy.device))
        if cap is None:
            raise ValueError(f"a step of {batch.num_tokens} tokens runs eagerly in {self.mode} mode")
        if self.mode is Mode.FULL:
            return cap.pieces[0].graph.replay
        c, meta = self.copy, self._decode_meta(cap.size)
        g0, g1 = cap.pieces

        def replay():
            o0 = g0.replay()
            c.core(o0, meta)
            g1.replay()
        return replay

    def _note_frozen(self, size, changed):
        for k, (was, now) in changed.items():
            self._note("python-state", "forward-context",
                       f"{k} was {was!r} when size {size} was captured and differs at a later replay: "
                       "forward read it during capture, so replay uses the frozen value")

    def _run_piece(self, piece: Graph | None, eager):
        return eager() if piece is None else self._replay(piece)

    def _replay(self, piece: Graph) -> dict:
        self.replays += 1
        if not self.opts.side_stream:
            return piece.replay()
        p = self.provider
        main = p.current_stream()
        if self._side is None:
            self._side = p.new_stream()
        if self.opts.amplify:
            # Race amplifier (`race.py`): a read of these outputs before the replay lands gives the
            # poison, not last step's values. On the main stream, so the side stream's wait below
            # orders the replay's writes after it; every output is rewritten by the replay (or, in
            # piecewise, `core_out` by the main stream after it: `clear_core_out`).
            for v in piece.outputs.values():
                poison_(v)
            self._amplified = True
        self._side.wait_stream(main)  # inputs were written on the main stream
        with p.stream(self._side):
            if self.opts.amplify:
                # device work queued ahead of the replay: the main stream's consumers, issued
                # microseconds later, run first on every step unless an event orders them after it
                device_delay(p.device, self.opts.amplify_us)
                timed = getattr(p, "timed_event", None)
                if timed is not None:  # the last replay's start: the race log confirms the order with it
                    self._producer_start = timed()
                    self._producer_start.record(self._side)
            out = piece.replay()
        if self.opts.event_wait:
            ev = p.new_event()
            ev.record(self._side)
            main.wait_event(ev)
        else:
            self._note("stream", "runner", "graphs replay on a side stream and their outputs are read on the main "
                       "stream with no event between them")
        return out

    def _consume(self, out):
        """How the host reads the last piece's outputs (stream hazards live here: `HostReadback`)."""
        if self.opts.host_copy is HostCopy.DIRECT:
            return out
        if self._host is None:
            self._host = HostReadback(self.provider, self.opts.host_copy is HostCopy.ASYNC_SYNCED,
                                      self.opts.amplify, self.opts.amplify_us)
        return self._host.read(out, self._step)

    def _eager_step(self, batch: StepBatch, d: StepInputs):
        c = self.copy
        n = batch.num_tokens
        with torch.inference_mode():
            o0, core, o1 = c.chain(self.input_ids[:n], d.meta)
            ids = c.head(hidden=o1["hidden"])["token_ids"]
        return collect(o0, o1, ids, n, core)


def _span(t: torch.Tensor) -> tuple[int, int]:
    return t.data_ptr(), t.data_ptr() + max(t.numel(), 1) * t.element_size()


class PieceRunner(OverIslandRunner):
    """One island as one graph per padded size (the `moe` island): `capture.IslandRunner` with its
    outputs' live rows copied out before the next replay."""

    def __init__(self, island, provider, sizes=DEFAULT_SIZES, max_tokens: int = 64):
        self.island = island
        self.runner = IslandRunner(lambda ids: island(input_ids=ids), provider, sizes, max_tokens)
        self.findings: list[Finding] = []

    def step(self, token_ids: list[int]) -> dict[str, torch.Tensor]:
        out, n = self.runner.run(token_ids)
        return {f"{self.island.name}.{k}": v[:n].clone() for k, v in out.items()}
