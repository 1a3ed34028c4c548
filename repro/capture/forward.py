"""The model runs on what the control path staged: step 4 of a replay copy's step (`runner.py`).

The runner has dispatched the step, filled the persistent inputs, built the step's metadata and
found (or captured) the key's graphs; what runs then depends only on the runtime mode:

- FULL: the one graph replays the whole decode chain over the persistent buffers;
- PIECEWISE: graph 0 (submod0) replays, the splitting op `gdn_core` runs eagerly on the step's
  metadata, graph 1 (submod1) replays; a piece an eager family leaves uncaptured runs eagerly;
- NONE: the chain runs eagerly at the step's own size.

Where the pieces hand over is where the runner's hazards live: graph 1 reading a buffer the
splitting op did not write (a fresh tensor, pad rows left by the pool), graph 0's outputs held
where graph 1's replay writes, and the padded rows a later piece reads (`padding`, which the
lockstep checks for non-finite values). The replays and the host's read go through the runner's
`Replayer` (`replay.py`).
"""
from __future__ import annotations

import torch

from ..control.batch import StepBatch
from ..graphs.lint import LintSchedule
from ..islands.gdn import Submod0, Submod1
from ..islands.layer import LayerCopy, collect
from ..knobs.modes import Runtime
from .buffers import StaticInputs
from .chain import Captured, ChainCapture
from .finding import Notes
from .piece import Graph
from .replay import Replayer


def clear_core_out(o0: dict, size: int) -> None:
    """Pad rows deterministic. vLLM allocates the GDN output buffer with `torch.zeros`; Submod0
    allocates it with `torch.empty`, so the rows the splitting op does not write (the pad rows
    graph 1 reads, or every row when it returns a fresh tensor) would hold whatever the pool or
    allocator left there, NaN included, and a fault that mixes rows would be caught on some runs
    only. Zeroed after graph 0, before the splitting op writes its rows, a run is a pure
    function of its seed (the probe's padded run zeroes them too: `check.probe`)."""
    o0["core_out"][:size].zero_()


class ChainForward:
    """Runs one copy's chain for a step over a key's graphs (`replay`), or eagerly (`eager`).
    `opts()` gives the runner's options at each call; `lint_every` says when the eager splitting op
    runs under the lint (`graphs.lint.LintSchedule`, through `capturer.linted`)."""

    def __init__(self, copy: LayerCopy, inputs: StaticInputs, capturer: ChainCapture, player: Replayer,
                 opts, notes: Notes, lint_every):
        self.copy, self.inputs, self.capturer, self.player = copy, inputs, capturer, player
        self.opts, self.notes = opts, notes
        self._lint = LintSchedule(lint_every)
        # the last step's padded rows a later piece reads (`watch_padding`); empty: no padding
        self.padding: dict[str, torch.Tensor] = {}

    def replay(self, cap: Captured, runtime: Runtime, batch: StepBatch, meta) -> dict[str, torch.Tensor]:
        """The step over the key's graphs `cap`; the host reads the last piece's outputs."""
        c, n = self.copy, batch.num_tokens
        self.player.begin_step()
        with torch.inference_mode():
            if runtime is Runtime.FULL:
                o = self.player.replay(cap.pieces[0])
                held = {k: o[k] for k in Submod0.outputs}
                o1 = {k: o[k] for k in Submod1.outputs}
                fresh = None
                self.watch_padding(n, cap.size, o, o1)
            else:
                held, fresh, o1 = self.piecewise(cap, batch, meta)
            o1 = self.player.read(o1, batch.step)
            ids = c.head(hidden=o1["hidden"][:n])["token_ids"]
            return self.player.check(batch.step, collect(held, o1, ids, n, fresh))

    def piecewise(self, cap: Captured, batch: StepBatch, meta):
        c, n, size = self.copy, batch.num_tokens, cap.size
        o0 = self._run_piece(cap.pieces[0], lambda: c.submod0(input_ids=self.inputs.input_ids[:size]))
        clear_core_out(o0, size)
        held = o0
        if cap.owned0 is not None:
            for k, v in cap.owned0.items():
                v.copy_(o0[k])
            held = {**o0, **cap.owned0}
        kind = (batch.num_decodes > 0, batch.num_tokens > batch.num_decodes)
        core = (lambda: c.core(o0, meta, n))
        fresh = self.capturer.linted(core) if self._lint.due(kind, batch.step) else core()
        if fresh.data_ptr() != o0["core_out"].data_ptr():
            self.notes.add("alias", "gdn_core", "gdn_core returned a fresh tensor, not the core_out buffer graph 1 "
                           "captured: graph 1 reads the stale buffer unless the fresh tensor is copied into it")
            if self.opts().copy_inputs:
                o0["core_out"][:n].copy_(fresh)
        ins = cap.ins1
        if ins is not None:  # submod1 reads runner-owned buffers: fill them
            for k in ins:
                if ins[k].data_ptr() != o0[k].data_ptr():
                    ins[k].copy_(o0[k])
        o1 = self._run_piece(cap.pieces[1], lambda: c.submod1(core_out=fresh, z=o0["z"][:n],
                                                               residual=o0["residual"][:n]))
        self.watch_padding(n, size, ins if ins is not None else o0, o1)
        if cap.owned0 is not None:
            fresh = ins["core_out"][:n]  # the holder's copy, out of the pool
        return held, fresh, o1

    def eager(self, batch: StepBatch, meta) -> dict[str, torch.Tensor]:
        """A step no graph serves (runtime mode NONE), over the persistent inputs at its own size."""
        c = self.copy
        n = batch.num_tokens
        with torch.inference_mode():
            o0, core, o1 = c.chain(self.inputs.input_ids[:n], meta)
            ids = c.head(hidden=o1["hidden"])["token_ids"]
        return collect(o0, o1, ids, n, core)

    def watch_padding(self, n: int, size: int, into: dict, o1: dict) -> None:
        """The step's padded rows (n..size-1) that a later piece reads: what graph 1 takes in
        (`into`: graph 0's outputs and the splitting op's buffer, or the runner-owned copies it
        reads) and graph 1's outputs, which the next layer's pieces take in. The lockstep checks
        them for non-finite values (padding poison: no live row differs)."""
        if size > n:
            self.padding = {("gdn_core." if k == "core_out" else "submod0.") + k: into[k][n:size]
                            for k in Submod1.inputs}
            self.padding.update({f"submod1.{k}": v[n:size] for k, v in o1.items()})

    def _run_piece(self, piece: Graph | None, eager):
        return eager() if piece is None else self.player.replay(piece)
