"""The scheduler's rarer states, each as vLLM 0.33.0 reaches it (`repro/scheduler/config.py` and
`repro/control/dispatch.py` cite the functions), each reachable by the seeded sequences and by a
ci-profile hunt's sequences (the edge table, `repro/search/edges.py`), each checked field by field
in a sequence file, and a file without them read and scheduled as before."""
import json

import pytest

from repro.cli.app import main
from repro.control.builder import draft_counts
from repro.control.dispatch import DEFAULT_SIZES, Dispatcher, default_capture_sizes, dispatch_step
from repro.errors import BadInput
from repro.graphs import make_provider
from repro.islands import Model
from repro.job.cases import Case, default_sequence, run_case
from repro.knobs.modes import Runtime, parse_mode
from repro.knobs.options import UniformDecode
from repro.scheduler.sequence import Request, Sequence
from repro.search.edges import RARE, Edges
from repro.search.hunt import hunt
from repro.search.strategies import space_for
from repro.control.shape import StepShape

FIXED = UniformDecode.PHASE_AWARE


def _dispatcher(seq, mode="full_and_piecewise"):
    return Dispatcher(parse_mode(mode), default_capture_sizes(seq.num_slots, seq.max_tokens, seq.spec_tokens),
                      StepShape.of(seq))


def _edges(seq) -> Edges:
    e = Edges("full_and_piecewise", seq.spec_tokens, seq.num_slots)
    e.watch(seq)
    return e


@pytest.fixture(scope="module")
def model_provider(tiny_path):
    p = make_provider("cpu")
    return Model(tiny_path, p.device, None, island="submod0"), p


# -- a scheduled budget below a capture size (`Scheduler.schedule`: token_budget = max_num_scheduled_tokens)

BUDGET = Sequence([Request(i, 1, 4) for i in range(4)], num_slots=4, max_tokens=16, spec_tokens=1,
                  max_num_scheduled_tokens=6)


def test_a_budget_below_a_capture_size_pads_decodes_beside_a_parked_request():
    """At K = 1 four decodes of 2 tokens need 8; a budget of 6 schedules three, padded to the
    capture size 8 of a FULL graph, and the fourth request, still holding its blocks, is parked."""
    b = BUDGET.batches()[1]
    assert b.query_lens == [2, 2, 2] and b.drafts() == [1, 1, 1]
    parked = set(b.live_slots) - {x for row in b.block_rows() for x in row}
    assert parked, b.to_json()
    runtime, desc = dispatch_step(_dispatcher(BUDGET), b, FIXED)
    assert runtime is Runtime.FULL and desc.num_tokens == 8 > b.num_tokens
    assert _edges(BUDGET).counts["full-pad:parked"]
    unbudgeted = Sequence(BUDGET.requests, num_slots=4, max_tokens=16, spec_tokens=1)
    assert unbudgeted.batches()[1].query_lens == [2] * 4 and not _edges(unbudgeted).counts["full-pad:parked"]


def test_the_fixed_stack_is_clean_beside_a_parked_request(model_provider):
    model, provider = model_provider
    r = run_case(model, provider, Case("chain", "full_and_piecewise", spec_tokens=1), BUDGET)
    assert not r.diverged and not r.findings, r.to_json()


# -- long_prefill_token_threshold (`Scheduler.schedule`: applied when num_eligible_reqs > 1)

def test_the_long_prefill_threshold_cuts_a_prompt_only_beside_another_request():
    both = Sequence([Request(0, 10, 0), Request(1, 2, 3)], num_slots=4, max_tokens=16,
                    long_prefill_token_threshold=4)
    assert [b.query_lens for b in both.batches()][:3] == [[4, 2], [1, 4], [1, 2]]
    assert _edges(both).counts["long-prefill:cut"] == 2
    alone = Sequence([Request(0, 10, 0)], num_slots=4, max_tokens=16, long_prefill_token_threshold=4)
    assert [b.query_lens for b in alone.batches()] == [[10]]  # no other request to starve


# -- a recompute after a preemption ending in chunks of 1 and 1+K (`_preempt_request` + the threshold)

def _recompute(prompt: int) -> Sequence:
    """Request 0 keeps all 1+K = 3 tokens of its one decode, is preempted, and recomputes every token
    it holds (prompt + 3 kept + the last sampled, as `_preempt_request` leaves it) in chunks of at
    most 6, beside request 1."""
    return Sequence([Request(0, prompt, 3, preempt_after=1), Request(1, 1, 12)], num_slots=4, max_tokens=16,
                    spec_tokens=2, long_prefill_token_threshold=6)


