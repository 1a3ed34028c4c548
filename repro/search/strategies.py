"""Hypothesis strategies for request sequences: what `repro hunt` searches and the scheduler's
property tests draw from.

With the defaults (K = 0, no data parallelism) the strategies draw exactly as they always have, so
a saved Hypothesis database still replays. With K > 0 they add the prompt lengths where the
scheduler's rules have edges (1, 1+K, one past the budget, a last chunk of 1+K) and each
request's kept counts; `data_parallel` adds dummy steps after the last request; a `block_size`
adds prompts near multiples of the block size plus 1+K and prefixes shared with an earlier
request, so prefix hits occur."""
from __future__ import annotations

from hypothesis import strategies as st

from ..scheduler.sequence import Request, Sequence


def kept_counts_st(k: int):
    """A request's kept counts (1..1+K a spec decode, cycled), or None: every draft kept."""
    return st.one_of(st.none(), st.lists(st.integers(1, 1 + k), min_size=1, max_size=4))


def requests_st(max_requests: int = 5, max_tokens: int = 8, max_decode: int = 6, max_prompt: int | None = None,
                spec_tokens: int = 0):
    if spec_tokens == 0:
        req = st.builds(
            lambda p, d, a, pre: (p, d, a, pre),
            st.integers(1, max_prompt or max_tokens), st.integers(0, max_decode), st.integers(0, 3),
            st.one_of(st.none(), st.integers(1, 3)))
        return st.lists(req, min_size=1, max_size=max_requests).map(
            lambda rs: [Request(i, p, d, a, pre) for i, (p, d, a, pre) in enumerate(rs)])
    k = spec_tokens
    top = max_prompt or max_tokens
    edges = sorted({e for e in (1, 1 + k, max_tokens + 1, max_tokens + 1 + k) if e <= top})
    req = st.builds(
        lambda p, d, a, pre, acc: (p, d, a, pre, acc),
        st.one_of(st.sampled_from(edges), st.integers(1, top)), st.integers(0, max_decode), st.integers(0, 3),
        st.one_of(st.none(), st.integers(1, 3)), kept_counts_st(k))
    return st.lists(req, min_size=1, max_size=max_requests).map(
        lambda rs: [Request(i, p, d, a, pre, acc) for i, (p, d, a, pre, acc) in enumerate(rs)])


def aligned_requests_st(block_size: int, max_requests: int = 5, max_tokens: int = 8, max_decode: int = 6,
                        max_prompt: int | None = None, spec_tokens: int = 0):
    """Requests for prefix caching: prompts on a block multiple plus 1+K (+-1) or any length (with
    K > 0 also 1 and 1+K, and each request's kept counts), and for each, optionally, the request
    `1 + back` before it whose first tokens it repeats (as many as the shorter prompt has)."""
    k, top = spec_tokens, max_prompt or max_tokens
    edges = sorted({max(1, m * block_size + 1 + k + d) for m in (1, 2, 3) for d in (-1, 0, 1)}
                   | ({1, 1 + k} if k else set()))
    parts = [st.one_of(st.sampled_from(edges), st.integers(1, top)), st.integers(0, max_decode), st.integers(0, 3),
             st.one_of(st.none(), st.integers(1, 3)), st.one_of(st.none(), st.integers(0, 3))]
    if k:  # K = 0 draws as it always has (a saved Hypothesis database replays)
        parts.append(kept_counts_st(k))
    req = st.tuples(*parts)

    def build(rs):
        out = []
        for i, (p, d, a, pre, back, *acc) in enumerate(rs):
            of = i - 1 - back if back is not None and i - 1 - back >= 0 else None
            n = min(p, out[of].prompt_len) if of is not None else 0
            out.append(Request(i, p, d, a, pre, *acc, prefix_of=of, prefix_len=n))
        return out
    return st.lists(req, min_size=1, max_size=max_requests).map(build)


def sequences(max_requests: int = 5, max_tokens: int = 8, num_slots: int = 4, vocab: int = 512,
              max_prompt: int | None = None, spec_tokens: int = 0, data_parallel: bool = False,
              block_size: int | None = None):
    if block_size:
        reqs = aligned_requests_st(block_size, max_requests, max_tokens, max_prompt=max_prompt, spec_tokens=spec_tokens)
    else:
        reqs = requests_st(max_requests, max_tokens, max_prompt=max_prompt, spec_tokens=spec_tokens)
    if not data_parallel:
        return reqs.map(lambda rs: Sequence(rs, num_slots=num_slots, max_tokens=max_tokens, vocab=vocab,
                                            spec_tokens=spec_tokens, block_size=block_size))
    return st.tuples(reqs, st.integers(0, 2)).map(
        lambda x: Sequence(x[0], num_slots=num_slots, max_tokens=max_tokens, vocab=vocab, spec_tokens=spec_tokens,
                           data_parallel=True, tail_dummies=x[1], block_size=block_size))


def size_of(seq: Sequence) -> tuple[int, int]:
    return len(seq.requests), len(seq.batches())


def space_for(sizes) -> dict:
    """The search space of `repro hunt`: enough slots, requests and token budget that a decode
    batch can reach the largest captured size (16 by default), not only the smallest ones."""
    top = max(sizes)
    return {"max_requests": top + 2, "num_slots": top, "max_tokens": top, "max_prompt": 8}
