"""The scheduler family of `repro conform` (`repro/conform/scheduler.py`): vLLM's V1
scheduler and the mirror's on the same request streams, drawn from the suite's strategies, step by
step; a mirror with one rule reverted differs, so the comparison can fail. Needs vLLM."""
from dataclasses import replace

import pytest

from repro.scheduler import scheduler as mirror
from repro.scheduler.sequence import Request, Sequence
from repro.upstream import load as upstream
from repro.conform import scheduler as family
from repro.conform.inputs import draw, sequences_st
from repro.search.strategies import sequences

MISSING = upstream.why_not()
pytestmark = [pytest.mark.conformance, pytest.mark.skipif(MISSING is not None, reason=MISSING or "")]
COMBOS = [(0, None), (0, 4), (2, None), (2, 4)]


@pytest.fixture(scope="module")
def up():
    return upstream.load()


def _resumes(seq) -> bool:
    return any(p != q for b in seq.batches() for p, q in zip(b.prefills(), b.prompts()))


def _run(up, seqs, cache):
    out = family.results()
    for s in seqs:
        family.compare_sequence(up, s, out, cache)
    return out["scheduler"]


@pytest.mark.skipif(MISSING is None and upstream.installed() != family.ALIGN_RELEASE,
                    reason=f"the mirror's scheduler follows vLLM {family.ALIGN_RELEASE} with a block size")
def test_320_streams_with_preemptions_and_resumes_schedule_alike_at_k0_and_k2_with_and_without_a_block_size(up, cache):
    # async scheduling off: the AsyncScheduler is not driven through vLLM (`family.run` leaves such streams out)
    streams = {(k, bs): [replace(s, async_scheduling=False) for s in draw(sequences_st(k, bs, data_parallel=True), 80,
                                                                          7 + k + (bs or 0))] for k, bs in COMBOS}
    r = _run(up, [s for ss in streams.values() for s in ss], cache)
    assert r.unexplained == 0 and not r.refused, r.first.line() if r.first else r.refusal
    resumed = {combo: sum(map(_resumes, seqs)) for combo, seqs in streams.items()}
    assert all(n >= 10 for n in resumed.values()), resumed  # each combination preempts and resumes
    assert r.calls >= 3000 and set(r.explained) <= {"pool size"}


def test_a_mirror_with_a_rule_reverted_differs(up, cache, monkeypatch):
    """The negative control: the resume length the mirror had before it ran beside vLLM (the tokens
    kept, not the last sampled one) differs on the smallest stream of the resumed recompute."""
    seq = Sequence([Request(0, 2, 2, preempt_after=1)], num_slots=1, max_tokens=3, spec_tokens=2)
    assert _run(up, [seq], cache).unexplained == 0
    monkeypatch.setattr(mirror._Req, "prefill_len", lambda r: max(r.prompt_len, r.num_computed))
    r = _run(up, [seq], cache)
    assert r.unexplained == 1 and r.first.field == "prefill_lens" and "step 2" in r.first.call


@pytest.mark.slow
@pytest.mark.parametrize("k", [0, 1, 2, 3])
def test_the_scheduler_agrees_over_a_wide_sweep(up, cache, k):
    """K = 0..3, block sizes none, 4 and 8, a data-parallel rank, budgets of 5, 8 and 16 tokens."""
    seqs = [s for bs in (None, 4, 8) if not bs or bs > k
            for budget, slots, prompt in ((8, 4, 20), (16, 8, 40), (5, 2, 12)) if budget > k
            for s in draw(sequences(max_requests=6, max_tokens=budget, num_slots=slots, max_prompt=prompt,
                                    spec_tokens=k, block_size=bs, data_parallel=True), 60, 3)]
    if upstream.installed() != family.ALIGN_RELEASE:
        seqs = [s for s in seqs if s.block_size is None]
    r = _run(up, seqs, cache)
    assert r.unexplained == 0 and not r.refused, r.first.line() if r.first else r.refusal