@pytest.mark.parametrize("prompt, last", [(3, 1), (5, 3)])
def test_a_recompute_ends_in_a_chunk_of_1_or_1_plus_k(prompt, last):
    seq = _recompute(prompt)
    rows = [(b, i) for b in seq.batches() for i, rid in enumerate(b.request_ids)
            if rid == 0 and b.prompts()[i] < b.prefills()[i] and b.computed()[i] < b.prefills()[i]]
    assert [b.query_lens[i] for b, i in rows] == [6, last]  # the recompute: prompt + 3 kept + 1 sampled
    b, i = rows[-1]
    assert b.computed()[i] == 6 and b.prefills()[i] == 6 + last
    if last == 1:  # the V1 runner calls it a spec row of no drafts: past num_prompt_tokens, one token
        assert draft_counts(b.query_lens, b.drafts(), b.computed(), b.prompts())[i] == 0
    assert _edges(seq).counts["recompute:last-1" if last == 1 else "recompute:last-1+K"] == 1


@pytest.mark.parametrize("prompt", [4, 6])
def test_the_fixed_stack_is_clean_through_a_short_recompute(model_provider, prompt):
    model, provider = model_provider
    r = run_case(model, provider, Case("chain", "full_and_piecewise", spec_tokens=2), _recompute(prompt))
    assert not r.diverged and not r.findings, r.to_json()


# -- async scheduling (`AsyncScheduler._update_after_schedule`; `Scheduler.schedule` on stale output)

def test_async_scheduling_carries_placeholders_and_runs_a_stopped_request_once_more():
    sync = Sequence([Request(0, 2, 2)], num_slots=4, max_tokens=16, spec_tokens=2)
    lag = Sequence([Request(0, 2, 2)], num_slots=4, max_tokens=16, spec_tokens=2, async_scheduling=True)
    assert [b.query_lens for b in sync.batches()] == [[2], [3], [3]]
    steps = lag.batches()
    assert [b.query_lens for b in steps] == [[2], [3], [3], [3]]  # one decode more: the scheduler's lag
    assert [b.num_output_placeholders for b in steps] == [[0], [1], [3], [3]]  # the last step's tokens in flight
    assert [b.lagged for b in steps] == [[], [], [], [0]] and sync.batches()[-1].num_output_placeholders is None
    e = _edges(lag)
    assert e.counts["async:lagged"] == 1 and e.counts["async:placeholders"] == 3


def test_async_scheduling_resumes_a_preempted_request_after_its_output_drains():
    def resumed_at(**kw) -> int:  # request 1 decodes at every step: the steps count ticks
        seq = Sequence([Request(0, 2, 3, preempt_after=1), Request(1, 1, 8)], num_slots=4, max_tokens=16,
                       spec_tokens=2, **kw)
        return next(i for i, b in enumerate(seq.batches()) if i and 0 in b.request_ids
                    and b.computed()[b.request_ids.index(0)] == 0)
    assert resumed_at(async_scheduling=True) == resumed_at() + 1


# -- data-parallel padding (`dp_utils.coordinate_batch_across_dp`, `_determine_batch_execution_and_padding`)

def _dp(peer) -> Sequence:
    return Sequence([Request(0, 1, 2)], num_slots=4, max_tokens=16, spec_tokens=2, data_parallel=True,
                    tail_dummies=1, dp_peers=[peer])


@pytest.mark.parametrize("peer, decode, dummy", [
    ([12, True], (Runtime.FULL, 12), (Runtime.FULL, 12)),  # padded to the busier rank's size
    ([7, False], (Runtime.PIECEWISE, 9), (Runtime.PIECEWISE, 9)),  # the lower mode: pieces, at its size
    ([0, True], (Runtime.FULL, 3), (Runtime.FULL, 3)),  # an idle peer: no more than its own dummy
])
def test_a_rank_pads_to_the_size_and_mode_the_ranks_agree_on(peer, decode, dummy):
    seq = _dp(peer)
    steps = seq.batches()
    d = _dispatcher(seq)
    got = [(rt, desc.num_tokens) for rt, desc in (dispatch_step(d, b, FIXED) for b in steps)]
    assert steps[1].query_lens == [3] and got[1] == decode
    assert steps[-1].dummy and got[-1] == dummy


def test_the_fixed_stack_is_clean_on_a_padded_data_parallel_rank(model_provider):
    model, provider = model_provider
    r = run_case(model, provider, Case("chain", "full_and_piecewise", spec_tokens=2, data_parallel=True), _dp([12, True]))
    assert not r.diverged and not r.findings, r.to_json()


# -- reachable: by the seeded sequences, and by a ci-profile hunt's

def test_the_seeded_sequences_reach_every_rare_state():
    e = Edges("full_and_piecewise", 2, 8)
    for seed in range(12):
        e.watch(default_sequence(seed, 300, spec_tokens=2, data_parallel=True))
    assert not e.missing(RARE), {r: e.counts[r] for r in RARE}


