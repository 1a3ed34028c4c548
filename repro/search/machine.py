"""A Hypothesis state machine whose rules are what a scheduler and a runtime can do between
replays, and whose invariant is replay == eager.

Rules: admit a request (prompt lengths on the scheduler's edges: 1, 1+K, and, a rule of its own,
longer than the step budget), run a step (the scheduler's: decodes first, then prompt chunks; the
kept count of each spec decode drawn), finish or preempt a request (its blocks are freed and
reused), run a dummy step on an idle data-parallel rank, churn the allocator with eager tensors of
drawn sizes, drop a captured size so it is recaptured, and, on device providers, move the replay
to a side stream with an event wait. The steps come from `repro.scheduler.scheduler.Scheduler`,
the one `repro run` sequences use. Shrinking turns a long failing run into a short rule list.
"""
from __future__ import annotations

import torch
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from ..control.dispatch import DEFAULT_SIZES
from ..knobs.hazards import options_for
from ..lockstep import Lockstep
from ..scheduler.scheduler import Scheduler, block_pool

MAX_TOKENS = 8


def prompt_lengths(spec_tokens: int = 0):
    """Prompts within the step budget: any length, 1+K (a prompt shaped like a decode) drawn often
    when K > 0; 1 (a one-token first chunk) is where shrinking goes."""
    fits = st.integers(1, MAX_TOKENS)
    return st.one_of(fits, st.just(1 + spec_tokens)) if spec_tokens else fits


def long_prompt_lengths(spec_tokens: int = 0):
    """Prompts longer than the step budget, split across steps: one past it (a one-token last
    chunk) and a last chunk of 1+K drawn often."""
    return st.one_of(st.sampled_from([MAX_TOKENS + 1, 2 * MAX_TOKENS + 1 + spec_tokens]),
                     st.integers(MAX_TOKENS + 1, 3 * MAX_TOKENS))


def lockstep_machine(model, provider, mode="piecewise", hazards=(), repairs=(), num_slots=4, sentinel=0,
                     spec_tokens=0, data_parallel=False):
    """A RuleBasedStateMachine class over `model` (an `islands.Model`) on `provider`; K =
    `spec_tokens` draft tokens a decode, so each request holds 1+K of num_slots * (1+K) state
    blocks; `data_parallel`: the rank runs dummy steps while it has nothing to run."""
    k = spec_tokens

    class LockstepMachine(RuleBasedStateMachine):
        def __init__(self):
            super().__init__()
            opts = options_for(hazards, repairs)
            kernel_sentinel = opts.sentinel(sentinel)
            self.ls = Lockstep(lambda o: model.copy(o, num_slots=num_slots, sentinel=kernel_sentinel, spec_tokens=k),
                               provider, mode=mode, opts=opts, max_tokens=MAX_TOKENS * 2, max_num_seqs=num_slots)
            self.sched = Scheduler(MAX_TOKENS, block_pool(num_slots, k, 1 if kernel_sentinel == 0 else 0), k,
                                   model.cfg.vocab_size, seed=0, data_parallel=data_parallel)
            self.next_rid = 0
            self.divergence = None
            self.churn: list[torch.Tensor] = []

        # Long prompts are a rule of their own, so Hypothesis' swarm testing (whole rules turned
        # off in some runs) also tries runs of short prompts alone, as the machine always did.
        @rule(prompt_len=prompt_lengths(k))
        def admit(self, prompt_len):
            self.sched.add(self.next_rid, prompt_len)
            self.next_rid += 1

        @rule(prompt_len=long_prompt_lengths(k))
        def admit_long(self, prompt_len):
            self.admit(prompt_len)

        def _step(self, kept):
            batch = self.sched.step(kept)
            if batch is not None:
                self.divergence = self.ls.step(batch)

        # With K > 0 the kept counts come as a rule argument, one per request that can hold blocks
        # (a rule drawing from `st.data()` is picked several times less often); K = 0 keeps its one
        # token and the rule takes nothing.
        if k:
            @precondition(lambda self: not self.sched.idle())
            @rule(kept=st.lists(st.integers(1, 1 + k), min_size=num_slots, max_size=num_slots))
            def step(self, kept):
                self._step({rid: kept[i % num_slots] for i, rid in enumerate(self.sched.awaiting())})
        else:
            @precondition(lambda self: not self.sched.idle())
            @rule()
            def step(self):
                self._step(None)

        @precondition(lambda self: self.sched.running())
        @rule(data=st.data(), preempt=st.booleans())
        def finish(self, data, preempt):
            self.sched.finish(data.draw(st.sampled_from(self.sched.running())), preempt)

        @precondition(lambda self: data_parallel and self.sched.idle())
        @rule()
        def dummy_step(self):
            self.divergence = self.ls.step(self.sched.dummy())

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
