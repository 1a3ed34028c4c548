"""A Hypothesis state machine whose rules are what a scheduler and a runtime can do between
replays, and whose invariant is replay == eager.

Rules: admit a request (prompt lengths on the scheduler's edges: 1, 1+K, and, a rule of its own,
longer than the step budget), run a step or several (the scheduler's: decodes first, then prompt
chunks; the kept count of each spec decode drawn), finish or preempt a request (its blocks are
freed and reused), on a data-parallel rank end every request at once and run a dummy step while
idle, churn the allocator with eager tensors of
drawn sizes, drop a captured size so it is recaptured, and, on device providers, move the replay
to a side stream with an event wait. The steps come from `repro.scheduler.scheduler.Scheduler`,
the one `repro run` sequences use. Shrinking turns a long failing run into a short rule list.

`lockstep_machine` builds the machine for a `MachineConfig`: `LockstepRules` (the state, the
invariant and the rules that draw the same for every config) joined with the admission and step
rules, which draw the config's shapes (prompt lengths on K's edges, a kept count per slot).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from ..control.dispatch import DEFAULT_SIZES
from ..islands import Model
from ..knobs.hazards import options_for
from ..lockstep import Lockstep
from ..scheduler.prefix import ALIGN_BLOCKS, check_block_size
from ..scheduler.scheduler import Scheduler
from ..scheduler.steps import block_pool
from ..scheduler.sequence import copy_slots
from ..control.shape import StepShape, decode_len
from .edges import Edges

MAX_TOKENS = 8


def prompt_lengths(spec_tokens: int = 0):
    """Prompts within the step budget: any length, and drawn often the rules' edges: 1 (a one-token
    first chunk, vLLM #51565) and 1+K (a prompt shaped like a decode, vLLM #53051) when K > 0."""
    fits = st.integers(1, MAX_TOKENS)
    return st.one_of(fits, st.just(1), st.just(decode_len(spec_tokens))) if spec_tokens else fits


def long_prompt_lengths(spec_tokens: int = 0):
    """Prompts longer than the step budget, split across steps: one past it (a one-token last
    chunk) and a last chunk of 1+K drawn often."""
    return st.one_of(st.sampled_from([MAX_TOKENS + 1, 2 * MAX_TOKENS + decode_len(spec_tokens)]),
                     st.integers(MAX_TOKENS + 1, 3 * MAX_TOKENS))


@dataclass(frozen=True)
class MachineConfig:
    """What a machine runs (`lockstep_machine`'s arguments): `model` on `provider` (a graph provider,
    `repro.graphs`) in graph `mode`, with `hazards` and `repairs`, `num_slots` requests, the pad
    `sentinel` (where no hazard's options set the kernels' own), K = `spec_tokens` draft tokens a
    decode, an idle rank's dummy steps where `data_parallel`, `edges` counting what the search
    reaches, and prefix caching where `block_size` is set."""
    model: Model
    provider: object
    mode: str
    hazards: tuple
    repairs: tuple
    num_slots: int
    sentinel: int
    spec_tokens: int
    data_parallel: bool
    edges: Edges | None
    block_size: int | None

    @property
    def per_slot(self) -> int:
        """State blocks a request slot holds beyond the first: K, and with a block size the other
        `ALIGN_BLOCKS` - 1 (of running, copy source and cached)."""
        return ALIGN_BLOCKS - 1 + self.spec_tokens if self.block_size else self.spec_tokens


def counted(fn):
    """A rule that counts each of its runs in the machine's `edges` (`rule:NAME`), where it has them."""
    def wrapper(self, *a, **kw):
        if self.config.edges is not None:
            self.config.edges.counts[f"rule:{fn.__name__}"] += 1
        return fn(self, *a, **kw)
    wrapper.__name__ = fn.__name__
    return wrapper


