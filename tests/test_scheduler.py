"""The scheduler: the steps vLLM's runner would see with speculative decoding, chunked prefill,
finishes, preemption and an idle data-parallel rank's dummy runs. Each test states one rule;
`check_steps` holds them all and runs over seeded, Hypothesis-drawn and rule-driven schedules."""
import copy

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (RuleBasedStateMachine, initialize, invariant, precondition, rule,
                                 run_state_machine_as_test)

from repro.errors import BadInput
from repro.scheduler.order import region
from repro.scheduler.scheduler import Scheduler
from repro.scheduler.steps import block_pool, schedule
from repro.scheduler.sequence import Request, Sequence, random_sequence
from repro.scheduler.tokens import draft as _draft
from repro.scheduler.tokens import token as _token
from repro.search.strategies import sequences

FEW = settings(max_examples=60, deadline=None, derandomize=True, database=None,
               suppress_health_check=list(HealthCheck))


def _core(steps):
    return [(b.request_ids, b.slots, b.query_lens, b.has_initial_state, b.token_ids, b.step, b.live_slots)
            for b in steps]


def check_steps(steps, max_tokens, k, pool, seed=0, vocab=512, data_parallel=False, kept=None):
    """Every rule of a schedule, step by step. `kept`: {(step, rid): count} given to that step's
    spec decode of rid (checked against what the next step reports)."""
    pool = set(pool)
    live = {}  # rid -> (step, blocks, num_computed, query length, draft tokens) of its last row
    drafted = {}  # rid -> positions whose kept token is an accepted draft
    ended_spec = {}  # rid -> num_computed of the spec decode it ended after (its kept count unknown here)
    prev_live: list[int] = []
    for n, b in enumerate(steps):
        assert b.step == n
        ended = {r for r, v in live.items() if not set(v[1]) <= set(prev_live)}
        assert ended <= set(b.finished) <= set(live), (n, "what gave its blocks back, and only that, is finished")
        freed = set()  # what `finish` between the steps gave back is free again
        for rid in b.finished:
            if live[rid][4]:
                ended_spec[rid] = live[rid][2]
            freed |= set(live.pop(rid)[1])
        if b.dummy:
            assert data_parallel, "dummy steps only on a data-parallel rank"
            assert b.num_reqs == 0 and not b.token_ids and not set(prev_live) - freed, "a dummy only when nothing runs"
            prev_live = b.live_slots
            continue
        assert b.num_reqs > 0
        assert b.num_tokens == sum(b.query_lens) <= max_tokens, "the step's token budget"
        assert b.live_slots == sorted(set(b.live_slots)) and set(b.live_slots) <= pool
        held = [x for row in b.blocks for x in row]
        assert len(held) == len(set(held)), "blocks unique among the step's requests"
        regions = [region(c, q, p, 1 + k) for c, q, p in zip(b.num_computed, b.query_lens, b.prompt_lens)]
        assert regions == sorted(regions), "decodes, then chunks in the prompt, longer ones, then first chunks"
        taken, at = set(prev_live) - freed, 0
        free = sorted(pool - taken)
        firsts = [blocks for c, blocks in zip(b.num_computed, b.blocks) if c == 0]
        assert sorted(x for row in firsts for x in row) == free[: len(firsts) * (1 + k)], "free blocks taken lowest first"
        for i, rid in enumerate(b.request_ids):
            c, p, q, d, a, blocks = (b.num_computed[i], b.prompt_lens[i], b.query_lens[i], b.draft_lens[i],
                                     b.num_accepted[i], b.blocks[i])
            toks, at = b.token_ids[at: at + q], at + q
            assert len(blocks) == 1 + k and b.slots[i] == blocks[0], "1+K blocks a request, its slot first"
            assert b.has_initial_state[i] == (c > 0)
            assert 0 <= d <= k and 1 <= a <= 1 + k
            if c == 0:
                assert rid not in live, "a request starts from scratch only when new or preempted"
                if rid in ended_spec:  # preempted after a spec decode: its recompute covers the drafts it kept,
                    base = ended_spec.pop(rid)  # then the bonus token sampled after them
                    drafted[rid].update(range(base + 1, b.prefills()[i] - 1))
                taken |= set(blocks)
                assert a == 1 and (d == 0 or (q == 1 + k and d == k)), "a first chunk is a prefill (or padded to 1+K)"
                drafted.setdefault(rid, set())
            else:
                last, was, base, q_last, d_last = live[rid]
                assert blocks == was, "a request keeps its blocks while it lives"
                if d_last and last == n - 1:  # its last row, the step before, was a spec decode: it kept a of them
                    assert c == base + a, "num_computed advanced by the kept count, the rejected drafts rolled back"
                    assert kept is None or (last, rid) not in kept or kept[(last, rid)] == a
                    drafted[rid].update(range(base + 1, base + a))
                elif d_last:  # back in the runner's batch after a step without it: accepted starts at 1 again
                    assert a == 1 and 1 <= c - base <= 1 + d_last
                    drafted[rid].update(range(base + 1, c))
                else:
                    assert c == base + q_last and a == 1, "a chunk (or a K=0 decode) advances by its length"
            if d and c >= p:
                drafted[rid] -= set(range(c, c + 1 + k))  # not computed yet: what it kept past here is open again
                assert q == 1 + d, "a spec decode past its prompt: its bonus token and its drafts (the budget's)"
                assert toks[0] == _token(seed, rid, c, vocab), "the bonus token sits at position num_computed"
                assert toks[1:] == [_draft(seed, rid, c + j, vocab) for j in range(1, d + 1)]
            elif d:  # a first chunk of one token padded to 1+K: placeholder drafts, clamped to 0
                assert toks == [_token(seed, rid, c, vocab)] + [0] * d
            else:
                assert toks == [(_draft if x in drafted[rid] else _token)(seed, rid, x, vocab) for x in range(c, c + q)]
            live[rid] = (n, blocks, c, q, d)
        assert set(b.live_slots) <= taken, "after the step, blocks are held by what held them or took them"
        prev_live = b.live_slots
    return steps


