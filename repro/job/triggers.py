"""Whether a run's steps reached what a planted hazard needs to show, so a short run that never
got there says "not triggered" instead of MISSED.

Each hazard row names its trigger (`Hazard.trigger`): a condition on the steps the replay copy
ran, or the kind of a runner finding that reports the mechanism itself ("python-state": a value
frozen at capture differed at a later replay), which then counts as the detection. A condition
is judged over the steps whose graph is one the hazard needs (its `modes`: PIECEWISE pieces or a
FULL decode graph), each step dispatched as the runner dispatches it (`control.dispatch`: the
uniform-decode rule of the case's options, the capture sizes, the dispatcher's keys). A trigger
that was reached and showed nothing is a MISSED hazard.
"""
from __future__ import annotations

import numpy as np

from ..control.builder import common_for, decode_rows
from ..control.dispatch import Dispatcher, dispatch_step
from ..control.shape import StepShape
from ..knobs.modes import Runtime, parse_mode
from ..knobs import hazards as hz

# step conditions: name -> what the steps must contain (said in the table's note when not reached)
CONDITIONS = {
    "replay": "a step that replays its graph",
    "piecewise-decode": "a step replayed as pieces with a decode in it (where the eager splitting op is linted)",
    "replay-again": "a second replay of a captured size",
    "padded-replay": "a replayed step padded to its capture size",
    "stale-pad": "a padded replay over rows an earlier decode step staged",
    "prompt-as-decode": "a step with a request in its prompt replayed as a uniform decode",
    "first-chunk": "a one-token first chunk into a state slot an earlier request used, in a step whose rows the "
                   "builder splits so that it reaches the decode kernels (no spec row beside it, no longer row before "
                   "it)",
    "dummy-after-decode": "an idle data-parallel rank's FULL dummy step after a decode step staged the builder",
    "dummy-after-finish": "an idle data-parallel rank's FULL dummy step after a request finished",
}
_GRAPH = {"piecewise": Runtime.PIECEWISE, "full": Runtime.FULL}


def live(hazards, repairs) -> list[str]:
    """The planted hazards a case expects to show: not probes, not cleared by one of its repairs."""
    return [h for h in hazards if not hz.HAZARDS[h].probe and not set(hz.HAZARDS[h].repairs) & set(repairs)]


def _dispatched(batches, mode: str, sizes, hazards, repairs, shape: StepShape):
    """(index, batch, runtime, padded token count) of every step, as the replay copy's runner
    dispatches it."""
    rule = hz.options_for(hazards, repairs).control.uniform_decode
    d = Dispatcher(parse_mode(mode), sizes, shape)
    for i, b in enumerate(batches):
        runtime, desc = dispatch_step(d, b, rule)
        yield i, b, runtime, desc.num_tokens


def _reached(condition: str, steps, batches, opts=None, spec_tokens: int = 0) -> bool:
    """`steps`: the dispatched steps replaying a graph the hazard needs; `batches`: every step;
    `opts`: the case's options (the control rules a condition on the builder reads)."""
    if condition == "replay":
        return bool(steps)
    if condition == "piecewise-decode":
        return any(b.num_decodes and rt is Runtime.PIECEWISE for _, b, rt, _ in steps)
    if condition == "replay-again":
        keys = [(rt, n) for _, _, rt, n in steps]
        return len(keys) != len(set(keys))
    if condition == "padded-replay":
        return any(b.num_tokens < n for _, b, _, n in steps)
    if condition == "stale-pad":  # rows a larger decode-only step staged before, left in the padded rows
        staged = [max((x.num_reqs for x in batches[:i] if x.uniform_decode), default=0) for i in range(len(batches))]
        return any(b.num_tokens < n and staged[i] > b.num_reqs for i, b, _, n in steps)
    if condition == "prompt-as-decode":
        return any(rt is Runtime.FULL and any(b.is_prefilling()) for _, b, rt, _ in steps)
    if condition == "first-chunk":  # only where the builder's split sends that chunk to the decode kernels
        rule = (opts or hz.options_for()).control.first_chunk
        used: set = set()
        for b in batches:
            decoded = decode_rows(common_for(b, np.zeros((b.num_reqs, 1), dtype=np.int32)), spec_tokens, rule)
            first = {s for s, q, c, d in zip(b.slots, b.query_lens, b.computed(), decoded) if q == 1 and c == 0 and d}
            if first & used:
                return True
            used |= set(b.slots)
        return False
    if condition == "dummy-after-decode":  # the staging a dummy replays without re-staging is a decode's
        return any(b.dummy and any(x.uniform_decode for x in batches[:i]) for i, b, _, _ in steps)
    if condition == "dummy-after-finish":  # the rows a dummy reads are a finished request's
        return any(b.dummy and _finished_row(batches[:i + 1]) for i, b, _, _ in steps)
    raise ValueError(f"unknown trigger condition {condition!r}")


def _finished_row(batches) -> bool:
    """A request finished in these steps, leaving a row a dummy run reads a block from: any row
    without a block size; with one, a row whose column 0 (what the dummy run's metadata takes) still
    holds a block, not the null block its retired columns hold (`control.prefix`)."""
    if not any(x.block_size for x in batches):
        return any(x.finished for x in batches)
    low = min(s for x in batches for s in x.slots)  # the lowest real block seen; the null block is below
    last: dict = {}
    for x in batches:
        if any(rid in last and last[rid][0] >= low for rid in x.finished):
            return True
        last.update(zip(x.request_ids, x.block_rows()))
    return False


def shown_by_finding(hazards, repairs, findings) -> bool:
    """A live hazard whose trigger is a runner finding kind, and that finding is among `findings`."""
    kinds = {f["kind"] for f in findings}
    return any(hz.HAZARDS[h].trigger in kinds for h in live(hazards, repairs))


def reached(hazards, repairs, mode: str, batches, sizes, findings, shape: StepShape = StepShape()) -> bool | None:
    """Whether any live hazard's trigger was reached in `batches` (the steps that ran) by a runner of
    `shape` capturing `sizes`; None when no hazard is live (nothing to trigger)."""
    hs = live(hazards, repairs)
    if not hs:
        return None
    steps = list(_dispatched(batches, mode, sizes, hazards, repairs, shape))
    opts = hz.options_for(hazards, repairs)
    for h in hs:
        t = hz.HAZARDS[h].trigger
        if t not in CONDITIONS:
            if any(f["kind"] == t for f in findings):
                return True
            continue
        graphs = {_GRAPH[m] for m in hz.HAZARDS[h].modes}
        if _reached(t, [s for s in steps if s[2] in graphs], batches, opts, shape.spec_tokens):
            return True
    return False


def needs(hazards, repairs) -> str:
    """What the live hazards need, for the note of a row that never got there."""
    parts = []
    for h in live(hazards, repairs):
        t = hz.HAZARDS[h].trigger
        parts.append(f"{h} needs {CONDITIONS[t]}" if t in CONDITIONS else
                     f"{h} shows when the runner reports a {t} finding (a value frozen at capture that differs "
                     "at a later replay)")
    return "; ".join(parts)