class LockstepRules(RuleBasedStateMachine):
    """The machine's state (a `Lockstep` pair and the scheduler feeding it), its invariant, and the
    rules whose draws do not depend on its config: finish or preempt, drain, the idle rank's dummy
    step, allocator churn, recapture and the side stream. `lockstep_machine` adds its `config` and
    the rules that draw the config's shapes (`admission_rules`, `step_rules`)."""

    config: MachineConfig

    def __init__(self):
        super().__init__()
        c = self.config
        opts = options_for(c.hazards, c.repairs)
        kernel_sentinel = opts.sentinel(c.sentinel)
        k, num_slots = c.spec_tokens, c.num_slots
        # with drafts, a budget that fits every request's decode (vLLM's max_num_batched_tokens is
        # at least max_num_seqs * (1+K)), so running requests stay in the batch together
        budget = max(MAX_TOKENS, num_slots * decode_len(k))
        slots = copy_slots(num_slots, 1 + c.per_slot, k)
        self.ls = Lockstep(lambda o: c.model.copy(o, num_slots=slots, sentinel=kernel_sentinel, spec_tokens=k),
                           c.provider, mode=c.mode, opts=opts,
                           # the capture sizes configured, as `Edges` and `drop_capture` take them
                           shape=StepShape(k, num_slots, max(MAX_TOKENS * 2, budget), DEFAULT_SIZES, c.block_size,
                                           c.data_parallel, slots))
        self.sched = Scheduler(budget, block_pool(num_slots, c.per_slot, 1 if kernel_sentinel == 0 else 0), k,
                               c.model.cfg.vocab_size, seed=0, data_parallel=c.data_parallel,
                               block_size=c.block_size, max_seqs=num_slots)
        self.prompts: dict[int, int] = {}
        self.next_rid = 0
        self.divergence = None
        if c.edges is not None:  # each example starts a fresh runner: rows and blocks from empty
            c.edges.reset()
        self.churn: list[torch.Tensor] = []

    def _admit(self, prompt_len, **prefix):
        self.sched.add(self.next_rid, prompt_len, **prefix)
        self.prompts[self.next_rid] = prompt_len
        self.next_rid += 1

    def _kept(self, kept):
        """The drawn kept counts given to the requests whose count is open (None with K = 0)."""
        k, num_slots = self.config.spec_tokens, self.config.num_slots
        return {rid: kept[i % num_slots] for i, rid in enumerate(self.sched.awaiting())} if k else None

    def _see(self, batch):
        if self.config.edges is not None and batch is not None:
            self.config.edges.see(batch)

    def _step(self, kept):
        batch = self.sched.step(kept)
        self._see(batch)
        if batch is not None:
            self.divergence = self.ls.step(batch)

    @precondition(lambda self: self.sched.running())
    @rule(data=st.data(), preempt=st.booleans())
    @counted
    def finish(self, data, preempt):
        self.sched.finish(data.draw(st.sampled_from(self.sched.running())), preempt)

    # Every request ends at once: the rank goes idle right after real steps, where a dummy
    # step reads what they left (one finish at a time, against several admissions, almost
    # never empties the rank).
    @precondition(lambda self: self.config.data_parallel and not self.sched.done())
    @rule()
    @counted
    def drain(self):
        for rid in self.sched.running():
            self.sched.finish(rid)
        self.sched.abort_waiting()

    @precondition(lambda self: self.config.data_parallel and self.sched.idle())
    @rule()
    @counted
    def dummy_step(self):
        batch = self.sched.dummy()
        self._see(batch)
        self.divergence = self.ls.step(batch)

    @rule(sizes=st.lists(st.integers(1, 1 << 16), max_size=4))
    @counted
    def churn_allocator(self, sizes):
        self.churn = [torch.empty(n, dtype=torch.uint8, device=self.config.provider.device) for n in sizes]
        del self.churn[: len(sizes) // 2]

    @rule(size=st.sampled_from(DEFAULT_SIZES))
    @counted
    def recapture(self, size):
        self.ls.graph.forget(size)

    @precondition(lambda self: self.config.provider.supports_streams)
    @rule()
    @counted
    def consumer_on_side_stream(self):
        self.ls.graph.set_options(side_stream=True, event_wait=True)

    @invariant()
    def replay_equals_eager(self):
        assert self.divergence is None, self.divergence.line()

    def teardown(self):  # the last step's weight digest (`Lockstep.finish`)
        div = self.ls.finish() if self.divergence is None else None
        assert div is None, div.line()


def admission_rules(config: MachineConfig) -> type:
    """The rules that admit a request, their prompt lengths drawn on K's edges; with a block size, one
    that admits a prompt sharing an earlier one's first blocks."""
    k, block_size = config.spec_tokens, config.block_size

    class Admissions:
        # Long prompts are a rule of their own, so Hypothesis' swarm testing (whole rules turned
        # off in some runs) also tries runs of short prompts alone, as the machine always did.
        @rule(prompt_len=prompt_lengths(k))
        @counted
        def admit(self, prompt_len):
            self._admit(prompt_len)

        @rule(prompt_len=long_prompt_lengths(k))
        @counted
        def admit_long(self, prompt_len):
            self._admit(prompt_len)

        if block_size:
            # a prompt that repeats the first blocks of an earlier one (and one token on either side
            # of a block boundary): a prefix hit when a block it fills is still cached
            @precondition(lambda self: self.prompts)
            @rule(data=st.data(), blocks=st.integers(1, 3), over=st.integers(-1, 1 + MAX_TOKENS))
            @counted
            def admit_shared(self, data, blocks, over):
                src = data.draw(st.sampled_from(sorted(self.prompts)))
                prompt = max(1, blocks * block_size + over)
                share = min(prompt, self.prompts[src], blocks * block_size)
                self._admit(prompt, prefix_of=src, prefix_len=share)
    return Admissions


def step_rules(config: MachineConfig) -> type:
    """The rules that run steps: one, several back to back, and one right after the oldest request
    finishes; with K > 0 each draws a kept count per request slot."""
    k = config.spec_tokens
    kept_counts = st.lists(st.integers(1, decode_len(k)), min_size=config.num_slots, max_size=config.num_slots)

    class Steps:
        # With K > 0 the kept counts come as a rule argument, one per request that can hold blocks
        # (a rule drawing from `st.data()` is picked several times less often); K = 0 keeps its one
        # token and the rule takes nothing.
        if k:
            @precondition(lambda self: not self.sched.idle())
            @rule(kept=kept_counts)
            @counted
            def step(self, kept):
                self._step(self._kept(kept))
        else:
            @precondition(lambda self: not self.sched.idle())
            @rule()
            @counted
            def step(self):
                self._step(None)

        # Several steps with nothing between them: a prompt longer than the budget reaches its
        # later chunks before another rule ends it (one step among seven rules rarely does).
        @precondition(lambda self: not self.sched.idle())
        @rule(n=st.integers(2, 5), kept=kept_counts)
        @counted
        def steps(self, n, kept):
            for _ in range(n):
                if self.divergence is not None or self.sched.idle():
                    return
                self._step(self._kept(kept))

        # The oldest request finishes and the next step runs at once, as a serving loop does: the
        # others move down into its row (`InputBatch.condense`), which a finish among other rules
        # rarely leads to.
        @precondition(lambda self: len(self.sched.running()) >= 2)
        @rule(kept=kept_counts)
        @counted
        def retire_oldest(self, kept):
            self.sched.finish(self.sched.running()[0])
            self._step(self._kept(kept))
    return Steps


def lockstep_machine(model, provider, mode="piecewise", hazards=(), repairs=(), num_slots=4, sentinel=0,
                     spec_tokens=0, data_parallel=False, edges: Edges | None = None, block_size: int | None = None):
    """A RuleBasedStateMachine class over `model` (an `islands.Model`) on `provider`; K =
    `spec_tokens` draft tokens a decode, so each request holds 1+K of num_slots * (1+K) state
    blocks; `data_parallel`: the rank runs dummy steps while it has nothing to run. `edges`: counts
    each rule run (`rule:NAME`) and the control-rule edges of each step (`edges.Edges`), over every
    example the search runs. `block_size`: prefix caching (wider than K), with a rule that admits a
    request sharing a prefix of an earlier one's prompt (a prefix hit where a whole block matches)."""
    check_block_size(block_size, spec_tokens)
    config = MachineConfig(model, provider, mode, hazards, repairs, num_slots, sentinel, spec_tokens, data_parallel,
                           edges, block_size)

    # A derandomised search is seeded from the source of the class returned here (Hypothesis'
    # `function_digest`), so it is kept to these lines: the rules, in the classes it joins, can be
    # edited without moving the seed; editing it moves the examples that every bounded search of
    # tests/test_machine.py draws.
    class LockstepMachine(admission_rules(config), step_rules(config), LockstepRules):
        pass
    LockstepMachine.config = config
    return LockstepMachine