def _check(seq, usable=None, kept=None):
    k = seq.spec_tokens
    pool = block_pool(seq.num_slots, k, 1 if usable is None else min(usable))
    return check_steps(schedule(seq, usable), seq.max_tokens, k, pool, seq.seed, seq.vocab, seq.data_parallel, kept)


# ---- one rule a test ----------------------------------------------------------------------------


def _sched(max_tokens=8, num_slots=4, k=0, dp=False):
    return Scheduler(max_tokens, block_pool(num_slots, k), k, data_parallel=dp)


def test_decodes_come_before_prefills_and_the_budget_holds():
    s = _sched(max_tokens=8, k=2)
    s.add(0, 3, decode_steps=5)
    s.step()
    s.add(1, 5, decode_steps=5)
    s.add(2, 2, decode_steps=5)
    b = s.step()
    assert b.request_ids == [0, 1] and b.query_lens == [3, 5] and b.draft_lens == [2, 0]  # 2 waits: no budget
    b = s.step()
    assert b.request_ids == [0, 1, 2] and b.query_lens == [3, 3, 2] and b.num_tokens <= 8


def test_a_prompt_longer_than_the_budget_is_split_and_its_later_chunks_have_initial_state():
    s = _sched(max_tokens=8)
    s.add(0, 19, decode_steps=1)
    steps = [s.step() for _ in range(4)]
    assert [b.query_lens for b in steps] == [[8], [8], [3], [1]]
    assert [b.num_computed for b in steps] == [[0], [8], [16], [19]]
    assert [b.has_initial_state for b in steps] == [[False], [True], [True], [True]]
    assert [b.is_prefilling() for b in steps] == [[True], [True], [True], [False]]


def test_a_chunk_takes_what_is_left_of_the_budget():
    s = _sched(max_tokens=8)
    s.add(0, 2, decode_steps=3)
    s.step()
    s.add(1, 8, decode_steps=1)  # a first chunk of the 7 left, though it would fit a later step whole
    s.add(2, 20, decode_steps=1)
    b = s.step()
    assert b.request_ids == [0, 1] and b.query_lens == [1, 7]


@pytest.mark.parametrize("k", [0, 2])
def test_a_one_token_first_chunk_is_a_prefill(k):
    s = _sched(max_tokens=8, k=k)
    s.add(0, 1, decode_steps=2)  # a one-token prompt
    b = s.step()
    assert b.query_lens == [1] and b.num_computed == [0] and b.prompt_lens == [1] and b.draft_lens == [0]
    assert b.has_initial_state == [False] and b.is_prefilling() == [True]
    s = _sched(max_tokens=8, k=k)
    s.add(0, 7 - k, decode_steps=5)
    s.step()
    s.add(1, 6 - k, decode_steps=5)
    s.add(2, 20, decode_steps=1)  # longer than the budget: its first chunk gets the 1 token left
    b = s.step()
    assert b.request_ids == [0, 1, 2] and b.query_lens == [1 + k, 6 - k, 1]
    assert b.num_computed[2] == 0 and b.prompt_lens[2] == 20 and b.is_prefilling()[2] and not b.has_initial_state[2]


