"""The lockstep's check phase, one strategy a way of checking: after both copies ran a step, say
whether they agree and, where they do not, the first difference (a `Divergence`).

- `DeviceCheck`: every output, the whole state of both copies (every slot: live, freed and the null
  block), every weight and the replay's watched padded rows (padding poison: non-finite values a
  later piece reads) are checked on the device, and the host reads one small vector once
  (`check.stepcheck`: the step's one synchronisation); the exact path (`check.compare`) runs only
  where a flag is set. A weight whose digest changed is corruption naming the tensor and the step
  that wrote it: both copies read the same weights, so comparing them cannot see it. The digest
  runs at the start of the next step, where the device would otherwise idle, so that step reports
  it; `changed_now` reads the weights at once.
- `HostCheck`: per-tensor comparisons on the host, live and touched slots only, no weights: the
  straightforward path the tests hold the device check against, and a row of `repro bench`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..check.compare import Divergence, compare_outputs, compare_slots
from ..check.stepcheck import StepCheck, Verdict, nonfinite
from ..control.batch import StepBatch

CHECKS = ("device", "host")


@dataclass
class Judged:
    """What the check phase says about one step."""
    div: Divergence | None  # the first difference (unclassified), or None
    clean: bool  # every output and state slot of the two copies seen equal (the device check only)
    weights: list  # weight names whose digest changed (`div` is then None: the lockstep names them)
    weights_now: bool = False  # the change was seen in this step (not one step late)
    poisoned: list = field(default_factory=list)  # padded-row keys holding a non-finite value


def locate(batch, verdict: Verdict, e: dict, r: dict, se: dict, sr: dict) -> Divergence | None:
    """The exact path, only where the device flags point: the first flagged output that differs
    (data-flow order), then the first flagged state slot. None: the flagged bits are equal values
    (+0.0 vs -0.0, NaN payloads), which the exact path calls equal."""
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


class DeviceCheck:
    """One read a step (module docstring). `weights`: every weight of both copies, by name."""

    name = "device"
    keeps_previous_state = True  # a weight change seen a step late is judged from the step before

    def __init__(self, weights: dict, weight_every: int = 1):
        self.stepcheck = StepCheck(weights, weight_every)
        self.digested = False

    @property
    def weights(self) -> dict:
        return self.stepcheck.weights

    def begin(self, phases) -> None:
        """Before the step's work: the weights' digests as the previous step left them."""
        self.digested = self.stepcheck.begin()
        phases.mark("weights")

    def judge(self, batch: StepBatch, e: dict, r: dict, se: dict, sr: dict, upcoming, phases,
              pads: dict | None = None) -> Judged:
        """`pads`: the replay's padded rows a later piece reads (`GraphRunner.padding`)."""
        pending = self.stepcheck.launch(e, r, se, sr, phases.mark, pads)
        if upcoming is not None:  # the host prepares the next step while the device checks this one
            phases.timed("prepare", upcoming.prepare)
        verdict = phases.timed("read", self.stepcheck.read, pending)  # the step's one synchronisation
        poisoned = verdict.poisoned
        if verdict.weights:  # written by the previous step (or before the first)
            return Judged(None, verdict.clean, verdict.weights, poisoned=poisoned)
        if not verdict.clean:  # a weight written in this step comes first (outputs follow from it)
            changed = self.stepcheck.changed_now()
            if changed:
                return Judged(None, False, changed, weights_now=True, poisoned=poisoned)
            return Judged(locate(batch, verdict, e, r, se, sr), False, [], poisoned=poisoned)
        return Judged(None, True, [], poisoned=poisoned)

    def changed_now(self) -> list:
        return self.stepcheck.changed_now()


class HostCheck:
    """Per-tensor comparisons on the host (module docstring): `compare(batch, e, r)` gives the first
    difference of a step (the chain's outputs and state slots, or an island's outputs)."""

    name = "host"
    keeps_previous_state = False
    weights: dict = {}
    digested = False

    def __init__(self, provider, compare):
        self.provider, self.compare = provider, compare

    def begin(self, phases) -> None:
        pass

    def judge(self, batch: StepBatch, e: dict, r: dict, se: dict, sr: dict, upcoming, phases,
              pads: dict | None = None) -> Judged:
        self.provider.synchronize()
        phases.mark("replay")
        poisoned = [k for k, t in (pads or {}).items() if bool(nonfinite(t))]
        return Judged(phases.queued("compare", self.compare, batch, e, r), False, [], poisoned=poisoned)

    def changed_now(self) -> list:
        return []
