"""The lockstep's classify phases, after the check found a difference or a weight's digest changed:
what the difference is, which copy departed, and which weight was written.

- classify: the oracle (`check.oracle`, through the probe copy `check.probe.ChainProbe`, re-run from
  the eager copy's state before the step) says graph hazard, corruption, batch variance or
  nondeterminism; the step's context goes with it. A kernel finding (batch variance,
  nondeterminism) is counted, the first of each kind kept with the kernel call that shows it, and
  the eager copy resynced to the replay's, so the run goes on.
- the third copy (`check.reference_copy`): says which copy departed from a failure, or finds the
  corruption both copies share, and a router near-tie that explains an expert flip (a `routing
  tie` finding, rounding, not corruption).
- weights: a changed digest is corruption naming the most specific weight, the step that wrote it
  (or the steps between two digests) and, with the third copy, the op that wrote it.

`Classify` is a part of `Lockstep` (`lockstep.py`), not an object of its own: these phases read and
write the lockstep's per-step state (the eager copy's state before the step and before the one
before, the previous step, the tables of kernel findings and bound usage), so they are its methods,
kept here apart from the stepping. The `moe` island's lockstep (`moe.py`) uses the functions.
"""
from __future__ import annotations

from dataclasses import replace

from ..capture.runner import GraphRunner
from ..check.compare import CORRUPTION, KERNEL_FINDINGS, ROUTING_TIE, UNOWNED, WEIGHTS, Divergence, digest, max_abs, row_owner
from ..check.oracle import routing_inputs
from ..check.reference_copy import departed, name_weight_writer
from ..control.batch import StepBatch
from ..islands.layer import LayerCopy


def step_context(batch: StepBatch | None, runner: GraphRunner | None) -> dict:
    """What a report needs of a step: its requests and, for the replay copy, how it was dispatched
    and what the padded rows held."""
    if batch is None:
        return {}
    ctx = {"step": batch.step, "requests": batch.request_ids, "slots": batch.slots,
           "query_lens": batch.query_lens, "has_initial_state": batch.has_initial_state,
           "token_ids": digest(batch.token_ids)}
    if batch.dummy:
        ctx["dummy"] = True
    if runner is not None and runner.last is not None:
        runtime, desc = runner.last
        n = batch.num_tokens
        ctx["runtime_mode"] = str(runtime)
        ctx["padded_to"] = desc.num_tokens if runtime.value else None
        if runtime.value and desc.num_tokens > n:
            ctx["pad_input_ids"] = runner.input_ids[n:desc.num_tokens].tolist()
        pads = runner.pad_state_indices(batch)
        if pads is not None:
            ctx["pad_state_indices"] = pads
    return ctx


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


class Classify:
    """The classify phases of `Lockstep` (module docstring). They read the lockstep's `eager_copy`,
    `replay_copy`, `graph` (the replay's runner), `probe`, `check`, `reference` (or None), `pre` and
    `_pre_prev` (the eager copy's state before this step and the one before), `prev` (the previous
    step) and `_weights_checked_at`, and add to its `kernel_findings` and `bound_usage`."""

    @staticmethod
    def _state(copy: LayerCopy) -> dict:
        return {f"gdn_core.{k}": v for k, v in copy.cache.tensors().items()}

    def _classify(self, batch: StepBatch, div: Divergence, e: dict, r: dict) -> Divergence | None:
        """The oracle's class of a difference, with the step's context; a kernel finding is counted
        (the first of its kind with the kernel call that shows it), the eager copy resynced, and
        None returned."""
        div = self.probe.classify(batch, div, {**e, **self._state(self.eager_copy)},
                                  {**r, **self._state(self.replay_copy)}, self.pre)
        context = {"this_step": step_context(batch, self.graph), "previous_step": step_context(self.prev, None),
                   "eager_digest": {k: digest(v) for k, v in e.items()},
                   "replay_digest": {k: digest(v) for k, v in r.items()}}
        div = replace(div, context=context)
        if div.tensor.endswith("_state") and div.slot is not None and div.request is None \
                and div.slot not in {b for blocks in batch.block_rows() for b in blocks} | set(batch.live_slots):
            div = replace(div, note=UNOWNED, reason=f"{div.reason}; slot {div.slot} is written at this step and {UNOWNED}")
        if div.kind not in KERNEL_FINDINGS:
            return div
        if div.kind not in self.kernel_findings:  # the first of its kind: which kernel call shows it
            div = replace(div, kernel=self.probe.kernel_case(batch, div.kind, self.pre))
        note_finding(self.kernel_findings, div)
        self.resync()
        return None

    def resync(self) -> None:
        """After a kernel finding: the eager copy's state becomes the replay's (equal to the padded
        eager run, or within the kernel's own noise), so the next step is judged afresh."""
        for k, v in self.eager_copy.cache.tensors().items():
            v.copy_(self.replay_copy.cache.tensors()[k])

    def _third_copy(self, batch: StepBatch, div: Divergence | None, e: dict, r: dict, clean: bool):
        # a weight written in this step comes first: the third copy would see both copies depart
        changed = self.check.changed_now()
        if changed:
            return self._weights_changed(changed, batch, self.pre)
        return self._against_reference(batch, div, e, r, copies_equal=clean)

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
            return replace(div, departed=who, reason=f"{div.reason}; {why}")
        if who is None:
            return None
        return replace(first, departed=who, reason=f"eager and replay agree, but {why}",
                       context={"this_step": step_context(batch, self.graph)})

    def _routing(self):
        """(the reference copy's MoE input, the eager copy's, router weight, top_k) of this step."""
        return routing_inputs(self.reference.copy.moe.last_input, self.eager_copy.moe.last_input, self.eager_copy.moe)

    def _weights_judged(self, judged, batch: StepBatch) -> Divergence:
        if judged.weights_now:
            return self._weights_changed(judged.weights, batch, self.pre)
        return self._weights_changed(judged.weights, self.prev, self._pre_prev, before=batch)

    def _weights_changed(self, changed: list, batch: StepBatch | None, pre: dict, before=None) -> Divergence:
        """The weight divergence of a change the digests saw after `batch` (run from `pre`); `batch`
        None: before the first step (`before`), when no step of ours had run."""
        weights = self.check.weights
        if batch is None:
            div = weight_divergence(before.step, changed, weights)
            return replace(div, reason=div.reason.replace(f"at step {before.step}",
                                                          f"before step {before.step}, the first"))
        div = weight_divergence(batch.step, changed, weights, self._weights_checked_at)
        div = replace(div, context={"this_step": step_context(batch, None)})
        if self.reference is not None:  # which op wrote it
            div = replace(div, reason=div.reason + name_weight_writer(self.reference, weights, changed,
                                                                      lambda: self.probe.exact(batch, pre)))
        return div
