"""The scheduler: requests in, steps out (decodes first, then the prefills that fit the token
budget and a free slot), slots allocated lowest first and reused when freed."""
from __future__ import annotations

import copy

from ..control.batch import StepBatch
from ..errors import BadInput


def _token(seed: int, rid: int, pos: int, vocab: int) -> int:
    return (seed * 1_000_003 + rid * 7919 + pos * 104_729 + 12_345) * 2_654_435_761 % (1 << 32) % vocab


def schedule(seq, usable_slots=None) -> list[StepBatch]:
    """A FCFS scheduler over `seq` (a `sequence.Sequence`): decodes first, then prefills that fit the
    token budget and a free slot.
    Slots are taken lowest first, so a freed slot is reused by the next admitted request."""
    free = sorted(usable_slots if usable_slots is not None else range(1, seq.num_slots + 1))
    waiting = sorted((copy.copy(r) for r in seq.requests), key=lambda r: (r.arrive, r.rid))
    for r in waiting:
        if r.prompt_len < 1 or r.prompt_len > seq.max_tokens:
            raise BadInput(f"request {r.rid}: prompt_len {r.prompt_len} must be 1..{seq.max_tokens} (the step budget)")
    running: list[dict] = []  # {req, slot, done (decodes), pos}
    steps: list[StepBatch] = []
    t = 0
    while waiting or running:
        ids, slots, qlens, init, toks = [], [], [], [], []
        budget = seq.max_tokens
        for run in running:  # decodes
            ids.append(run["req"].rid)
            slots.append(run["slot"])
            qlens.append(1)
            init.append(True)
            toks.append(_token(seq.seed, run["req"].rid, run["pos"], seq.vocab))
            budget -= 1
        admitted = []
        for r in list(waiting):
            if r.arrive > t or not free:
                continue
            plen = r.prompt_len + r._generated if hasattr(r, "_generated") else r.prompt_len
            plen = min(plen, seq.max_tokens)
            if plen > budget:
                break
            slot = free.pop(0)
            waiting.remove(r)
            ids.append(r.rid)
            slots.append(slot)
            qlens.append(plen)
            init.append(False)
            toks.extend(_token(seq.seed, r.rid, p, seq.vocab) for p in range(plen))
            budget -= plen
            admitted.append({"req": r, "slot": slot, "done": 0, "pos": plen})
        if ids:
            still = []
            for run in running:
                run["pos"] += 1
                run["done"] += 1
                r = run["req"]
                if run["done"] >= r.decode_steps:
                    free.append(run["slot"])
                elif r.preempt_after is not None and run["done"] == r.preempt_after and not getattr(r, "_preempted", False):
                    free.append(run["slot"])  # preempted: slot freed, recomputed later from scratch
                    r._preempted = True
                    r._generated = run["done"]
                    r.arrive = t + 1
                    waiting.append(r)
                else:
                    still.append(run)
            for a in admitted:
                if a["req"].decode_steps > 0:
                    still.append(a)
                else:
                    free.append(a["slot"])
            free.sort()
            running = still
            steps.append(StepBatch(ids, slots, qlens, init, toks, step=len(steps),
                                   live_slots=sorted(r["slot"] for r in running)))
        t += 1
        if t > 10_000:
            raise BadInput("the sequence does not finish (a request can never be scheduled)")
    return steps
