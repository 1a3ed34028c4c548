"""Hypothesis strategies for request sequences: what `repro hunt` searches and the scheduler's
property tests draw from.

With K > 0 they add the prompt lengths where the scheduler's rules have edges (1, 1+K, one past the
budget, a last chunk of 1+K) and each request's kept counts; `data_parallel` adds dummy steps after
the last request; a `block_size` adds prompts near multiples of the block size plus 1+K and prefixes
shared with an earlier request, so prefix hits occur.

Every sequence also draws the scheduler settings that give the runner its rarer states
(`scheduler_config_st`: a scheduled budget below the batch size, the long prefill threshold, async
scheduling) and, on a data-parallel rank, the other rank's batches (`dp_peers_st`); each shrinks
to off, so a minimal sequence carries only the ones its failure needs."""
from __future__ import annotations

from hypothesis import strategies as st

from ..control.dispatch import capture_sizes, default_capture_sizes
from ..knobs.modes import MODES
from ..scheduler.config import SchedulerConfig
from ..scheduler.sequence import Request, Sequence
from ..control.shape import decode_len


def kept_counts_st(k: int):
    """A request's kept counts (1..1+K a spec decode, cycled), or None: every draft kept."""
    return st.one_of(st.none(), st.lists(st.integers(1, decode_len(k)), min_size=1, max_size=4))


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
    edges = sorted({e for e in (1, decode_len(k), max_tokens + 1, max_tokens + decode_len(k)) if e <= top})
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
    edges = sorted({max(1, m * block_size + decode_len(k) + d) for m in (1, 2, 3) for d in (-1, 0, 1)}
                   | ({1, decode_len(k)} if k else set()))
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


def sometimes(on, off, every: int = 3):
    """`on`'s draw in one example of `every`, else `off` (it shrinks to `off`). A setting is off
    more often than on: it lengthens a sequence (a budget parks decodes, a threshold cuts chunks),
    and most of what a hunt finds needs none of them. Off draws nothing more: a draw that changes
    nothing would let the shrinker try the same sequence again and again."""
    return st.sampled_from(range(every)).flatmap(lambda i: on if i == every - 1 else st.just(off))


def padded_budgets(batch: int, num_slots: int, spec_tokens: int, top: int) -> list[int]:
    """Scheduled budgets of n whole decodes (n * (1+K) tokens, at most `top`) that no FULL capture
    size of a runner with a `batch`-token batch holds, below its largest: the n decodes that fit are
    padded to a capture size while the next one is parked (vLLM's default sizes,
    `control.dispatch.capture_sizes`)."""
    q = decode_len(spec_tokens)
    sizes = capture_sizes(default_capture_sizes(num_slots, batch, spec_tokens), MODES["FULL_AND_PIECEWISE"], spec_tokens)
    return [n * q for n in range(1, num_slots + 1) if n * q <= top and n * q not in sizes and n * q < max(sizes)]


def scheduler_config_st(max_tokens: int, num_slots: int, spec_tokens: int = 0):
    """(settings, batch size): the settings beyond the budget (`scheduler/config.py`), each off or
    drawn. A scheduled budget (in one sequence of four: it lengthens a sequence most) under a batch of
    `max_tokens` or twice it (vLLM's max_num_batched_tokens, whose capture sizes then reach past the
    budget: speculative decoding's setting), half the time an edge (one decode's or two decodes',
    which park the rest, or one that pads the decodes it holds beside a parked one:
    `padded_budgets`), else two decodes' up to `max_tokens`; a long-prefill threshold of 1+K up to
    `max_tokens` (small ones often: they cut a recompute into chunks that end in 1 or 1+K tokens);
    async scheduling."""
    q = decode_len(spec_tokens)
    small = st.integers(q, min(max_tokens, 2 * q + 1))

    def under(batch: int):
        low = min(2 * q, max_tokens)
        edges = sorted(set(padded_budgets(batch, num_slots, spec_tokens, max_tokens)) | {q, low})
        return st.one_of(st.sampled_from(edges), st.sampled_from(range(low, max_tokens + 1))).map(lambda n: (n, batch))
    budget = sometimes(st.sampled_from([max_tokens, 2 * max_tokens]).flatmap(under), None, every=4)
    threshold = sometimes(st.one_of(small, st.integers(q, max_tokens)), 0)
    return st.builds(lambda b, t, a: (SchedulerConfig(b and b[0], t, a), b[1] if b else max_tokens),
                     budget, threshold, st.booleans())


def dp_peers_st(max_tokens: int, num_slots: int, spec_tokens: int = 0):
    """The other data-parallel rank's batch a step, cycled (`Sequence.dp_peers`): idle ([0, true]:
    its dummy run, what it shrinks to), uniform decodes of 1+K tokens each, or a mixed batch of any
    size. A data-parallel rank always has another rank to agree with."""
    q = decode_len(spec_tokens)
    uniform = st.sampled_from(range(1, min(num_slots, max_tokens // q) + 1)).map(lambda n: [n * q, True])
    peer = st.one_of(st.just([0, True]), uniform, st.integers(1, max_tokens).map(lambda n: [n, False]))
    return st.lists(peer, min_size=1, max_size=4)


def sequences(max_requests: int = 5, max_tokens: int = 8, num_slots: int = 4, vocab: int = 512,
              max_prompt: int | None = None, spec_tokens: int = 0, data_parallel: bool = False,
              block_size: int | None = None):
    if block_size:
        reqs = aligned_requests_st(block_size, max_requests, max_tokens, max_prompt=max_prompt, spec_tokens=spec_tokens)
    else:
        reqs = requests_st(max_requests, max_tokens, max_prompt=max_prompt, spec_tokens=spec_tokens)
    conf = scheduler_config_st(max_tokens, num_slots, spec_tokens)
    peers = dp_peers_st(max_tokens, num_slots, spec_tokens) if data_parallel else st.none()
    dummies = st.integers(0, 2) if data_parallel else st.just(0)
    return st.tuples(reqs, conf, dummies, peers).map(
        lambda x: Sequence(x[0], num_slots=num_slots, max_tokens=x[1][1], vocab=vocab, spec_tokens=spec_tokens,
                           data_parallel=data_parallel, tail_dummies=x[2], block_size=block_size,
                           max_num_scheduled_tokens=x[1][0].max_num_scheduled_tokens,
                           long_prefill_token_threshold=x[1][0].long_prefill_token_threshold,
                           async_scheduling=x[1][0].async_scheduling, dp_peers=x[3]))


def size_of(seq: Sequence) -> tuple[int, int]:
    return len(seq.requests), len(seq.batches())


def space_for(sizes) -> dict:
    """The search space of `repro hunt`: enough slots, requests and token budget that a decode
    batch can reach the largest captured size (16 by default), not only the smallest ones."""
    top = max(sizes)
    return {"max_requests": top + 2, "num_slots": top, "max_tokens": top, "max_prompt": 8}
