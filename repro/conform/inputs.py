"""The inputs a conformance run feeds both sides: cases and request sequences drawn by Hypothesis
from the suite's own strategies (`repro.search.strategies`), concentrated on the rules' edges.

`draw(strategy, n, seed)` collects `n` examples of a strategy, derandomised by `seed` (the same
seed draws the same inputs on every machine, with the pinned Hypothesis), with no database and no
shrinking: the run compares every example and reports what differs, it does not hunt for one.

`cases_st` draws runner configurations: every graph mode, K = 0..4, vLLM's default capture sizes or
a list near the edges (sizes below, at and above a multiple of 1+K, and around
`max_num_seqs * (1+K)`), request counts and step budgets from 1 up and at the production values.
`sequences_st` draws request sequences as `repro hunt` does (prompts of 1, 1+K, one past the budget,
a last chunk of 1+K, preemptions, kept counts, prefix sharing with a block size).
"""
from __future__ import annotations

from hypothesis import HealthCheck, Phase, given, seed as hseed, settings
from hypothesis import strategies as st

from ..search.strategies import sequences
from ..upstream.case import Case
from ..control.shape import decode_len

MODES = ("none", "piecewise", "full", "full_decode_only", "full_and_piecewise")
PRODUCTION_SEQS = (64, 128, 256, 512, 1024)
PRODUCTION_BUDGETS = (256, 512, 2048, 8192)


def draw(strategy, n: int, seed: int = 0) -> list:
    """`n` examples of `strategy` (module docstring)."""
    out: list = []

    @hseed(seed)
    @settings(max_examples=n, database=None, deadline=None, phases=[Phase.generate], derandomize=False,
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def collect(x):
        out.append(x)
    collect()
    return out


@st.composite
def cases_st(draw_, modes=MODES, max_k: int = 4, block_size: bool = False):
    """A runner configuration (module docstring); `block_size` adds prefix caching's block size."""
    k = draw_(st.integers(0, max_k))
    q = decode_len(k)
    seqs = draw_(st.one_of(st.integers(1, 12), st.sampled_from(PRODUCTION_SEQS)))
    edge = [x for x in {q - 1, q, q + 1, 2 * q, seqs * q - 1, seqs * q, seqs * q + 1, 2 * seqs * q} if 0 < x <= 2048]
    sizes = draw_(st.one_of(
        st.none(),
        st.sampled_from([(1, 2, 4, 8), (1, 2, 4, 8, 16), (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)]),
        st.lists(st.one_of(st.integers(1, 64), st.sampled_from(sorted(edge))), min_size=1, max_size=8,
                 unique=True).map(lambda xs: tuple(sorted(xs)))))
    budget = draw_(st.one_of(st.integers(seqs, seqs + 64), st.sampled_from(PRODUCTION_BUDGETS).filter(lambda b: b >= seqs)))
    bs = draw_(st.one_of(st.sampled_from([q + 1, 4, 8, 16]), st.integers(q + 1, 64))) if block_size else None
    return Case(mode=draw_(st.sampled_from(modes)), spec_tokens=k, sizes=sizes, max_num_seqs=seqs,
                max_num_batched_tokens=budget, block_size=bs)


def sequences_st(spec_tokens: int, block_size: int | None, data_parallel: bool = False):
    """A request sequence as `repro hunt` draws one (`repro.search.strategies.sequences`), with a
    step budget and request slots small enough that chunks, preemptions and full batches occur."""
    return sequences(max_requests=6, max_tokens=8, num_slots=4, max_prompt=12, spec_tokens=spec_tokens,
                     data_parallel=data_parallel, block_size=block_size)