def test_kept_counts_roll_num_computed_back_and_the_next_bonus_token_is_at_num_computed():
    s = _sched(max_tokens=8, k=3)
    s.add(0, 4, decode_steps=10)
    s.step()
    b = s.step()
    assert b.num_computed == [4] and b.query_lens == [4] and b.num_accepted == [1]
    assert b.token_ids == [_token(0, 0, 4, 512)] + [_draft(0, 0, p, 512) for p in (5, 6, 7)]
    assert s.awaiting() == [0]
    b = s.step({0: 2})  # the bonus token and the draft at 5 kept; the drafts at 6 and 7 rejected
    assert b.num_computed == [6] and b.num_accepted == [2]
    assert b.token_ids[0] == _token(0, 0, 6, 512) != _draft(0, 0, 6, 512)
    b = s.step({0: 4})
    assert b.num_computed == [10] and b.num_accepted == [4]
    b = s.step({0: 1})
    assert b.num_computed == [11] and b.num_accepted == [1]
    with pytest.raises(BadInput, match="keeps 1..4"):
        s.step({0: 5})
    s = _sched(max_tokens=8, k=3)
    s.add(0, 4, decode_steps=10)
    s.step()
    with pytest.raises(BadInput, match="no decode"):
        s.step({0: 2})  # its last step was a prefill: nothing to keep


def test_a_requests_accept_list_is_used_in_order_and_cycled():
    seq = Sequence([Request(0, 4, 6, accept=[2, 4, 1])], max_tokens=8, spec_tokens=3)
    steps = _check(seq)
    assert [b.num_accepted[0] for b in steps] == [1, 1, 2, 4, 1, 2, 4]
    assert [b.num_computed[0] for b in steps] == [0, 4, 6, 10, 11, 13, 17]
    plain = Sequence([Request(0, 4, 3)], max_tokens=8, spec_tokens=3)
    assert [b.num_computed[0] for b in _check(plain)] == [0, 4, 8, 12]  # absent: all 1+K kept


@pytest.mark.parametrize("k", [0, 1, 4])
def test_draft_lens_are_k_for_decodes_and_0_for_prefills(k):
    seq = Sequence([Request(0, 3, 2), Request(1, 20, 2, arrive=1)], max_tokens=8, spec_tokens=k)
    for b in _check(seq):
        for c, p, q, d in zip(b.num_computed, b.prompt_lens, b.query_lens, b.draft_lens):
            assert d == (k if c >= p else 0) and q == (1 + k if c >= p else q)


def test_blocks_are_1_plus_k_a_request_and_unique_among_live_requests():
    s = Scheduler(16, block_pool(3, 4), 4)
    for rid in range(5):
        s.add(rid, 2, decode_steps=3)
    b = s.step()
    assert b.blocks == [[1, 2, 3, 4, 5], [6, 7, 8, 9, 10], [11, 12, 13, 14, 15]]  # 3 requests at once
    assert b.slots == [1, 6, 11] and b.live_slots == list(range(1, 16))


def test_freed_blocks_are_reused_lowest_first():
    s = _sched(max_tokens=16, num_slots=3, k=1)
    for rid in range(3):
        s.add(rid, 2)
    assert s.step().blocks == [[1, 2], [3, 4], [5, 6]]
    s.finish(1)
    s.finish(0, preempt=True)
    s.add(3, 2)
    b = s.step()
    assert b.finished == [1, 0] and b.request_ids == [2, 0, 3] and b.blocks == [[5, 6], [1, 2], [3, 4]]
    assert b.num_computed == [2, 0, 0]  # the preempted request starts again from scratch, in block 1 again


def test_the_sentinel_minus_1_range_starts_at_block_0():
    seq = Sequence([Request(i, 2, 2) for i in range(4)], num_slots=4, max_tokens=16, spec_tokens=2)
    b = _check(seq, usable=range(4))[0]
    assert b.blocks == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10, 11]]
    assert schedule(seq)[0].blocks[0] == [1, 2, 3]


