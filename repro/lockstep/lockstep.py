"""Lockstep eager vs replay, and the first-divergence microscope.

The same steps run through an eager copy and a replay copy of the islands, each with its own
state caches, and after every step the check phase (`checks.py`) says whether they agree: every
island output (live rows), the whole state of both copies and every weight, with one read a step.
Where they differ, the exact path (`check.compare`, bit for bit, NaN in both copies equal) names
the first tensor, row, request and slot and |d| or the copy holding a one-sided non-finite value;
a state slot no live request owns is said to be so, at the step that wrote it. The oracle
(`check.oracle`: graph hazard, corruption, batch variance, nondeterminism) classifies a difference
on a probe copy re-run from the eager copy's state before the step. A graph hazard or corruption
stops the run and is reported with its step, island, tensor, row (request and slot) and the
digests of what went in at that step and the step before. Batch variance and nondeterminism are
kernel findings: counted, the first of each kept, the eager copy's state resynced to the replay's,
and the run goes on (in strict mode they fail the case, but the run still goes on, so a planted
hazard is still found). The independent third copy (`check.reference_copy`) says which copy
departed, and finds a fault both copies share. What follows the check (the oracle's class, the
third copy's word, the weight a digest saw change) is in `classify.py`.

While the device runs step k the host prepares step k+1's input tensors (`StepBatch.prepare`),
and nothing in a step waits for the device except the one read.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, replace

import torch

from ..capture.runner import EagerRunner, GraphRunner
from ..check.compare import WEIGHTS, Divergence, compare_step, digest, same
from ..check.probe import ChainProbe
from ..check.reference_copy import ReferenceCopy
from ..control.batch import StepBatch
from ..control.shape import StepShape
from ..errors import ReplayRefused
from ..knobs.hazards import PAD_POISON
from ..knobs.options import Options
from ..model.weights import copy_weights
from .checks import CHECKS, DeviceCheck, HostCheck
from .classify import Classify
from .phases import Phases


REFUSED = "replay-refused"  # the finding kind of a replay the runner's assertion stopped


def spans(rows: list[int]) -> str:
    """Rows as ranges: "3, 5..9"."""
    out: list[list[int]] = []
    for r in rows:
        if out and r == out[-1][1] + 1:
            out[-1][1] = r
        else:
            out.append([r, r])
    return ", ".join(f"{a}..{b}" if b > a else str(a) for a, b in out)


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
    phases: dict = field(default_factory=dict)  # Phases.to_json()
    bound_usage: dict = field(default_factory=dict)  # tensor -> largest |d| / bound against the third copy
    reference_steps: int = 0  # steps the third copy ran (its cadence's, and every step where the copies differ)

    @property
    def diverged(self) -> bool:
        return self.divergence is not None


class Lockstep(Classify):
    """An eager copy and a replay copy of the islands stepping together, and a probe copy the
    oracle re-runs a mismatching step on. `make_copy(island_opts)` builds one copy with its own
    state cache; `opts` (`hazards.options_for`) says what the case's knobs change in each copy and
    in the runner. `step()` returns a failure (graph hazard / corruption) or None; kernel findings
    go to `kernel_findings`. `check`: "device" (`checks.DeviceCheck`: one read per step, whole state,
    weights) or "host" (`checks.HostCheck`: per-tensor comparisons on the host). `paths`: where both
    runners' control decisions come from (`capture.control`; None: the mirror's under `opts.control`).
    `shape`: the case's step shape (`control.shape.StepShape`), the copies' K and the runner's sizes.
    What a difference is, after the check, is its `Classify` part (`classify.py`)."""

    def __init__(self, make_copy, provider, mode="piecewise", opts: Options = Options(),
                 shape: StepShape | None = None, trace=None, check: str = "device", weight_every: int = 1,
                 reference: ReferenceCopy | None = None, paths=None):
        if check not in CHECKS:
            raise ValueError(f"check must be one of {CHECKS}")
        self.provider, self.trace = provider, trace
        self.eager_copy = make_copy(opts.eager_island)
        self.replay_copy = make_copy(opts.replay_island)
        self.eager = EagerRunner(self.eager_copy, opts.control, paths)
        shape = StepShape(self.replay_copy.spec_tokens) if shape is None else shape
        self.graph = GraphRunner(self.replay_copy, provider, mode=mode, shape=shape, opts=opts.runner,
                                 rules=opts.control, paths=paths)
        self.probe = ChainProbe(make_copy(opts.eager_island), self.graph)
        self.check = (DeviceCheck({**copy_weights(self.eager_copy), **copy_weights(self.replay_copy)}, weight_every)
                      if check == "device" else HostCheck(provider, self._compare))
        self.kernel_findings: dict = {}
        self.steps = 0
        self.prev: StepBatch | None = None
        self.phases = Phases(provider.device)
        self.device = provider.device
        # the eager copy's state before the step, for the oracle: persistent, refilled each step;
        # the previous step's too (swapped each step), for a weight write seen a step late
        self.pre = {k: v.clone() for k, v in self.eager_copy.cache.tensors().items()}
        self._pre_prev = {k: v.clone() for k, v in self.pre.items()} if self.check.keeps_previous_state else None
        self._weights_checked_at: int | None = None
        self.reference = reference  # the independent third copy (`reference_copy`), or None
        self.refused = False  # the runner's assertion stopped a replay (`REFUSED` finding)
        self.bound_usage: dict = {}  # tensor -> the largest |d| / bound against it (`oracle.corruption`)
        # the null block (sentinel 0: block 0) holds no request's state: not compared (`_null_aside`)
        self.null = 0 if self.replay_copy.cache.sentinel == 0 else None
        self._null_first = torch.full((), -1, dtype=torch.int64, device=self.device)  # first step it differed
        self.poison_seen: set = set()  # padded-row keys already reported as poisoned (`_poisoned`)
        if reference is not None:  # both run eagerly: their MoE inputs tell a router near-tie
            self.eager_copy.moe.keep_input = reference.copy.moe.keep_input = True

    def _compare(self, batch: StepBatch, e: dict, r: dict) -> Divergence | None:
        return compare_step(batch, e, r, self.eager_copy, self.replay_copy)

    def step(self, batch: StepBatch, upcoming: StepBatch | None = None) -> Divergence | None:
        """One checked step, as its phases: eager, replay, check, classify, the third copy, record.
        `upcoming` (the next batch, if known) is prepared while the device works."""
        ph = self.phases
        ph.start()
        captures = self.graph.captures
        self.check.begin(ph)
        if self.check.keeps_previous_state:
            self.pre, self._pre_prev = self._pre_prev, self.pre
        ph.timed("prepare", batch.prepare)
        se, sr = self.eager_copy.cache.tensors(), self.replay_copy.cache.tensors()
        for k, v in se.items():
            self.pre[k].copy_(v)
        e = ph.queued("eager", self.eager.step, batch)
        try:
            r = ph.queued("replay", self.graph.step, batch)
        except ReplayRefused as refused:  # the runner's own assertion: a loud error, the run ends here
            self.graph.notes.add(REFUSED, "runner", str(refused))
            self.refused = True
            self.steps += 1
            self._record(batch, e, {})
            ph.stop(steady=False)
            return None
        held = self._null_aside(batch)
        judged = self.check.judge(batch, e, r, se, sr, upcoming, ph, self.graph.padding)
        for key in judged.poisoned:
            self._poisoned(batch, key)
        div = self._weights_judged(judged, batch) if judged.weights else judged.div
        if self.check.digested and self.prev is not None:
            self._weights_checked_at = self.prev.step
        self.steps += 1
        if div is not None and div.island != WEIGHTS:
            div = ph.timed("oracle", self._classify, batch, div, e, r)
        if self.reference is not None and (div is not None or self.reference.due(self.steps - 1)) \
                and (div is None or div.island != WEIGHTS):  # a failing step is judged whatever the cadence
            div = ph.timed("reference", self._third_copy, batch, div, e, r, judged.clean)
        self._null_back(held)
        self._record(batch, e, r)
        ph.stop(steady=self.graph.captures == captures)
        return div

    def _null_aside(self, batch: StepBatch) -> dict | None:
        """The replay copy's null block, set aside while the step is compared, the eager copy's in its
        place: a kernel may write it for padded rows (vllm-xpu-kernels' do: `kernels/gdn/xpu_semantics.py`)
        and its bytes are no request's state. The first step where it differed is kept (`damage`), on the
        device (no host read); `_null_back` puts it back, so later replays read what they wrote there."""
        if self.null is None:
            return None
        se, sr = self.eager_copy.cache.tensors(), self.replay_copy.cache.tensors()
        held = {k: v[self.null].clone() for k, v in sr.items()}
        differs = torch.stack([(held[k] != se[k][self.null]).any() for k in held]).any()
        self._null_first = torch.where((self._null_first < 0) & differs, batch.step, self._null_first)
        for k, v in sr.items():
            v[self.null].copy_(se[k][self.null])
        return held

    def _null_back(self, held: dict | None) -> None:
        if held is not None:
            for k, v in self.replay_copy.cache.tensors().items():
                v[self.null].copy_(held[k])

    @property
    def null_written(self) -> int | None:
        """The first step whose replay left the null block other than the eager copy's (None: none)."""
        first = int(self._null_first)
        return first if first >= 0 else None

    def damage(self, batch: StepBatch, div: Divergence | None) -> dict:
        """Where the run stopped: the state blocks the two copies hold apart (the null block's with the
        replay's bytes, listed as written once it ever differed), those a request of the step owns,
        and whether a live request is hurt (its output row, or a block it owns)."""
        se, sr = self.eager_copy.cache.tensors(), self.replay_copy.cache.tensors()
        blocks = sorted({s for k in se for s in range(se[k].shape[0]) if not same(se[k][s], sr[k][s])})
        first = self.null_written
        if first is not None and self.null not in blocks:
            blocks = sorted(blocks + [self.null])
        owned = {b for row in batch.block_rows() for b in row} | set(batch.live_slots)
        live = [b for b in blocks if b in owned and b != self.null]
        row_hurt = div is not None and div.row is not None and div.request is not None
        return {"blocks": blocks, "live_blocks": live, "null": self.null, "null_written": first,
                "live": bool(live) or row_hurt}

    def _poisoned(self, batch: StepBatch, key: str) -> None:
        """A `pad-poison` finding (`PAD_POISON`): padded rows of a piece's output that a later piece
        reads hold non-finite values. No live row differs (every op of this rebuild is row-wise), but
        in a stack whose pieces mix rows (expert-parallel dispatch, a collective over the padded
        batch) that is corruption. Reported once per tensor, at the first step it is seen."""
        if key in self.poison_seen:
            return
        self.poison_seen.add(key)
        t = self.graph.padding[key]
        n = batch.num_tokens
        rows = (n + torch.nonzero(~torch.isfinite(t).reshape(t.shape[0], -1).all(-1)).flatten()).tolist()
        piece, _, tensor = key.partition(".")
        self.graph.notes.add(PAD_POISON, piece, f"step {batch.step}: {key} holds non-finite values in padded rows "
                             f"{spans(rows)} (live rows 0..{n - 1}, padded to {n + t.shape[0]}), which the next piece "
                             "reads: no live row differs here, but a piece that mixes rows would spread it")

    def _record(self, batch: StepBatch, e: dict, r: dict) -> None:
        if self.trace is not None:
            self.trace.write(json.dumps({"step": batch.step, "eager": {k: digest(v) for k, v in e.items()},
                                         "replay": {k: digest(v) for k, v in r.items()}}) + "\n")
        self.prev = batch
        batch.release()

    def finish(self) -> Divergence | None:
        """After the last step: the weight digests of what it left (`StepCheck.begin` reads each
        step's at the next step). None when nothing changed, or nothing ran."""
        if self.prev is None:
            return None
        changed = self.check.changed_now()
        return self._weights_changed(changed, self.prev, self.pre) if changed else None

    def run(self, batches: list[StepBatch], progress=None) -> Divergence | None:
        """Every batch in turn, to the first divergence (or a replay the runner refused); then `finish`."""
        for i, batch in enumerate(batches):
            div = self.step(batch, batches[i + 1] if i + 1 < len(batches) else None)
            if progress:
                progress(i + 1, len(batches))
            if div is not None or self.refused:
                return None if div is None else replace(div, damage=self.damage(batch, div))
        return self.finish()

    def result(self, div: Divergence | None) -> LockstepResult:
        n = max(self.steps, 1)
        us = self.phases.us
        return LockstepResult(self.steps, div, list(self.graph.findings), us["eager"] / n,
                              us["replay"] / n, self.graph.replays, self.graph.captures,
                              dict(self.kernel_findings), self.phases.to_json(), dict(self.bound_usage),
                              self.reference.runs if self.reference is not None else 0)


def run_lockstep(make_copy, provider, batches: list[StepBatch], mode="piecewise", opts: Options = Options(),
                 shape: StepShape = StepShape(), trace=None, progress=None, check: str = "device",
                 weight_every: int = 1, reference: ReferenceCopy | None = None, paths=None) -> LockstepResult:
    """`batches` in lockstep under `shape` (its budget widened to the largest step, as a recorded
    step may hold more tokens than the budget the shape was drawn with)."""
    shape = replace(shape, max_tokens=max(shape.max_tokens, max((b.num_tokens for b in batches), default=1)))
    ls = Lockstep(make_copy, provider, mode, opts, shape, trace, check, weight_every, reference, paths)
    return ls.result(ls.run(batches, progress))
