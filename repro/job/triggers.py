"""Whether a run's steps reached what a planted hazard needs to show, so a short run that never
got there says "not triggered" instead of MISSED.

Each hazard row names its trigger (`Hazard.trigger`): a condition on the steps the replay copy
ran, judged here from the steps alone as the graph runner treats them (`capture/runner.py`: a
step replays when its token count pads to a capture size and, in `full` mode, it is decode-only;
graphs are captured lazily, at the first step of a size; the static buffers keep what the last
step wrote beyond its own rows), or the kind of a runner finding that reports the mechanism
itself ("python-state": a value frozen at capture differed at a later replay), which then counts
as the detection. A trigger that was reached and shows nothing is a MISSED hazard.
"""
from __future__ import annotations

from ..capture.piece import pad_size
from ..knobs import hazards as hz

# step conditions: name -> what the steps must contain (said in the table's note when not reached)
CONDITIONS = {
    "replay": "a step that replays a graph",
    "decode-replay": "a replayed step with a decode in it",
    "replay-again": "a second replay of a captured size",
    "padded-replay": "a replayed step padded to its capture size",
    "stale-pad": "a padded replay whose pad rows an earlier step wrote",
}


def live(hazards, repairs) -> list[str]:
    """The planted hazards a case expects to show: not probes, not cleared by one of its repairs."""
    return [h for h in hazards if not hz.HAZARDS[h].probe and not set(hz.HAZARDS[h].repairs) & set(repairs)]


def _replayed(batches, mode: str, sizes):
    """(index, token count, padded size) of each step the replay copy runs as a graph."""
    for i, b in enumerate(batches):
        size = pad_size(b.num_tokens, sizes)
        if size is not None and (mode == "piecewise" or b.uniform_decode):
            yield i, b, size


def _reached(condition: str, batches, mode: str, sizes) -> bool:
    steps = list(_replayed(batches, mode, sizes))
    if condition == "replay":
        return bool(steps)
    if condition == "decode-replay":
        return any(b.num_decodes for _, b, _ in steps)
    if condition == "replay-again":
        sizes_seen = [s for _, _, s in steps]
        return len(sizes_seen) != len(set(sizes_seen))
    if condition == "padded-replay":
        return any(b.num_tokens < s for _, b, s in steps)
    if condition == "stale-pad":
        written = [max((b.num_tokens for b in batches[:i]), default=0) for i in range(len(batches))]
        return any(b.num_tokens < s and written[i] > b.num_tokens for i, b, s in steps)
    raise ValueError(f"unknown trigger condition {condition!r}")


def shown_by_finding(hazards, repairs, findings) -> bool:
    """A live hazard whose trigger is a runner finding kind, and that finding is among `findings`."""
    kinds = {f["kind"] for f in findings}
    return any(hz.HAZARDS[h].trigger in kinds for h in live(hazards, repairs))


def reached(hazards, repairs, mode: str, batches, sizes, findings) -> bool | None:
    """Whether any live hazard's trigger was reached in `batches` (the steps that ran); None
    when no hazard is live (nothing to trigger)."""
    hs = live(hazards, repairs)
    if not hs:
        return None
    for h in hs:
        t = hz.HAZARDS[h].trigger
        if t in CONDITIONS:
            if _reached(t, batches, mode, sizes):
                return True
        elif any(f["kind"] == t for f in findings):
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