def test_finished_lists_what_ended_since_the_previous_step():
    seq = Sequence([Request(0, 2, 1), Request(1, 2, 3), Request(2, 2, 4, preempt_after=1)], max_tokens=16)
    steps = _check(seq)
    assert [b.finished for b in steps[:3]] == [[], [], [0, 2]]  # 0 done after one decode, 2 preempted
    assert steps[2].request_ids == [1, 2] and steps[2].num_computed == [3, 0]  # 2 recomputed: 2 + 1 + 1 tokens


def test_a_preempted_request_is_recomputed_with_the_tokens_it_kept():
    seq = Sequence([Request(0, 3, 4, preempt_after=2, accept=[3, 2])], max_tokens=8, spec_tokens=2)
    steps = _check(seq)
    # prefill 3, decodes at 3 (kept 3: drafts at 4 and 5 accepted) and 6 (kept 2: the draft at 7), then preempted
    assert [b.num_computed[0] for b in steps[:3]] == [0, 3, 6] and steps[3].finished == [0]
    again = steps[3]
    assert again.num_computed == [0] and again.query_lens == [8] and again.prompt_lens == [3]
    kept = [_token(0, 0, p, 512) for p in range(4)] + [_draft(0, 0, 4, 512), _draft(0, 0, 5, 512),
                                                        _token(0, 0, 6, 512), _draft(0, 0, 7, 512)]
    assert again.token_ids == kept
    # ... and the bonus token sampled at 8: the recompute's last chunk is that one token, then decodes from 9
    assert again.is_prefilling() == [True] and again.prefill_lens == [9]
    assert (steps[4].num_computed, steps[4].query_lens, steps[4].token_ids) == ([8], [1], [_token(0, 0, 8, 512)])
    assert steps[5].num_computed == [9] and steps[5].draft_lens == [2]


def test_dummy_steps_only_on_an_idle_data_parallel_rank():
    s = _sched(k=1)
    with pytest.raises(BadInput, match="data_parallel"):
        s.dummy()
    s = _sched(k=1, dp=True)
    s.add(0, 2, decode_steps=1)
    with pytest.raises(BadInput, match="while requests can run"):
        s.dummy()
    reqs = [Request(0, 3, 2, arrive=2), Request(1, 2, 1, arrive=9)]
    dp = Sequence(reqs, max_tokens=8, spec_tokens=1, data_parallel=True, tail_dummies=2)
    steps = _check(dp)
    # idle until request 0 arrives at tick 2, between 0's end and 1's arrival at 9, then tail_dummies
    assert [b.dummy for b in steps] == [True, True, False, False, False] + [True] * 4 + [False, False, True, True]
    assert steps[5].finished == [0] and steps[11].finished == [1] and steps[11].live_slots == []
    alone = _check(Sequence(reqs, max_tokens=8, spec_tokens=1))
    assert not any(b.dummy for b in alone)
    assert _core(alone) == [(b.request_ids, b.slots, b.query_lens, b.has_initial_state, b.token_ids, i, b.live_slots)
                            for i, b in enumerate(x for x in steps if not x.dummy)]
    with pytest.raises(BadInput, match="needs data_parallel"):
        schedule(Sequence(reqs, max_tokens=8, tail_dummies=1))


# ---- every rule at every step -------------------------------------------------------------------


@FEW
@given(st.integers(0, 4).flatmap(lambda k: sequences(max_requests=7, max_tokens=8, num_slots=3, max_prompt=30,
                                                      spec_tokens=k, data_parallel=True)))
def test_every_rule_holds_at_every_step_of_drawn_sequences(seq):
    _check(seq)
    _check(seq, usable=range(seq.num_slots))


@pytest.mark.parametrize("k", [0, 1, 3])
def test_every_rule_holds_at_every_step_of_seeded_sequences(k):
    dummies = {False: 0, True: 0}
    for seed in range(12):
        for dp in (False, True):
            seq = random_sequence(seed, num_requests=10, num_slots=4, spec_tokens=k, data_parallel=dp,
                                  chunked_prefill=True)
            dummies[dp] += sum(b.dummy for b in _check(seq))
    assert dummies[False] == 0 and dummies[True] > 0


