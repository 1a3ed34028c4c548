"""Eager and graph runners over one copy of a GDN layer's islands, mirroring vLLM's V1 runner
(`vllm/v1/worker/gpu_model_runner.py: GPUModelRunner`) on one step:

Steps 1-3 are the control path's (`control.py`: the mirror's rules, or the installed vLLM's own code
through the seam); the runner asks it and runs the islands on what it answers.

1. `_update_states`: finished requests leave their rows, new ones take rows;
2. the uniform-decode decision and the dispatcher pick the step's runtime mode (NONE, PIECEWISE,
   FULL) and graph key, padded to a capture size;
3. the block table is committed and the GDN metadata builder builds the step's metadata, staging
   its persistent buffers where its decode branches say so;
4. the model runs (`forward.py`): a FULL graph replays the whole decode chain over those
   buffers; PIECEWISE replays graph 0 (submod0) and graph 1 (submod1) with the GDN core eager
   between them on the step's metadata; NONE runs the chain eagerly at the step's own size.

With prefix caching's block size, each copy first copies a request's state forward where its running
column moved (`control.prefix.forward_copies`, vLLM's `preprocess_mamba`), on the host's stream and
outside any graph, before step 3's metadata reads the running columns.

A dummy step (an idle data-parallel rank, `_dummy_run(1+k, uniform_decode=True)`) dispatches 1+k
tokens as a uniform decode; a data-parallel rank's steps, dummy or real, are agreed with the other
rank's batch where the step names it (`control.dispatch.dispatch_step`: padded to the busier rank's
size, in the lower of the two modes); only a FULL dummy run builds metadata and touches state (a PIECEWISE or
eager one runs without GDN metadata, which the layer treats as a warm-up); before it every copy
makes the boundary copies the previous step queued (`post_copies`). Graphs are captured
lazily on the first step that needs a key, into one shared pool, after a warm-up run
(`chain.py`); outputs of the last piece are held by weak reference (vLLM's `weak_ref_output`).
Hazards and repairs change exactly one mechanism each (`knobs/hazards.py` describes them).
"""
from __future__ import annotations

from dataclasses import replace

import torch

from ..control.batch import StepBatch, StepInputs
from ..control.dispatch import DEFAULT_SIZES, BatchDescriptor
from ..knobs.modes import GraphMode, Runtime, parse_mode
from ..control.prefix import copy_states, forward_copies
from ..control.shape import StepShape
from ..errors import ReplayRefused
from ..islands.layer import LayerCopy, collect
from ..knobs.options import ControlRules, RunnerOptions
from .buffers import StaticInputs, pad_value
from .chain import Captured, ChainCapture
from .control import MirrorPaths
from .finding import Finding, Notes
from .forward import ChainForward
from .piece import IslandRunner, OverIslandRunner
from .replay import Replayer


def preprocess(copy: LayerCopy, batch: StepBatch) -> list[int]:
    """The step's forward copies on this copy's state (`control.prefix`; nothing without a block
    size); returns the accepted counts the metadata then reads. A dummy step makes the boundary
    copies the previous step queued: vLLM makes them at the end of that step
    (`GPUModelRunner._update_states_after_model_execute`), whatever runs next."""
    copies, accepted = forward_copies(batch)
    if copies:
        copy_states(copy.cache.conv, copy.cache.ssm, copies)
    return accepted


class EagerRunner:
    """The reference: every island eager, exact shapes, no padding, metadata built afresh each step
    (no persistent buffers: the builder of a runner with no FULL graph never stages). `path`: where
    the metadata comes from (`paths.eager`, `control.py`; None: the mirror's, under `rules`)."""

    def __init__(self, copy: LayerCopy, rules: ControlRules = ControlRules(), paths=None):
        self.copy, self.k = copy, copy.spec_tokens
        self.path = (paths if paths is not None else MirrorPaths(rules)).eager(self.k, copy.device, copy.cache.sentinel)

    def meta(self, batch: StepBatch, accepted: list[int] | None = None):
        return self.path.metadata(batch, accepted)

    def step(self, batch: StepBatch) -> dict[str, torch.Tensor]:
        if batch.dummy:  # no metadata: the GDN layer treats the call as a warm-up, no state changes
            with torch.inference_mode():
                preprocess(self.copy, batch)  # but the previous step's boundary copies (`post_copies`)
            return {}
        c = self.copy
        c.set_context(batch.num_tokens)
        d = batch.on(c.device)  # from the batch's prepared host buffer: no stream sync
        with torch.inference_mode():
            accepted = preprocess(c, batch)
            o0, core, o1 = c.chain(d.ids, self.meta(batch, accepted))
            ids = c.head(hidden=o1["hidden"])["token_ids"]
        return collect(o0, o1, ids, batch.num_tokens, core)


