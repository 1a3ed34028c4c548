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

from dataclasses import replace

import torch

from ..control.batch import StepBatch, StepInputs
from ..graphs.lint import LintSchedule
from ..islands.gdn import Submod0, Submod1
from ..islands.layer import LayerCopy, collect
from ..knobs.options import Mode, RunnerOptions
from .buffers import StaticInputs
from .chain import Captured, ChainCapture
from .finding import Finding, Notes
from ..control.dispatch import DEFAULT_SIZES, pad_size
from .piece import Graph, IslandRunner, OverIslandRunner
from .replay import Replayer


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


class GraphRunner:
    """The replay copy's runner (module docstring). `opts` (from `hazards.options_for`) says how it
    pads, holds, copies, pools, replays and reads back; nothing here reads a hazard's name. Its
    parts: the persistent inputs (`StaticInputs`), the capture of each size (`ChainCapture`) and
    the replay and host read (`Replayer`)."""

    def __init__(self, copy: LayerCopy, provider, mode: str = "piecewise", sizes=DEFAULT_SIZES,
                 opts: RunnerOptions = RunnerOptions(), max_tokens: int = 64, stream=None):
        self.copy, self.provider, self.mode = copy, provider, Mode(mode)
        self.sizes, self.opts = tuple(sorted(sizes)), opts
        self.sentinel = copy.cache.sentinel
        self.inputs = StaticInputs(max(max_tokens, max(self.sizes)), copy.device, self.sentinel)
        self.pool = provider.new_pool("shared")
        self.captured: dict[int, Captured] = {}
        self.notes = Notes()
        self.capturer = ChainCapture(copy, provider, self.mode, self.inputs, lambda: self.opts, self.notes,
                                  lambda: self.pool, stream)
        self.player = Replayer(provider, lambda: self.opts, self.notes)
        self._lint = LintSchedule(opts.lint_every)  # when the eager splitting op is linted
        for isl in copy.islands():
            isl.escape = provider.escape

    @property
    def input_ids(self) -> torch.Tensor:
        return self.inputs.input_ids

    @property
    def token_slot(self) -> torch.Tensor:
        return self.inputs.token_slot

    @property
    def captures(self) -> int:
        return self.capturer.captures

    @property
    def replays(self) -> int:
        return self.player.replays

    @property
    def findings(self) -> list[Finding]:
        """What the runner noted, then what the race amplifier forced (read from the device here)."""
        return self.notes.items + self.player.findings()

    def graphable(self, batch: StepBatch) -> int | None:
        """The captured size this step replays at; None: it runs eagerly (above the largest size,
        or a step with a prefill in `full` mode, as FULL_DECODE_ONLY runs mixed steps)."""
        size = pad_size(batch.num_tokens, self.sizes)
        if size is None:
            return None
        if self.mode is Mode.FULL and not batch.uniform_decode:
            return None
        return size

    def _ready(self, batch: StepBatch, d: StepInputs) -> Captured | None:
        """Fill the static buffers, set the forward context and capture this size if needed;
        None: the step runs eagerly."""
        c = self.copy
        size = self.graphable(batch)
        self.inputs.fill(batch.num_tokens, size or batch.num_tokens, d.ids, d.token_slots, self.opts.pad)
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
            cap = self.captured[size] = self.capturer.capture(size, batch.step)
        return cap

    def step(self, batch: StepBatch) -> dict[str, torch.Tensor]:
        c = self.copy
        d = batch.on(c.device)  # this copy's own inputs, one copy from the batch's host buffer
        cap = self._ready(batch, d)
        if cap is None:
            return self._eager_step(batch, d)
        n = batch.num_tokens
        self.player.begin_step()
        with torch.inference_mode():
            if self.mode is Mode.FULL:
                o = self.player.replay(cap.pieces[0])
                held = {k: o[k] for k in Submod0.outputs}
                o1 = {k: o[k] for k in Submod1.outputs}
                fresh = None
            else:
                held, fresh, o1 = self._step_piecewise(cap, batch, d)
            o1 = self.player.read(o1, batch.step)
            ids = c.head(hidden=o1["hidden"][:n])["token_ids"]
            return self.player.check(batch.step, collect(held, o1, ids, n, fresh))

    def _step_piecewise(self, cap: Captured, batch: StepBatch, d: StepInputs):
        c, n, size = self.copy, batch.num_tokens, cap.size
        o0 = self._run_piece(cap.pieces[0], lambda: c.submod0(input_ids=self.inputs.input_ids[:size]))
        self.clear_core_out(o0, size)
        held = o0
        if cap.owned0 is not None:
            for k, v in cap.owned0.items():
                v.copy_(o0[k])
            held = {**o0, **cap.owned0}
        meta = d.meta
        kind = (batch.num_decodes > 0, batch.num_tokens > batch.num_decodes)
        core = (lambda: c.core(o0, meta, n))
        fresh = self.capturer.linted(core) if self._lint.due(kind, batch.step) else core()
        if fresh.data_ptr() != o0["core_out"].data_ptr():
            self.notes.add("alias", "gdn_core", "gdn_core returned a fresh tensor, not the core_out buffer graph 1 "
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
        """Pad rows deterministic. vLLM allocates the GDN output buffer with `torch.zeros`; Submod0
        allocates it with `torch.empty`, so the rows the splitting op does not write (the pad rows
        graph 1 reads, or every row when it returns a fresh tensor) would hold whatever the pool or
        allocator left there, NaN included, and a fault that mixes rows would be caught on some runs
        only. Zeroed after graph 0, before the splitting op writes its rows, a run is a pure
        function of its seed."""
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
        c, meta = self.copy, self.inputs.decode_meta(cap.size)
        g0, g1 = cap.pieces

        def replay():
            o0 = g0.replay()
            c.core(o0, meta)
            g1.replay()
        return replay

    def _note_frozen(self, size, changed):
        for k, (was, now) in changed.items():
            self.notes.add("python-state", "forward-context",
                           f"{k} was {was!r} when size {size} was captured and differs at a later replay: "
                           "forward read it during capture, so replay uses the frozen value")

    def _run_piece(self, piece: Graph | None, eager):
        return eager() if piece is None else self.player.replay(piece)

    def _eager_step(self, batch: StepBatch, d: StepInputs):
        c = self.copy
        n = batch.num_tokens
        with torch.inference_mode():
            o0, core, o1 = c.chain(self.inputs.input_ids[:n], d.meta)
            ids = c.head(hidden=o1["hidden"])["token_ids"]
        return collect(o0, o1, ids, n, core)


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
