"""K = 0, no data parallelism, prompts within the budget: the scheduler makes exactly the steps the
scheduler before speculative decoding, chunked prefill and dummy steps made (kept here as the
oracle), so `repro run`'s default rows are unchanged."""
import copy
import dataclasses

import pytest
from hypothesis import HealthCheck, assume, given, settings

from repro.control.batch import StepBatch
from repro.scheduler.scheduler import _token
from repro.scheduler.steps import schedule
from repro.scheduler.sequence import random_sequence
from repro.search.strategies import sequences

FEW = settings(max_examples=60, deadline=None, derandomize=True, database=None,
               suppress_health_check=list(HealthCheck))


def _old_schedule(seq, usable_slots=None) -> list[StepBatch]:
    """The scheduler before spec decoding, chunked prefill and dummy steps, kept as the oracle of
    the steps `repro run`'s rows were made with."""
    free = sorted(usable_slots if usable_slots is not None else range(1, seq.num_slots + 1))
    waiting = sorted((copy.copy(r) for r in seq.requests), key=lambda r: (r.arrive, r.rid))
    running: list[dict] = []
    steps: list[StepBatch] = []
    t = 0
    while waiting or running:
        ids, slots, qlens, init, toks = [], [], [], [], []
        budget = seq.max_tokens
        for run in running:
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
                    free.append(run["slot"])
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
    return steps


def _core(steps):
    return [(b.request_ids, b.slots, b.query_lens, b.has_initial_state, b.token_ids, b.step, b.live_slots)
            for b in steps]




@pytest.mark.parametrize("kw", [{}, {"num_requests": 3, "num_slots": 4, "max_tokens": 8}, {"num_requests": 40}])
@pytest.mark.parametrize("sentinel", [0, -1])
def test_k0_schedules_are_the_old_schedulers_steps(kw, sentinel):
    """The default `repro run` rows were made with these steps: the same requests in the same
    order, slots, query lengths, token ids and live slots, for both sentinels' slot ranges."""
    for seed in range(40):
        seq = random_sequence(seed, **kw)
        usable = None if sentinel == 0 else range(seq.num_slots)
        assert _core(schedule(seq, usable)) == _core(_old_schedule(seq, usable)), seed


@FEW
@given(sequences(max_requests=8, max_tokens=8, num_slots=4))
def test_k0_drawn_sequences_are_the_old_schedulers_steps(seq):
    # the old scheduler had none of the settings beyond the budget (`scheduler/config.py`)
    seq = dataclasses.replace(seq, max_tokens=8, max_num_scheduled_tokens=None, long_prefill_token_threshold=0,
                              async_scheduling=False)
    # the old scheduler cut a recompute longer than the budget; the new one chunks it
    assume(all(r.prompt_len + (r.preempt_after or 0) <= seq.max_tokens for r in seq.requests))
    assert _core(schedule(seq)) == _core(_old_schedule(seq))


def test_the_oracle_can_tell_a_different_schedule():
    seq = random_sequence(3)
    steps = schedule(seq)
    steps[4].slots = list(reversed(steps[4].slots)) if len(steps[4].slots) > 1 else [99]
    assert _core(steps) != _core(_old_schedule(seq))
