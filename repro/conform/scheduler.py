"""The scheduler: the mirror (`repro.scheduler.scheduler`, `Sequence.batches`) against vLLM's V1
`Scheduler` driven over the same request stream (`repro.upstream.schedule`), step by step.

For each step both sides emit, per request (so a difference of row order is reported once, as
`order`): the chunk (query length), tokens computed before it (a prefix hit shows here), the prompt,
the tokens its admission computes (`prefill_lens`: a resumed request's recompute), the drafts
scheduled, the accepted count the runner reads, the token ids, with a block size the state columns,
and for the step the requests finished or preempted since the last one, whether it is a dummy, and
with a block size the boundary copies queued by the last step (as (request, column, column, offset,
column): block ids are each pool's own). A stream stops being compared at its first unexplained
difference: every later step follows from it.

With a block size the mirror's scheduler follows 0.33.0's `_mamba_block_aligned_split` and prefix
caching (its last cacheable position, shared-prefix junctions, same-step hits), which 0.26.0 does
otherwise, and its long-prefill threshold 0.33.0's `Scheduler.schedule` (a cap only while more than
one request is eligible; 0.26.0 caps a lone request's prompt too). It has no rule per release:
against another release only streams without a block size are compared, and with no threshold
(`ALIGN_RELEASE`).

Async scheduling is not compared: the mirror's one-step lag (`scheduler/config.py`) follows vLLM's
`AsyncScheduler`, which is not driven here, so a stream drawn with it runs synchronously in both.
A scheduled budget below the batch (`max_num_scheduled_tokens`) and the long-prefill threshold go
into both schedulers' configs.

Block ids themselves are not compared: vLLM's pool is shared with the attention layers' blocks and
hands out the least recently freed, the mirror's holds state blocks only. Nor is the pool's size:
vLLM runs with blocks enough that it never evicts a cached block or preempts for want of one
(`schedule.ample_blocks`), and with a block size the mirror is compared with a pool as ample
(`mirror_batches`); where the mirror's own pool (`num_slots` request slots of blocks) evicts a
cached block and so misses a prefix hit, that is counted as the explained "pool size" difference
(`explain.EXPLAINED`).
"""
from __future__ import annotations

from dataclasses import replace

from ..errors import BadInput
from ..scheduler.scheduler import Scheduler
from ..scheduler.steps import TICK_LIMIT, scheduler_config
from ..scheduler.tokens import draft, token
from ..upstream.schedule import VllmScheduler
from .result import RuleResult

RULES = {
    "scheduler": ("v1/core/sched/scheduler.py: Scheduler.schedule, update_from_output, _preempt_request "
                  "(rows: GPUModelRunner._update_states, _update_states_after_model_execute)",
                  "repro/scheduler/scheduler.py: Scheduler.step"),
}

AMPLE = 4096  # state blocks enough that no stream of the conformance run evicts one
ALIGN_RELEASE = "0.33.0"  # the release whose block-aligned scheduling the mirror's follows


def results() -> dict[str, RuleResult]:
    return {r: RuleResult(r, *RULES[r]) for r in RULES}


def _per_request(b) -> dict[str, dict]:
    """A step's fields, each as request -> value (module docstring)."""
    out: dict[str, dict] = {k: {} for k in ("query_lens", "num_computed", "prompt_lens", "prefill_lens", "draft_lens",
                                            "num_accepted", "token_ids", "state_cols", "prev_cols")}
    at = 0
    for i, rid in enumerate(b.request_ids):
        q = b.query_lens[i]
        for name, value in (("query_lens", q), ("num_computed", b.computed()[i]), ("prompt_lens", b.prompts()[i]),
                            ("prefill_lens", b.prefills()[i]), ("draft_lens", b.drafts()[i]),
                            ("num_accepted", b.accepted()[i]), ("token_ids", b.token_ids[at:at + q])):
            out[name][rid] = value
        if b.state_cols is not None:
            out["state_cols"][rid], out["prev_cols"][rid] = b.state_cols[i], b.prev_cols[i]
        at += q
    return out


def _copies(prev, b) -> list[tuple]:
    """The step's boundary copies by (request, destination column, source column, offset, SSM source
    column) in the rows of the step that queued them (`prev`); a block's column is the last one of
    the row that holds it (the runner's row keeps a relocated block's old column too)."""
    if prev is None or not b.post_copies:
        return []
    where = {}
    for rid, row in zip(prev.request_ids, prev.block_rows()):
        for col, blk in enumerate(row):
            where[blk] = (rid, col)
    at = lambda blk: where.get(blk, (None, None))
    return sorted((at(d)[0], at(d)[1], at(s)[1], off, at(ssm)[1]) for d, s, off, ssm in b.post_copies)