def test_a_ci_hunt_of_60_sequences_reaches_every_rare_state(tmp_path):
    """The sequences a ci-profile hunt at K = 2 on a data-parallel rank draws (the strategies only:
    no lockstep runs, so it takes about a second)."""
    e = Edges("full_and_piecewise", 2, 16)

    def watch(seq):
        e.watch(seq)
    assert hunt(watch, 60, "ci", cache=tmp_path, spec_tokens=2, data_parallel=True, **space_for(DEFAULT_SIZES)) == []
    assert not e.missing(RARE), {r: e.counts[r] for r in RARE}


def test_hunt_coverage_prints_the_edge_table(tiny_path, tmp_path, capsys):
    assert main(["hunt", "--model", tiny_path, "--device", "cpu", "--island", "moe", "--profile", "ci",
                 "--max-examples", "2", "--coverage", "--save", str(tmp_path / "s.json")]) == 0
    out = capsys.readouterr().out
    assert "coverage: steps reaching each state over 2 sequences" in out
    for name in RARE + ("dispatch:FULL", "prompt:1+K"):
        assert any(line.split()[0] == name for line in out.splitlines() if line.startswith("  ")), name


# -- the sequence file: each new field checked, an old file as it was

GOOD = {"requests": [{"rid": 0, "prompt_len": 3, "decode_steps": 2}], "num_slots": 4, "max_tokens": 16,
        "spec_tokens": 2, "data_parallel": True, "max_num_scheduled_tokens": 6, "long_prefill_token_threshold": 3,
        "async_scheduling": True, "dp_peers": [[0, True], [9, True], [5, False]]}


@pytest.mark.parametrize("change, field", [
    ({"max_num_scheduled_tokens": 2}, "max_num_scheduled_tokens"),  # below one decode of 1+K
    ({"max_num_scheduled_tokens": 17}, "max_num_scheduled_tokens"),  # above max_tokens
    ({"max_num_scheduled_tokens": "6"}, "max_num_scheduled_tokens"),
    ({"long_prefill_token_threshold": 2}, "long_prefill_token_threshold"),  # would cut a decode
    ({"long_prefill_token_threshold": -1}, "long_prefill_token_threshold"),
    ({"async_scheduling": 1}, "async_scheduling"),
    ({"dp_peers": []}, "dp_peers"),
    ({"dp_peers": [[5, True]]}, "dp_peers[0]"),  # not whole decodes of 3 tokens
    ({"dp_peers": [[0, False]]}, "dp_peers[0]"),
    ({"dp_peers": [[17, False]]}, "dp_peers[0][0]"),
    ({"dp_peers": [[3]]}, "dp_peers[0]"),
    ({"dp_peers": [[3, "yes"]]}, "dp_peers[0][1]"),
    ({"data_parallel": False, "tail_dummies": 0}, "dp_peers[0]"),
])
def test_each_new_sequence_field_is_checked(change, field):
    with pytest.raises(BadInput, match=rf"seq: {field.replace('[', '.').replace(']', '.')}"):
        Sequence.from_json({**GOOD, **change}, "seq")


@pytest.mark.parametrize("key, value, field", [
    ("num_output_placeholders", [4], "num_output_placeholders.0."),  # more than 1+K in flight
    ("num_output_placeholders", [0, 0], "num_output_placeholders"),
    ("lagged", [7], "lagged.0."),
    ("lagged", [0, 0], "lagged.1."),
    ("dp_peer", [4, True], "dp_peer"),
])
def test_each_new_step_field_is_checked(key, value, field):
    steps = Sequence.from_json(GOOD).to_json()["steps"]
    steps[0][key] = value
    with pytest.raises(BadInput, match=rf"seq: steps.0..{field.replace('[', '.').replace(']', '.')}"):
        Sequence.from_json({**GOOD, "steps": steps}, "seq")


def test_the_new_fields_round_trip_and_an_old_file_reads_as_before():
    seq = Sequence.from_json(GOOD)
    again = Sequence.from_json(json.loads(json.dumps(seq.to_json())))
    assert [b.to_json() for b in again.batches()] == [b.to_json() for b in seq.batches()]
    assert any(b.dp_peer for b in seq.batches()) and any(b.lagged for b in seq.batches())
    old = {"requests": [{"rid": 0, "prompt_len": 3, "decode_steps": 2}], "num_slots": 4, "max_tokens": 16}
    d = Sequence.from_json(old).to_json()
    assert not {"max_num_scheduled_tokens", "long_prefill_token_threshold", "async_scheduling", "dp_peers"} & set(d)
    assert all(not {"num_output_placeholders", "lagged", "dp_peer"} & set(s) for s in d["steps"])
