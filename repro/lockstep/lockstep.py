"""Lockstep eager vs replay, and the first-divergence microscope.

The same steps run through an eager copy and a replay copy of the islands, each with its own
state caches. After every step every island output (live rows), the *whole* state of both copies
(every conv and ssm slot: live, freed and the null block) and every weight are checked on the
device, and the host reads one small vector of flags and digests once (`stepcheck.py`: one
synchronisation per step). Where a flag is set, the exact path (`compare.py`, bit for bit, NaN in
both copies equal) names the first tensor, row, request and slot and |d| or the copy holding a
one-sided non-finite value; a state slot no live request owns is said to be so, at the step that
wrote it (issue 16.3). A difference is classified by the oracle (`oracle.py`: graph hazard,
corruption, batch variance, nondeterminism) on a third copy, the probe, re-run from the eager
copy's state before the step. A graph hazard or corruption stops the run and is reported with its
step, island, tensor, row (request and slot), |d| or the copy holding a one-sided non-finite value,
plus digests of what went in at that step and the step before. A weight whose digest changed is
corruption naming the tensor and the step that wrote it (issue 16.2: both copies read the same
weights, so comparing them cannot see it); the digest runs at the start of the next step, where
the device would otherwise idle, so that step reports it (`finish` reads the last step's). Batch
variance and nondeterminism are kernel findings: counted, the first of each kept, the eager
copy's state resynced to the replay's, and the run goes on (in strict mode they fail the case,
but the run still goes on, so a planted hazard is still found).

While the device runs step k the host prepares step k+1's input tensors (`StepBatch.prepare`),
and nothing in a step waits for the device except the one read. `check="host"` keeps the
previous path (per-tensor comparisons on the host, live and touched slots only, no weights): the
tests hold the two against each other and `repro bench --lockstep-rates` measures both.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import torch

from ..control.batch import StepBatch
from ..capture.piece import DEFAULT_SIZES
from ..check.compare import (CORRUPTION, KERNEL_FINDINGS, ROUTING_TIE, UNOWNED, WEIGHTS, Divergence, compare_outputs,
                             compare_slots, compare_step, digest, max_abs, row_owner)
from ..islands.layer import LayerCopy
from ..knobs.options import Options
from ..check.oracle import ChainProbe, IslandProbe, routing_inputs
from ..capture.runner import EagerRunner, GraphRunner, PieceRunner
from ..check.reference_copy import ReferenceCopy, departed, name_weight_writer
from ..check.stepcheck import StepCheck, Verdict
from ..model.weights import copy_weights, island_weights

__all__ = ["Divergence", "Lockstep", "LockstepResult", "compare_step", "digest", "run_lockstep", "run_moe_lockstep"]

CHECKS = ("device", "host")
PHASES = ("prepare", "eager", "replay", "compare", "weights", "read", "oracle", "reference")


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


class Phases:
    """Where a step's time goes, without adding a synchronisation: device events between phases
    on a GPU (read after the step's one read), host time elsewhere (on the CPU tape the two are
    the same). `prepare` (the next step's host tensors) and `read` are host time: on a GPU they
    overlap device work, so the fractions can add up to more than 1. Steps that captured a graph
    are counted in `us` (the result's eager/replay times) but left out of the steady figures."""

    def __init__(self, device):
        self.device = torch.device(device)
        backend = getattr(torch, self.device.type, None) if self.device.type in ("cuda", "xpu") else None
        self.Event = backend.Event if backend is not None else None
        self.events = self.Event is not None
        self.us = dict.fromkeys(PHASES, 0.0)  # every step
        self.steady = dict.fromkeys(PHASES, 0.0)  # steps that captured nothing
        self.wall = self.steady_wall = 0.0
        self.steps = self.steady_steps = 0
        self._marks: list = []
        self._pool: list = []  # events made once and recorded again each step (a new one costs host time)
        self._step: dict = {}

    def start(self) -> None:
        self._t0 = self._last = time.perf_counter()
        self._step = dict.fromkeys(PHASES, 0.0)
        self._marks = [(None, self._event())] if self.events else []

    def _event(self):
        """The step's next event, recorded now. Safe to record again: `stop` comes after the step's
        read, which synchronises, so every event of the last step has completed."""
        i = len(self._marks)
        if i == len(self._pool):
            self._pool.append(self.Event(enable_timing=True))
        ev = self._pool[i]
        ev.record()
        return ev

    def mark(self, name: str) -> None:
        """End of device phase `name`."""
        if self.events:
            self._marks.append((name, self._event()))
        else:
            now = time.perf_counter()
            self._step[name] += (now - self._last) * 1e6
            self._last = now

    def host(self, name: str, t0: float) -> None:
        """Host phase `name` began at `t0` and ends now."""
        now = time.perf_counter()
        self._step[name] += (now - t0) * 1e6
        if not self.events:
            self._last = now

    def stop(self, steady: bool = True) -> None:
        """After the step's read: every event has completed. `steady`: no capture in this step."""
        for (_, a), (name, b) in zip(self._marks, self._marks[1:]):
            self._step[name] += a.elapsed_time(b) * 1e3
        self._marks = []
        wall = time.perf_counter() - self._t0
        self.wall += wall
        self.steps += 1
        for k, v in self._step.items():
            self.us[k] += v
            if steady:
                self.steady[k] += v
        if steady:
            self.steady_wall += wall
            self.steady_steps += 1

    def to_json(self) -> dict:
        """Steady-state figures (steps without a capture) and the whole run's steps/s."""
        n = max(self.steady_steps, 1)
        wall_us = self.steady_wall / n * 1e6
        return {"steps": self.steps, "steady_steps": self.steady_steps,
                "steps_per_s": round(self.steps / self.wall, 2) if self.wall else None,
                "steady_steps_per_s": round(self.steady_steps / self.steady_wall, 2) if self.steady_wall else None,
                "step_us": round(wall_us, 1), "timing": "device events" if self.events else "host clock",
                "us_per_step": {k: round(v / n, 2) for k, v in self.steady.items()},
                "fractions": {k: round(v / n / wall_us, 4) if wall_us else None for k, v in self.steady.items()}}


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


def note_finding(table: dict, div: Divergence) -> None:
    """Count a batch-variance / nondeterminism finding, keeping the first of its kind."""
    entry = table.setdefault(div.kind, {"count": 0, "first": div})
    entry["count"] += 1


def _routing_finding(batch, ref: dict, eager: dict, ties: dict) -> Divergence:
    """A `routing tie` finding: the first row whose expert flip a near-tie explains."""
    row = min(ties)
    rid, slot = row_owner(batch, row)
    d = max_abs(ref["submod1.hidden"][row], eager["submod1.hidden"][row])
    return Divergence(batch.step, "submod1", "hidden", row, rid, slot, d, kind=ROUTING_TIE,
                      reason=f"against the independent reference copy: {ties[row]}; an expert flip moves its "
                             f"token's rows by a whole expert's share (here |d| {d:.3g} in submod1.hidden): rounding, "
                             "not corruption"
                             + (f"; {len(ties)} rows at this step" if len(ties) > 1 else ""))


def weight_divergence(step: int, changed: list[str], weights: dict, since: int | None = None) -> Divergence:
    """Corruption naming the most specific changed weight (the smallest: a row view of a stacked
    matrix before the matrix)."""
    name = min(changed, key=lambda k: (weights[k].numel(), changed.index(k)))
    when = f"after step {since}, by step {step}" if since is not None and since < step - 1 else f"at step {step}"
    others = [k for k in changed if k != name]
    reason = (f"weight {name} changed in place {when}: weights are constants, and both copies read the same "
              f"tensor, so comparing them cannot see it" + (f"; also changed: {', '.join(others)}" if others else ""))
    return Divergence(step, WEIGHTS, name, None, None, None, 0.0, kind=CORRUPTION, reason=reason,
                      note="changed in place")


def locate(batch, verdict: Verdict, e: dict, r: dict, se: dict, sr: dict) -> Divergence | None:
    """The exact path, only where the device flags point: the first flagged output that differs
    (data-flow order), then the first flagged state slot. None: the flagged bits are equal values
    (+0.0 vs -0.0, NaN payloads), as the previous path judged them."""
    if verdict.outputs:
        div = compare_outputs(batch, {k: e[k] for k in verdict.outputs}, {k: r[k] for k in verdict.outputs})
        if div is not None:
            return div
    for name, slots in verdict.slots.items():
        if slots:
            div = compare_slots(batch, {name: se[name]}, {name: sr[name]}, slots)
            if div is not None:
                return div
    return None


class Lockstep:
    """An eager copy and a replay copy of the islands stepping together, and a probe copy the
    oracle re-runs a mismatching step on. `make_copy(island_opts)` builds one copy with its own
    state cache; `opts` (`hazards.options_for`) says what the case's knobs change in each copy and
    in the runner. `step()` returns a failure (graph hazard / corruption) or None; kernel findings
    go to `kernel_findings`. `check`: "device" (one read per step, whole state, weights) or
    "host" (the previous per-tensor path, kept as the tests' and the bench's reference)."""

    def __init__(self, make_copy, provider, mode="piecewise", opts: Options = Options(), sizes=None,
                 max_tokens=64, trace=None, check: str = "device", weight_every: int = 1,
                 reference: ReferenceCopy | None = None):
        if check not in CHECKS:
            raise ValueError(f"check must be one of {CHECKS}")
        self.provider, self.trace, self.check = provider, trace, check
        self.eager_copy = make_copy(opts.eager_island)
        self.replay_copy = make_copy(opts.replay_island)
        self.eager = EagerRunner(self.eager_copy)
        self.graph = GraphRunner(self.replay_copy, provider, mode=mode, sizes=sizes or DEFAULT_SIZES,
                                 opts=opts.runner, max_tokens=max_tokens)
        self.probe = ChainProbe(make_copy(opts.eager_island), self.graph)
        self.kernel_findings: dict = {}
        self.steps = 0
        self.prev: StepBatch | None = None
        self.phases = Phases(provider.device)
        self.device = provider.device
        # the eager copy's state before the step, for the oracle: persistent, refilled each step;
        # the previous step's too (swapped each step), for a weight write seen a step late (`begin`)
        self.pre = {k: v.clone() for k, v in self.eager_copy.cache.tensors().items()}
        self._pre_prev = {k: v.clone() for k, v in self.pre.items()} if check == "device" else None
        weights = {**copy_weights(self.eager_copy), **copy_weights(self.replay_copy)} if check == "device" else {}
        self.stepcheck = StepCheck(weights, weight_every)
        self._weights_checked_at: int | None = None
        self.reference = reference  # the independent third copy (`reference_copy`), or None
        self.bound_usage: dict = {}  # tensor -> the largest |d| / bound against it (`oracle.corruption`)
        if reference is not None:  # both run eagerly: their MoE inputs tell a router near-tie
            self.eager_copy.moe.keep_input = reference.copy.moe.keep_input = True

    @staticmethod
    def _state(copy: LayerCopy) -> dict:
        return {f"gdn_core.{k}": v for k, v in copy.cache.tensors().items()}

    def step(self, batch: StepBatch, upcoming: StepBatch | None = None) -> Divergence | None:
        """One checked step; `upcoming` (the next batch, if known) is prepared while the device works."""
        ph = self.phases
        ph.start()
        captures = self.graph.captures
        if self.check == "device":
            digested = self.stepcheck.begin()  # the weights as the previous step left them
            ph.mark("weights")
            self.pre, self._pre_prev = self._pre_prev, self.pre
        t = time.perf_counter()
        batch.prepare()
        ph.host("prepare", t)
        se, sr = self.eager_copy.cache.tensors(), self.replay_copy.cache.tensors()
        for k, v in se.items():
            self.pre[k].copy_(v)
        e = self.eager.step(batch)
        ph.mark("eager")
        r = self.graph.step(batch)
        ph.mark("replay")
        clean = False  # every output and state slot of the two copies seen equal (the device check)
        if self.check == "device":
            pending = self.stepcheck.launch(e, r, se, sr, ph.mark)
            if upcoming is not None:
                t = time.perf_counter()
                upcoming.prepare()
                ph.host("prepare", t)
            t = time.perf_counter()
            verdict = self.stepcheck.read(pending)  # the step's one synchronisation
            ph.host("read", t)
            clean = verdict.clean
            div = None
            if verdict.weights:  # written by the previous step (or before the first)
                div = self._weights_changed(verdict.weights, self.prev, self._pre_prev, before=batch)
            elif not verdict.clean:  # a weight written in this step comes first (outputs follow from it)
                changed = self.stepcheck.changed_now()
                div = self._weights_changed(changed, batch, self.pre) if changed else \
                    locate(batch, verdict, e, r, se, sr)
            if digested and self.prev is not None:
                self._weights_checked_at = self.prev.step
        else:
            self.provider.synchronize()
            ph.mark("replay")
            div = compare_step(batch, e, r, self.eager_copy, self.replay_copy)
            ph.mark("compare")
        self.steps += 1
        if self.trace is not None:
            self.trace.write(json.dumps({"step": batch.step, "eager": {k: digest(v) for k, v in e.items()},
                                         "replay": {k: digest(v) for k, v in r.items()}}) + "\n")
        if div is not None and div.island != WEIGHTS:
            t = time.perf_counter()
            div = self.probe.classify(batch, div, {**e, **self._state(self.eager_copy)},
                                      {**r, **self._state(self.replay_copy)}, self.pre)
            div.context = {"this_step": _step_context(batch, self.graph),
                           "previous_step": _step_context(self.prev, None),
                           "eager_digest": {k: digest(v) for k, v in e.items()},
                           "replay_digest": {k: digest(v) for k, v in r.items()}}
            if div.tensor.endswith("_state") and div.slot is not None and div.request is None \
                    and div.slot not in set(batch.slots) | set(batch.live_slots):
                div.note = UNOWNED
                div.reason += f"; slot {div.slot} is written at this step and {UNOWNED}"
            if div.kind in KERNEL_FINDINGS:
                if div.kind not in self.kernel_findings:  # the first of its kind: which kernel call shows it
                    div.kernel = self.probe.kernel_case(batch, div.kind, self.pre)
                note_finding(self.kernel_findings, div)
                self.resync()
                div = None
            ph.host("oracle", t)
        if self.reference is not None and (div is not None or self.reference.due(self.steps - 1)) \
                and (div is None or div.island != WEIGHTS):  # a failing step is judged whatever the cadence
            t = time.perf_counter()
            # a weight written in this step comes first: the third copy would see both copies depart
            changed = self.stepcheck.changed_now() if self.check == "device" else []
            div = self._weights_changed(changed, batch, self.pre) if changed else \
                self._against_reference(batch, div, e, r, copies_equal=clean)
            ph.host("reference", t)
        ph.stop(steady=self.graph.captures == captures)
        self.prev = batch
        batch.release()
        return div

    def _weights_changed(self, changed: list, batch: StepBatch | None, pre: dict, before=None) -> Divergence:
        """The weight divergence of a change the digests saw after `batch` (run from `pre`); `batch`
        None: before the first step (`before`), when no step of ours had run."""
        if batch is None:
            div = weight_divergence(before.step, changed, self.stepcheck.weights)
            div.reason = div.reason.replace(f"at step {before.step}", f"before step {before.step}, the first")
            return div
        div = weight_divergence(batch.step, changed, self.stepcheck.weights, self._weights_checked_at)
        div.context = {"this_step": _step_context(batch, None)}
        if self.reference is not None:  # which op wrote it (issue 16.2)
            div.reason += name_weight_writer(self.reference, self.stepcheck.weights, changed,
                                             lambda: self.probe.exact(batch, pre))
        return div

    def finish(self) -> Divergence | None:
        """After the last step: the weight digests of what it left (`StepCheck.begin` reads each
        step's at the next step). None when nothing changed, or nothing ran."""
        if self.check != "device" or self.prev is None:
            return None
        changed = self.stepcheck.changed_now()
        return self._weights_changed(changed, self.prev, self.pre) if changed else None

    def run(self, batches: list[StepBatch], progress=None) -> Divergence | None:
        """Every batch in turn, to the first divergence; then `finish`."""
        for i, batch in enumerate(batches):
            div = self.step(batch, batches[i + 1] if i + 1 < len(batches) else None)
            if progress:
                progress(i + 1, len(batches))
            if div is not None:
                return div
        return self.finish()

    def _against_reference(self, batch, div: Divergence | None, e: dict, r: dict,
                           copies_equal: bool = False) -> Divergence | None:
        """The step on the independent copy (`reference_copy`): says which copy departed from a
        failure, or finds the corruption both copies share. `copies_equal`: the device check saw
        every output and state slot of the two copies equal at this step."""
        ref = self.reference.run(batch, self.pre)
        who, why, first, ties = departed(batch, ref, {**e, **self._state(self.eager_copy)},
                                         {**r, **self._state(self.replay_copy)}, self.probe.logits, self._routing,
                                         self.bound_usage, copies_equal)
        if ties:
            note_finding(self.kernel_findings, _routing_finding(batch, ref, e, ties))
        if who is not None and not self.reference.intact():
            why, who = "the reference copy's own weights changed: it was not consulted", None
        if div is not None:
            div.departed = who
            div.reason += f"; {why}"
            return div
        if who is None:
            return None
        first.departed = who
        first.reason = f"eager and replay agree, but {why}"
        first.context = {"this_step": _step_context(batch, self.graph)}
        return first

    def _routing(self):
        """(the reference copy's MoE input, the eager copy's, router weight, top_k) of this step."""
        return routing_inputs(self.reference.copy.moe.last_input, self.eager_copy.moe.last_input, self.eager_copy.moe)

    def resync(self) -> None:
        """After a kernel finding: the eager copy's state becomes the replay's (equal to the padded
        eager run, or within the kernel's own noise), so the next step is judged afresh."""
        for k, v in self.eager_copy.cache.tensors().items():
            v.copy_(self.replay_copy.cache.tensors()[k])

    def result(self, div: Divergence | None) -> LockstepResult:
        n = max(self.steps, 1)
        us = self.phases.us
        return LockstepResult(self.steps, div, list(self.graph.findings), us["eager"] / n,
                              us["replay"] / n, self.graph.replays, self.graph.captures,
                              dict(self.kernel_findings), self.phases.to_json(), dict(self.bound_usage),
                              self.reference.runs if self.reference is not None else 0)


def run_lockstep(make_copy, provider, batches: list[StepBatch], mode="piecewise", opts: Options = Options(),
                 sizes=None, trace=None, progress=None, max_tokens=64, check: str = "device",
                 weight_every: int = 1, reference: ReferenceCopy | None = None) -> LockstepResult:
    ls = Lockstep(make_copy, provider, mode, opts, sizes,
                  max(max_tokens, max((b.num_tokens for b in batches), default=1)), trace, check, weight_every,
                  reference)
    return ls.result(ls.run(batches, progress))


def moe_copies(model, provider, batches, sizes=None):
    """The `moe` island's two copies: an eager island, and a `PieceRunner` graphing another per size."""
    from ..islands.moe import MoEIsland
    eager = MoEIsland(model.cfg, model.weights, model.head)
    runner = PieceRunner(MoEIsland(model.cfg, model.weights, model.head), provider, sizes or DEFAULT_SIZES,
                         max_tokens=max((b.num_tokens for b in batches), default=1))
    return eager, runner


def run_moe_lockstep(model, provider, batches, sizes=None, progress=None, check: str = "device") -> LockstepResult:
    """The `moe` island alone: eager vs one graph per size, fed each step's token rows. A
    mismatch is classified on a probe island (exact and zero-padded eager runs). The outputs and
    the weights are checked on the device with one read per step, as in `Lockstep`."""
    from ..islands.moe import MoEIsland

    eager, runner = moe_copies(model, provider, batches, sizes)
    probe = IslandProbe(MoEIsland(model.cfg, model.weights, model.head), sizes or DEFAULT_SIZES)
    sc = StepCheck(island_weights(eager) if check == "device" else {})
    ph = Phases(provider.device)
    kernel: dict = {}
    n = 0

    def result(div):
        m = max(n, 1)
        return LockstepResult(n, div, [], ph.us["eager"] / m, ph.us["replay"] / m, runner.replays,
                              runner.captures, kernel, ph.to_json())

    prev = None
    for i, batch in enumerate(batches):
        ph.start()
        captures = runner.captures
        if check == "device":
            sc.begin()  # the weights as the previous step left them
            ph.mark("weights")
        t = time.perf_counter()
        batch.prepare()
        ph.host("prepare", t)
        with torch.inference_mode():
            e = {f"moe.{k}": v for k, v in eager(input_ids=batch.ids(provider.device)).items()}
        ph.mark("eager")
        r = runner.step(batch.host_ids())
        ph.mark("replay")
        n = i + 1
        if check == "device":
            pending = sc.launch(e, r, {}, {}, ph.mark)
            if i + 1 < len(batches):
                t = time.perf_counter()
                batches[i + 1].prepare()
                ph.host("prepare", t)
            t = time.perf_counter()
            verdict = sc.read(pending)
            ph.host("read", t)
            if verdict.weights:  # written by the previous step (`StepCheck.begin`)
                ph.stop(runner.captures == captures)
                return result(weight_divergence((prev or batch).step, verdict.weights, sc.weights))
            changed = sc.changed_now() if verdict.outputs else []  # a weight written in this step comes first
            if changed:
                ph.stop(runner.captures == captures)
                return result(weight_divergence(batch.step, changed, sc.weights))
            div = compare_outputs(batch, {k: e[k] for k in verdict.outputs}, {k: r[k] for k in verdict.outputs}) \
                if verdict.outputs else None
        else:
            provider.synchronize()
            ph.mark("replay")
            div = compare_outputs(batch, e, r)
            ph.mark("compare")
        if div is not None:
            t = time.perf_counter()
            div = probe.classify(batch, div, e, r)
            div.context = {"this_step": _step_context(batch, None)}
            ph.host("oracle", t)
            if div.kind in KERNEL_FINDINGS:
                if div.kind not in kernel:
                    div.kernel = probe.kernel_case(batch, div.kind)
                note_finding(kernel, div)  # stateless island: nothing to resync
            else:
                ph.stop(runner.captures == captures)
                return result(div)
        ph.stop(runner.captures == captures)
        batch.release()
        prev = batch
        if progress:
            progress(i + 1, len(batches))
    changed = sc.changed_now() if check == "device" and prev is not None else []
    return result(weight_divergence(prev.step, changed, sc.weights) if changed else None)
