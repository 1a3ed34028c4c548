"""Lockstep eager vs replay, and the first-divergence microscope.

The same steps run through an eager copy and a replay copy of the islands, each with its own
state caches. After every step every island output (live rows), the state rows of live and
touched slots, and the canary token ids are compared bit for bit (NaN in both copies counts as
equal: `compare.py`). A difference is classified by the oracle (`oracle.py`: graph hazard,
corruption, batch variance, nondeterminism) on a third copy, the probe, re-run from the eager
copy's state before the step. A graph hazard or corruption stops the run and is reported with its
step, island, tensor, row (request and slot), |d| or the copy holding a one-sided non-finite value,
plus digests of what went in at that step and the step before. Batch variance and nondeterminism
are kernel findings: counted, the first of each kept, the eager copy's state resynced to the
replay's, and the run goes on (in strict mode they fail the case, but the run still goes on, so
a planted hazard is still found).
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import torch

from .batch import StepBatch
from .capture import DEFAULT_SIZES
from .compare import (KERNEL_FINDINGS, Divergence, compare_outputs, compare_step, digest, first_row,  # noqa: F401
                      max_abs, row_owner)
from .islands.layer import LayerCopy  # noqa: F401
from .options import Options
from .oracle import ChainProbe, IslandProbe
from .runner import EagerRunner, GraphRunner, PieceRunner

__all__ = ["Divergence", "Lockstep", "LockstepResult", "compare_step", "digest", "run_lockstep", "run_moe_lockstep"]


def _step_context(batch: StepBatch | None, runner: GraphRunner | None) -> dict:
    if batch is None:
        return {}
    ctx = {"step": batch.step, "requests": batch.request_ids, "slots": batch.slots,
           "query_lens": batch.query_lens, "has_initial_state": batch.has_initial_state,
           "token_ids": digest(batch.token_ids)}
    if runner is not None:
        n = batch.num_tokens
        size = next((s for s in runner.sizes if s >= n), None)
        ctx["padded_to"] = size
        if size:
            ctx["pad_state_indices"] = runner.token_slot[n:size].tolist()
            ctx["pad_input_ids"] = runner.input_ids[n:size].tolist()
    return ctx


@dataclass
class LockstepResult:
    steps: int
    divergence: Divergence | None  # the first graph hazard or corruption (None: none)
    findings: list
    eager_us: float
    replay_us: float
    replays: int
    captures: int
    kernel_findings: dict = field(default_factory=dict)  # kind -> {"count": n, "first": Divergence}

    @property
    def diverged(self) -> bool:
        return self.divergence is not None


def note_finding(table: dict, div: Divergence) -> None:
    """Count a batch-variance / nondeterminism finding, keeping the first of its kind."""
    entry = table.setdefault(div.kind, {"count": 0, "first": div})
    entry["count"] += 1


class Lockstep:
    """An eager copy and a replay copy of the islands stepping together, and a probe copy the
    oracle re-runs a mismatching step on. `make_copy(island_opts)` builds one copy with its own
    state cache; `opts` (`hazards.options_for`) says what the case's knobs change in each copy and
    in the runner. `step()` returns a failure (graph hazard / corruption) or None; kernel findings
    go to `kernel_findings`."""

    def __init__(self, make_copy, provider, mode="piecewise", opts: Options = Options(), sizes=None,
                 max_tokens=64, trace=None):
        self.provider, self.trace = provider, trace
        self.eager_copy = make_copy(opts.eager_island)
        self.replay_copy = make_copy(opts.replay_island)
        self.eager = EagerRunner(self.eager_copy)
        self.graph = GraphRunner(self.replay_copy, provider, mode=mode, sizes=sizes or DEFAULT_SIZES,
                                 opts=opts.runner, max_tokens=max_tokens)
        self.probe = ChainProbe(make_copy(opts.eager_island), self.graph)
        self.kernel_findings: dict = {}
        self.t_eager = self.t_replay = 0.0
        self.steps = 0
        self.prev: StepBatch | None = None

    @staticmethod
    def _state(copy: LayerCopy) -> dict:
        return {f"gdn_core.{k}": v for k, v in copy.cache.tensors().items()}

    def step(self, batch: StepBatch) -> Divergence | None:
        pre = {k: v.clone() for k, v in self.eager_copy.cache.tensors().items()}
        t0 = time.perf_counter()
        e = self.eager.step(batch)
        t1 = time.perf_counter()
        r = self.graph.step(batch)
        self.provider.synchronize()
        t2 = time.perf_counter()
        self.t_eager += t1 - t0
        self.t_replay += t2 - t1
        self.steps += 1
        div = compare_step(batch, e, r, self.eager_copy, self.replay_copy)
        if self.trace is not None:
            self.trace.write(json.dumps({"step": batch.step, "eager": {k: digest(v) for k, v in e.items()},
                                         "replay": {k: digest(v) for k, v in r.items()}}) + "\n")
        if div is not None:
            div = self.probe.classify(batch, div, {**e, **self._state(self.eager_copy)},
                                      {**r, **self._state(self.replay_copy)}, pre)
            div.context = {"this_step": _step_context(batch, self.graph),
                           "previous_step": _step_context(self.prev, None),
                           "eager_digest": {k: digest(v) for k, v in e.items()},
                           "replay_digest": {k: digest(v) for k, v in r.items()}}
            if div.kind in KERNEL_FINDINGS:
                note_finding(self.kernel_findings, div)
                self.resync()
                div = None
        self.prev = batch
        return div

    def resync(self) -> None:
        """After a kernel finding: the eager copy's state becomes the replay's (equal to the padded
        eager run, or within the kernel's own noise), so the next step is judged afresh."""
        for k, v in self.eager_copy.cache.tensors().items():
            v.copy_(self.replay_copy.cache.tensors()[k])

    def result(self, div: Divergence | None) -> LockstepResult:
        n = max(self.steps, 1)
        return LockstepResult(self.steps, div, list(self.graph.findings), self.t_eager / n * 1e6,
                              self.t_replay / n * 1e6, self.graph.replays, self.graph.captures,
                              dict(self.kernel_findings))


def run_lockstep(make_copy, provider, batches: list[StepBatch], mode="piecewise", opts: Options = Options(),
                 sizes=None, trace=None, progress=None, max_tokens=64) -> LockstepResult:
    ls = Lockstep(make_copy, provider, mode, opts, sizes,
                  max(max_tokens, max((b.num_tokens for b in batches), default=1)), trace)
    div = None
    for i, batch in enumerate(batches):
        div = ls.step(batch)
        if progress:
            progress(i + 1, len(batches))
        if div is not None:
            break
    return ls.result(div)


def run_moe_lockstep(model, provider, batches, sizes=None, progress=None) -> LockstepResult:
    """The `moe` island alone: eager vs one graph per size, fed each step's token rows. A
    mismatch is classified on a probe island (exact and zero-padded eager runs)."""
    from .islands.moe import MoEIsland

    eager = MoEIsland(model.cfg, model.weights, model.head)
    probe = IslandProbe(MoEIsland(model.cfg, model.weights, model.head), sizes or DEFAULT_SIZES)
    runner = PieceRunner(MoEIsland(model.cfg, model.weights, model.head), provider, sizes or DEFAULT_SIZES,
                         max_tokens=max((b.num_tokens for b in batches), default=1))
    t_e = t_r = 0.0
    kernel: dict = {}
    n = 0
    for i, batch in enumerate(batches):
        t0 = time.perf_counter()
        with torch.inference_mode():
            e = {f"moe.{k}": v.clone() for k, v in eager(input_ids=torch.tensor(batch.token_ids, device=provider.device)).items()}
        t1 = time.perf_counter()
        r = runner.step(batch.token_ids)
        provider.synchronize()
        t2 = time.perf_counter()
        t_e += t1 - t0
        t_r += t2 - t1
        n = i + 1
        div = compare_outputs(batch, e, r)
        if div is not None:
            div = probe.classify(batch, div, e, r)
            div.context = {"this_step": _step_context(batch, None)}
            if div.kind in KERNEL_FINDINGS:
                note_finding(kernel, div)  # stateless island: nothing to resync
            else:
                return LockstepResult(n, div, [], t_e / n * 1e6, t_r / n * 1e6, runner.replays, runner.captures,
                                      kernel)
        if progress:
            progress(i + 1, len(batches))
    m = max(n, 1)
    return LockstepResult(n, None, [], t_e / m * 1e6, t_r / m * 1e6, runner.replays, runner.captures, kernel)
