"""A Hypothesis state machine whose rules are what a scheduler and a runtime can do between
replays, and whose invariant is replay == eager.

Rules: admit a request, run a step (decodes first, then prefills that fit), finish or preempt
a request (its slot is freed and reused), churn the allocator with eager tensors of drawn
sizes, drop a captured size so it is recaptured, and, on device providers, move the replay to
a side stream with an event wait. Shrinking turns a long failing run into a short rule list.
"""
from __future__ import annotations

import torch
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from ..control.batch import StepBatch
from ..knobs.hazards import options_for
from ..control.dispatch import DEFAULT_SIZES
from ..lockstep import Lockstep
from ..scheduler.scheduler import _token

MAX_TOKENS = 8


def lockstep_machine(model, provider, mode="piecewise", hazards=(), repairs=(), num_slots=4, sentinel=0):
    """A RuleBasedStateMachine class over `model` (an `islands.Model`) on `provider`."""

    class LockstepMachine(RuleBasedStateMachine):
        def __init__(self):
            super().__init__()
            opts = options_for(hazards, repairs)
            kernel_sentinel = opts.sentinel(sentinel)
            self.ls = Lockstep(lambda o: model.copy(o, num_slots=num_slots, sentinel=kernel_sentinel),
                               provider, mode=mode, opts=opts, max_tokens=MAX_TOKENS * 2)
            first = 1 if kernel_sentinel == 0 else 0
            self.free = list(range(first, first + num_slots))
            self.running: dict[int, list[int]] = {}  # rid -> [slot, position]
            self.pending: list[tuple[int, int]] = []  # (rid, prompt_len)
            self.next_rid = 0
            self.nstep = 0
            self.divergence = None
            self.churn: list[torch.Tensor] = []

        @rule(prompt_len=st.integers(1, MAX_TOKENS))
        def admit(self, prompt_len):
            self.pending.append((self.next_rid, prompt_len))
            self.next_rid += 1

        @precondition(lambda self: self.running or self.pending)
        @rule()
        def step(self):
            ids, slots, qlens, init, toks = [], [], [], [], []
            budget = MAX_TOKENS
            for rid, (slot, pos) in self.running.items():
                ids.append(rid)
                slots.append(slot)
                qlens.append(1)
                init.append(True)
                toks.append(_token(0, rid, pos, model.cfg.vocab_size))
                budget -= 1
            admitted = []
            for rid, plen in list(self.pending):
                if not self.free or plen > budget:
                    break
                slot = self.free.pop(0)
                self.pending.remove((rid, plen))
                ids.append(rid)
                slots.append(slot)
                qlens.append(plen)
                init.append(False)
                toks.extend(_token(0, rid, p, model.cfg.vocab_size) for p in range(plen))
                budget -= plen
                admitted.append((rid, slot, plen))
            if not ids:
                return
            for rid in self.running:
                self.running[rid][1] += 1
            for rid, slot, plen in admitted:
                self.running[rid] = [slot, plen]
            batch = StepBatch(ids, slots, qlens, init, toks, step=self.nstep,
                              live_slots=sorted(s for s, _ in self.running.values()))
            self.nstep += 1
            self.divergence = self.ls.step(batch)

        @precondition(lambda self: self.running)
        @rule(data=st.data(), preempt=st.booleans())
        def finish(self, data, preempt):
            rid = data.draw(st.sampled_from(sorted(self.running)))
            slot, pos = self.running.pop(rid)
            self.free.append(slot)
            self.free.sort()
            if preempt:  # recomputed from scratch later, in a fresh slot
                self.pending.append((rid, min(MAX_TOKENS, pos)))

        @rule(sizes=st.lists(st.integers(1, 1 << 16), max_size=4))
        def churn_allocator(self, sizes):
            self.churn = [torch.empty(n, dtype=torch.uint8, device=provider.device) for n in sizes]
            del self.churn[: len(sizes) // 2]

        @rule(size=st.sampled_from(DEFAULT_SIZES))
        def recapture(self, size):
            self.ls.graph.forget(size)

        @precondition(lambda self: provider.supports_streams)
        @rule()
        def consumer_on_side_stream(self):
            self.ls.graph.set_options(side_stream=True, event_wait=True)

        @invariant()
        def replay_equals_eager(self):
            assert self.divergence is None, self.divergence.line()

        def teardown(self):  # the last step's weight digest (`Lockstep.finish`)
            div = self.ls.finish() if self.divergence is None else None
            assert div is None, div.line()

    return LockstepMachine