def step_pairs(theirs, ours, prev_theirs=None, prev_ours=None) -> dict:
    """Each compared field of one step: (vLLM's, the mirror's)."""
    pairs = {"dummy": (theirs.dummy, ours.dummy), "requests": (sorted(theirs.request_ids), sorted(ours.request_ids)),
             "finished": (sorted(theirs.finished), sorted(ours.finished))}
    a, b = _per_request(theirs), _per_request(ours)
    pairs.update({name: (a[name], b[name]) for name in a})
    pairs["order"] = (theirs.request_ids, ours.request_ids)
    if theirs.block_size is not None:
        pairs["post_copies"] = (_copies(prev_theirs, theirs), _copies(prev_ours, ours))
    return pairs


def describe(seq) -> str:
    """A stream, spelled out as the `Sequence` that makes it."""
    reqs = "; ".join(f"{r.rid}: prompt {r.prompt_len}, {r.decode_steps} decodes, arrives {r.arrive}"
                     + (f", preempted after {r.preempt_after}" if r.preempt_after is not None else "")
                     + (f", keeps {r.accept}" if r.accept else "")
                     + (f", first {r.prefix_len} of {r.prefix_of}" if r.prefix_of is not None and r.prefix_len else "")
                     for r in seq.requests)
    block = f", block {seq.block_size}" if seq.block_size else ""
    more = (f", scheduled budget {seq.max_num_scheduled_tokens}" if seq.max_num_scheduled_tokens else "") + (
        f", long-prefill threshold {seq.long_prefill_token_threshold}" if seq.long_prefill_token_threshold else "")
    return (f"K={seq.spec_tokens}{block}, budget {seq.max_tokens}{more}, {seq.num_slots} slots, dp {seq.data_parallel} "
            f"[{reqs}]")


def mirror_batches(seq, blocks: int = AMPLE) -> list:
    """The mirror's steps of `seq` with a block size and a pool of `blocks` state blocks (the
    driver of `repro.scheduler.steps.schedule`, whose pool is the sequence's own)."""
    sched = Scheduler(seq.max_tokens, range(1, 1 + blocks), seq.spec_tokens, seq.vocab, seq.seed, seq.data_parallel,
                      seq.block_size, seq.num_slots, 0, scheduler_config(seq))
    for r in sorted(seq.requests, key=lambda r: (r.arrive, r.rid)):
        sched.add(r.rid, r.prompt_len, r.decode_steps, r.arrive, r.preempt_after, r.accept, r.prefix_of, r.prefix_len)
    limit = TICK_LIMIT + max((r.arrive for r in seq.requests), default=0)
    steps = []
    while not sched.done():
        b = sched.dummy() if seq.data_parallel and sched.idle() else sched.step()
        if b is not None:
            steps.append(b)
        if sched.tick > limit:
            raise BadInput("the sequence does not finish (a request can never be scheduled)")
    return (steps + [sched.dummy() for _ in range(seq.tail_dummies)])[: seq.max_steps]


def _steps(r: RuleResult, seq, theirs, ours, explain_as=None) -> bool:
    """Step by step until the first difference not explained (`explain_as`: every difference is)."""
    for i in range(max(len(theirs), len(ours))):
        if i >= len(theirs) or i >= len(ours):
            return r.compare(lambda: f"{describe(seq)}, after step {i - 1}", {"steps": (len(theirs), len(ours))},
                             lambda *_: explain_as)
        pairs = step_pairs(theirs[i], ours[i], theirs[i - 1] if i else None, ours[i - 1] if i else None)
        if not r.compare(lambda: f"{describe(seq)}, step {i}", pairs, lambda *_: explain_as):
            return False
        if explain_as and any(a != b for a, b in pairs.values()):
            return True  # one explained difference a stream: what follows comes from it
    return True


def compare_sequence(up, seq, out: dict[str, RuleResult], cache=None) -> bool:
    """One stream through both (module docstring); True when nothing unexplained differs. Async
    scheduling runs synchronously in both (the AsyncScheduler is not driven)."""
    r = out["scheduler"]
    seq = replace(seq, async_scheduling=False)
    try:
        theirs = VllmScheduler(up, seq, token, draft, cache=cache).batches()
    except Exception as e:  # a configuration vLLM refuses at start-up: no run of it to compare
        r.refuse(f"{describe(seq)}: {type(e).__name__}: {e}")
        return True
    ours = seq.batches()
    if seq.block_size is None:
        return _steps(r, seq, theirs, ours)
    ample = mirror_batches(seq)
    return _steps(r, seq, theirs, ample) and _steps(r, seq, ample, ours, "pool size")


def run(up, seqs, rules=None, cache=None) -> list[RuleResult]:
    """Every stream of `seqs` (with a block size or a threshold only against `ALIGN_RELEASE`: against
    another release, those without a block size with the threshold off); `rules`, the profile's
    control rules, the scheduler does not read; `cache` holds the embedded checkpoint."""
    out = results()
    for seq in seqs:
        if up.version == ALIGN_RELEASE:
            compare_sequence(up, seq, out, cache)
        elif seq.block_size is None:  # the threshold's eligibility is 0.33.0's: the stream runs without one
            compare_sequence(up, replace(seq, long_prefill_token_threshold=0), out, cache)
    return list(out.values())
