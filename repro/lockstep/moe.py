"""The `moe` island alone in lockstep: an eager island against one graph per size (`PieceRunner`),
fed each step's token rows, checked on the device with one read a step as the chain is."""
from __future__ import annotations

from dataclasses import replace

import torch

from ..control.dispatch import DEFAULT_SIZES
from ..capture.runner import PieceRunner
from ..check.compare import KERNEL_FINDINGS, compare_outputs
from ..check.probe import IslandProbe
from ..islands.moe import MoEIsland
from ..model.weights import island_weights
from .classify import note_finding, step_context, weight_divergence
from .lockstep import LockstepResult
from .checks import DeviceCheck, HostCheck
from .phases import Phases


def moe_copies(model, provider, batches, sizes=None):
    """The `moe` island's two copies: an eager island, and a `PieceRunner` graphing another per size."""
    eager = MoEIsland(model.cfg, model.weights, model.head)
    runner = PieceRunner(MoEIsland(model.cfg, model.weights, model.head), provider, sizes or DEFAULT_SIZES,
                         max_tokens=max((b.num_tokens for b in batches), default=1))
    return eager, runner


def run_moe_lockstep(model, provider, batches, sizes=None, progress=None, check: str = "device") -> LockstepResult:
    """The `moe` island alone: eager vs one graph per size, fed each step's token rows. A
    mismatch is classified on a probe island (exact and zero-padded eager runs). The outputs and
    the weights are checked as the chain's are (`checks.DeviceCheck` or `checks.HostCheck`)."""
    eager, runner = moe_copies(model, provider, batches, sizes)
    probe = IslandProbe(MoEIsland(model.cfg, model.weights, model.head), sizes or DEFAULT_SIZES)
    checker = DeviceCheck(island_weights(eager)) if check == "device" else HostCheck(provider, compare_outputs)
    ph = Phases(provider.device)
    kernel: dict = {}
    n, prev, div = 0, None, None

    def eager_step(batch):
        with torch.inference_mode():
            return {f"moe.{k}": v for k, v in eager(input_ids=batch.ids(provider.device)).items()}

    for i, batch in enumerate(batches):
        ph.start()
        captures = runner.captures
        checker.begin(ph)
        ph.timed("prepare", batch.prepare)
        e = ph.queued("eager", eager_step, batch)
        r = ph.queued("replay", runner.step, batch.host_ids())
        n = i + 1
        judged = checker.judge(batch, e, r, {}, {}, batches[i + 1] if i + 1 < len(batches) else None, ph)
        if judged.weights:  # a weight written in this step, or (seen a step late) by the previous one
            div = weight_divergence((batch if judged.weights_now else prev or batch).step, judged.weights,
                                    checker.weights)
        elif judged.div is not None:
            div = ph.timed("oracle", _classify, probe, kernel, batch, judged.div, e, r)
        ph.stop(runner.captures == captures)
        if div is not None:
            break
        batch.release()
        prev = batch
        if progress:
            progress(i + 1, len(batches))
    else:
        changed = checker.changed_now() if prev is not None else []
        div = weight_divergence(prev.step, changed, checker.weights) if changed else None
    m = max(n, 1)
    return LockstepResult(n, div, [], ph.us["eager"] / m, ph.us["replay"] / m, runner.replays, runner.captures,
                          kernel, ph.to_json())


def _classify(probe, kernel: dict, batch, div, e: dict, r: dict):
    """The oracle's class of a difference; a kernel finding is counted (the island holds no state,
    so there is nothing to resync) and None returned."""
    div = replace(probe.classify(batch, div, e, r), context={"this_step": step_context(batch, None)})
    if div.kind not in KERNEL_FINDINGS:
        return div
    if div.kind not in kernel:
        div = replace(div, kernel=probe.kernel_case(batch, div.kind))
    note_finding(kernel, div)
    return None