class GraphRunner:
    """The replay copy's runner (module docstring). `mode`: a vLLM graph mode (`knobs.modes`,
    resolved for GDN); `opts` (from `hazards.options_for`) says how it pads, holds, copies, pools,
    replays and reads back; nothing here reads a hazard's name. Its parts: the control path
    (`self.path`, from `paths`: the persistent batch, the dispatcher, the metadata builder; None: the
    mirror's under `rules`, `control.MirrorPaths`), the persistent inputs (`StaticInputs`), the
    capture of each key into the shared pool (`ChainCapture`), the model's run over a key's graphs
    (`ChainForward`) and the replay and host read (`Replayer`). `shape`: the case's step shape
    (`control.shape.StepShape`: K, the copy's; the requests a step holds, its token budget and the
    capture sizes asked for, none: the path's default, vLLM's default list for that shape)."""

    def __init__(self, copy: LayerCopy, provider, mode: str | GraphMode = "piecewise", shape: StepShape | None = None,
                 opts: RunnerOptions = RunnerOptions(), stream=None, rules: ControlRules = ControlRules(), paths=None):
        shape = StepShape(copy.spec_tokens) if shape is None else shape
        if shape.spec_tokens != copy.spec_tokens:
            raise ValueError(f"a runner of K = {shape.spec_tokens} over a copy built for K = {copy.spec_tokens}")
        self.copy, self.provider, self.opts, self.rules, self.shape = copy, provider, opts, rules, shape
        self.k, self.sentinel = shape.spec_tokens, copy.cache.sentinel
        self.paths = paths if paths is not None else MirrorPaths(rules)
        self.path = self.paths.graph(parse_mode(mode) if isinstance(mode, str) else mode, shape, copy.device,
                                     self.sentinel, pad_value(opts.pad, self.sentinel))
        self.mode, self.sizes = self.path.mode, self.path.sizes
        self.inputs = StaticInputs(max(shape.max_tokens, max(self.sizes, default=1)), copy.device, self.sentinel)
        self.notes = Notes()
        self.capturer = ChainCapture(copy, provider, self.inputs, lambda: self.opts, self.notes, stream)
        self.player = Replayer(provider, lambda: self.opts, self.notes)
        self.forward = ChainForward(copy, self.inputs, self.capturer, self.player, lambda: self.opts, self.notes,
                                    opts.lint_every)
        self.last: tuple[Runtime, BatchDescriptor] | None = None  # the last step's dispatch
        for isl in copy.islands():
            isl.escape = provider.escape

    @property
    def input_ids(self) -> torch.Tensor:
        return self.inputs.input_ids

    @property
    def captures(self) -> int:
        return self.capturer.captures

    @property
    def captured(self) -> dict[BatchDescriptor, Captured]:
        """The graphs of each key captured so far (`ChainCapture.entry`)."""
        return self.capturer.captured

    @property
    def replays(self) -> int:
        return self.player.replays

    @property
    def padding(self) -> dict[str, torch.Tensor]:
        """The last step's padded rows a later piece reads (`ChainForward.watch_padding`); empty: no
        padding."""
        return self.forward.padding

    @property
    def findings(self) -> list[Finding]:
        """What the runner noted, then what the race amplifier forced (read from the device here)."""
        return self.notes.items + self.player.findings()

    # ---- the control path (`self.path`: `control.py`) ------------------------------------------
    def dispatch(self, batch: StepBatch) -> tuple[Runtime, BatchDescriptor]:
        """The step's runtime mode and graph key (`_determine_batch_execution_and_padding`; a dummy
        step's `_dummy_run(1+k, uniform_decode=True)`; data-parallel padding: `dispatch.dispatch_step`)."""
        return self.path.dispatch(batch)

    def graphable(self, batch: StepBatch) -> int | None:
        """The token count this step replays at; None: it runs eagerly."""
        runtime, desc = self.dispatch(batch)
        return None if runtime is Runtime.NONE else desc.num_tokens

    # ---- one step ---------------------------------------------------------------------------
    def step(self, batch: StepBatch) -> dict[str, torch.Tensor]:
        c = self.copy
        self.forward.padding = {}
        self.path.update(batch)  # vLLM's `_update_states`
        runtime, desc = self.last = self.dispatch(batch)
        if batch.dummy:
            with torch.inference_mode():
                preprocess(c, batch)  # the previous step's boundary copies (`post_copies`)
            self._dummy_run(runtime, desc, batch.step)
            return {}
        refused = self.path.refusal(batch, runtime, desc)  # a replay-side assertion (vLLM PR #55123)
        if refused:
            raise ReplayRefused(refused)
        d = batch.on(c.device)  # this copy's own inputs, one copy from the batch's host buffer
        n = batch.num_tokens
        size = desc.num_tokens if runtime is not Runtime.NONE else n
        self.inputs.fill(n, size, d.ids, self.opts.pad)
        c.set_context(n)
        cap = self.capturer.entry(runtime, desc, batch.step, self.path) if runtime is not Runtime.NONE else None
        with torch.inference_mode():
            accepted = preprocess(c, batch)
        meta = self.path.metadata(batch, runtime, desc, accepted)
        if cap is None:
            return self.forward.eager(batch, meta)
        return self.forward.replay(cap, runtime, batch, meta)

    def _dummy_run(self, runtime: Runtime, desc: BatchDescriptor, step: int) -> None:
        """`_dummy_run(1+k, uniform_decode=True)`: in FULL, the path commits the block table and builds
        the dummy's metadata (`control.MirrorPath.dummy`), and the decode graph replays. Its outputs
        are discarded."""
        if runtime is not Runtime.FULL:
            return
        cap = self.capturer.entry(runtime, desc, step, self.path)
        self.path.dummy(desc)
        with torch.inference_mode():
            self.player.replay(cap.pieces[0])

    def set_options(self, **changes) -> None:
        """Change runner options between steps (a scheduler moving the consumer to another stream)."""
        self.opts = replace(self.opts, **changes)

    def forget(self, size: int) -> None:
        """Drop the graphs of one capture size: the next step of that size captures it again
        (`ChainCapture.forget`)."""
        self.capturer.forget(size)

    def replayer(self, batch: StepBatch):
        """A callable that replays this batch's graphs as a step would, without refilling the inputs
        or reading the outputs (what `repro bench` times). Captures them if needed."""
        self.path.update(batch)  # vLLM's `_update_states`
        runtime, desc = self.dispatch(batch)
        if runtime is Runtime.NONE:
            raise ValueError(f"a step of {batch.num_tokens} tokens runs eagerly in {self.mode} mode")
        self.inputs.fill(batch.num_tokens, desc.num_tokens, batch.on(self.copy.device).ids, self.opts.pad)
        self.copy.set_context(batch.num_tokens)
        cap = self.capturer.entry(runtime, desc, batch.step, self.path)
        with torch.inference_mode():
            accepted = preprocess(self.copy, batch)  # once, as the step would before its replay
        meta = self.path.metadata(batch, runtime, desc, accepted)
        if runtime is Runtime.FULL:
            return cap.pieces[0].graph.replay
        c, (g0, g1) = self.copy, cap.pieces

        def replay():
            o0 = g0.replay()
            c.core(o0, meta, batch.num_tokens)
            g1.replay()
        return replay

    def pad_state_indices(self, batch: StepBatch) -> list[int] | None:
        """What the persistent state-index buffer holds in this step's padded rows (a FULL step), as
        its replay read them: the null block when padding is sanitised, stale entries otherwise."""
        if self.last is None or self.last[0] is not Runtime.FULL or batch.dummy:
            return None
        return self.path.pad_state_indices(batch, self.last[1])


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


__all__ = ["EagerRunner", "GraphRunner", "PieceRunner", "StepInputs"]