def test_seeded_sequences_draw_the_edges():
    k, budget = 2, 16
    lens = [r.prompt_len for s in range(20) for r in random_sequence(s, spec_tokens=k, chunked_prefill=True).requests]
    assert {1, 1 + k, budget + 1, 2 * budget + 1 + k} <= set(lens) and max(lens) > budget
    seq = random_sequence(0, spec_tokens=k)
    assert all(r.accept and all(1 <= a <= 1 + k for a in r.accept) for r in seq.requests)
    assert max(r.prompt_len for r in seq.requests) <= budget


class SchedulerMachine(RuleBasedStateMachine):
    """The rules the lockstep machine drives, against the scheduler alone (any K, dummies)."""

    def __init__(self):
        super().__init__()
        self.steps, self.kept, self.rid = [], {}, 0
        self.sched = None

    @initialize(k=st.integers(0, 4), slots=st.integers(1, 4), dp=st.booleans())
    def start(self, k, slots, dp):
        self.k, self.pool, self.dp = k, block_pool(slots, k), dp
        self.sched = Scheduler(8, self.pool, k, data_parallel=dp)

    @rule(prompt=st.one_of(st.sampled_from([1, 2, 5, 9, 13]), st.integers(1, 30)),
          decodes=st.one_of(st.none(), st.integers(0, 4)))
    def admit(self, prompt, decodes):
        self.sched.add(self.rid, prompt, decodes)
        self.rid += 1

    @precondition(lambda self: not self.sched.idle())
    @rule(counts=st.lists(st.integers(1, 5), min_size=4, max_size=4))
    def step(self, counts):
        kept = {r: min(counts[i], 1 + self.k) for i, r in enumerate(self.sched.awaiting())}
        self.kept.update({(len(self.steps) - 1, r): a for r, a in kept.items()})
        b = self.sched.step(kept)
        assert b is not None
        self.steps.append(b)

    @precondition(lambda self: self.sched.running())
    @rule(data=st.data(), preempt=st.booleans())
    def finish(self, data, preempt):
        self.sched.finish(data.draw(st.sampled_from(self.sched.running())), preempt)

    @precondition(lambda self: self.dp and self.sched.idle())
    @rule()
    def dummy(self):
        self.steps.append(self.sched.dummy())

    @invariant()
    def rules_hold(self):
        check_steps(self.steps, 8, self.k, self.pool, data_parallel=self.dp, kept=self.kept)


def test_every_rule_holds_under_any_order_of_admits_steps_finishes_and_dummies():
    run_state_machine_as_test(SchedulerMachine, settings=settings(max_examples=40, stateful_step_count=30,
                                                                  deadline=None, derandomize=True, database=None,
                                                                  suppress_health_check=list(HealthCheck)))


def test_the_rule_checker_catches_a_broken_schedule():
    seq = random_sequence(2, num_requests=6, spec_tokens=2, chunked_prefill=True)
    good = schedule(seq)
    broken = [copy.deepcopy(b) for b in good]
    i = next(n for n, b in enumerate(broken) if any(b.draft_lens))
    broken[i].num_accepted = [a + 1 if a < 3 else a - 1 for a in broken[i].num_accepted]
    with pytest.raises(AssertionError):
        check_steps(broken, seq.max_tokens, 2, block_pool(seq.num_slots, 2), seq.seed, seq.vocab)
    swapped = [copy.deepcopy(b) for b in good]
    j = next(n for n, b in enumerate(swapped) if b.num_reqs > 1 and any(c == 0 for c in b.num_computed)
             and any(b.draft_lens))
    for f in ("request_ids", "slots", "query_lens", "has_initial_state", "num_computed", "prompt_lens",
              "draft_lens", "num_accepted", "blocks"):
        setattr(swapped[j], f, list(reversed(getattr(swapped[j], f))))
    with pytest.raises(AssertionError):
        check_steps(swapped, seq.max_tokens, 2, block_pool(seq.num_slots, 2), seq.seed, seq.vocab)


def test_abort_waiting_ends_queued_requests_and_leaves_the_running():
    """`Scheduler.finish_requests` on a waiting request removes it from the queue: it held no
    blocks, so none is freed; the running request keeps its blocks, and once it finishes the rank
    is idle."""
    s = Scheduler(8, block_pool(2), data_parallel=True)
    s.add(0, 3)
    s.add(1, 3)
    s.add(2, 3)  # two slots: request 2 waits
    s.step()
    assert s.running() == [0, 1] and s.waiting() == [2]
    assert s.abort_waiting() == [2] and s.waiting() == []
    assert s.running() == [0, 1] and not s.idle()
    s.finish(0)
    s.finish(1)
    assert s.idle() and s.done()
