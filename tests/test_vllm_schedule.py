"""vLLM's V1 scheduler driven by a suite sequence (`repro.upstream.schedule`): every `StepBatch` field
filled from vLLM's own decisions, the sequence's kept counts, finishes and preemptions honoured, a
preemption of vLLM's own when the KV blocks run out, and the resumed recompute's last chunk."""
import pytest

from repro.scheduler.sequence import Request, Sequence
from repro.scheduler.tokens import draft, token
from repro.upstream import load as upstream

MISSING = upstream.why_not()
pytestmark = [pytest.mark.conformance, pytest.mark.skipif(MISSING is not None, reason=MISSING or "")]
CASES = [(0, None), (0, 4), (2, None), (2, 4)]


def _sequence(k, block, dp=False):
    acc = [1, 2] if k else None
    return Sequence([Request(0, 11, 3, accept=acc), Request(1, 5, 2, arrive=1, preempt_after=1),
                     Request(2, 6, 1, arrive=2, prefix_of=0, prefix_len=5), Request(3, 2, 1, arrive=12 if dp else 3)],
                    num_slots=4, max_tokens=8, spec_tokens=k, block_size=block, data_parallel=dp, tail_dummies=int(dp))


def _run(seq, **kw):
    from repro.upstream.schedule import VllmScheduler
    s = VllmScheduler(upstream.load(), seq, token, draft, **kw)
    return s, s.batches()


def _rows(batches):
    """(step, rid, computed, query, prompt, prefill, drafts, tokens) of every row, in order."""
    out = []
    for b in batches:
        at = 0
        for i, rid in enumerate(b.request_ids):
            q = b.query_lens[i]
            out.append((b.step, rid, b.num_computed[i], q, b.prompt_lens[i], b.prefills()[i], b.draft_lens[i],
                        b.token_ids[at:at + q]))
            at += q
    return out


@pytest.mark.parametrize("k,block", CASES)
def test_every_field_comes_from_vllm_and_the_sequence_is_kept(k, block, cache):
    seq = _sequence(k, block)
    sched, batches = _run(seq)
    reqs = {r.rid: r for r in seq.requests}
    for b in batches:
        n = b.num_reqs
        assert b.num_tokens == sum(b.query_lens) and len(b.slots) == n and b.has_initial_state == [c > 0 for c in b.num_computed]
        assert all(len(x) == n for x in (b.num_computed, b.prompt_lens, b.draft_lens, b.num_accepted, b.blocks))
        assert (b.block_size, b.state_cols is not None, b.prev_cols is not None) == (block, bool(block), bool(block))
        assert all(b.slots[i] in b.blocks[i] for i in range(n))
    admitted, decodes, last = {}, {}, {}
    for step, rid, c, q, p, pre, d, ids in _rows(batches):
        r = reqs[rid]
        for j, t in enumerate(ids[:q - d]):  # known tokens: the prompt's (a shared prefix: the other's), or sampled
            pos = c + j
            if pos < p:
                assert t == token(seq.seed, r.prefix_of if pos < r.prefix_len else rid, pos, seq.vocab)
            else:
                assert t in (token(seq.seed, rid, pos, seq.vocab), draft(seq.seed, rid, pos, seq.vocab))
        # drafts: the suite's, or on a first chunk padded to 1+K the scheduler's placeholders (clamped to 0)
        assert ids[q - d:] == ([0] * d if c < pre else [draft(seq.seed, rid, c + q - d + j, seq.vocab) for j in range(d)])
        if c < pre:  # a prefill chunk: (re)admitted where its count of decodes restarts
            if admitted.get(rid) != pre:
                admitted[rid], decodes[rid] = pre, 0
            continue
        if k and r.accept and rid in last:  # each decode keeps the accept list's next count
            assert c - last[rid] == r.accept[(decodes[rid] - 1) % len(r.accept)]
        decodes[rid] += 1
        last[rid] = c
    assert all(decodes[r.rid] == r.decode_steps for r in seq.requests)
    # request 1 is preempted after one decode and recomputes its prompt, its first token and the 1+K kept
    resumed = [row for row in _rows(batches) if row[1] == 1 and row[5] != row[4]]
    assert resumed and resumed[0][5] == 5 + 1 + (1 + k)
    first = next(row[0] for row in _rows(batches) if row[1] == 1 and row[2] >= row[5])
    assert 1 in batches[first + 1].finished
    assert not sched.sched.has_unfinished_requests()


def test_an_idle_data_parallel_rank_runs_dummy_steps(cache):
    _, batches = _run(_sequence(2, 4, dp=True))
    dummies = [b for b in batches if b.dummy]
    assert len(dummies) >= 2 and batches[-1].dummy and all(not b.request_ids for b in dummies)
    assert [b.step for b in batches] == list(range(len(batches)))


def test_vllm_preempts_by_itself_when_the_kv_blocks_run_out(cache):
    """No preemption asked for: with few blocks, `schedule()` evicts the last running request."""
    seq = Sequence([Request(i, 12, 6, arrive=0) for i in range(3)], num_slots=3, max_tokens=16, spec_tokens=2)
    _, ample = _run(seq)
    _, tight = _run(seq, num_blocks=14)
    resumed = lambda batches: {row[1] for row in _rows(batches) if row[5] != row[4]}
    assert not resumed(ample) and resumed(tight), "vLLM preempted nothing when the blocks ran out"
    rows = _rows(tight)
    assert all(sum(1 for r in rows if r[1] == i and r[2] >= r[5]) >= 6 for i in range(3))


def _recompute_chunk(batches, k):
    """(step, computed, prompt) of the first resumed request's last recompute chunk when it is exactly
    1+K tokens past its prompt (vLLM PR #53059's hole), else None."""
    for step, rid, c, q, p, pre, d, _ in _rows(batches):
        if pre != p and c + q == pre and c >= p and q == 1 + k and d == 0:
            return step, c, p
    return None


# The smallest streams (one request, the chunk at the earliest step, then the smallest prompt and budget)
# in which vLLM 0.33.0's V1 scheduler ends a resumed recompute in a chunk of exactly 1+K tokens past the
# prompt, K = 2: a prompt of 2 (3 with block 4), one decode keeping all 3 tokens, then the preemption;
# the recompute is the prompt, the first sampled token and the 3 kept (6 tokens; 7), in chunks of the
# budget of 3, or from the request's own cached block (a prefix hit at 3 or 4 tokens) in one chunk.
SMALLEST = [(None, 2, (3, 3, 2)), (3, 2, (2, 3, 2)), (4, 3, (2, 4, 3))]


@pytest.mark.parametrize("block,prompt,chunk", SMALLEST, ids=["no-block", "block3", "block4"])
def test_a_resumed_recompute_ends_in_a_chunk_of_1_plus_k_past_its_prompt(block, prompt, chunk, cache):
    seq = Sequence([Request(0, prompt, 2, preempt_after=1)], num_slots=1, max_tokens=3, spec_tokens=2,
                   block_size=block)
    _, batches = _run(seq)
    assert _recompute_chunk(batches, 2) == chunk
    at = batches[chunk[0]]
    assert (at.query_lens, at.draft_lens, at.prefill_lens) == ([3], [0], [prompt + 1 + 3])


@pytest.mark.parametrize("block,prompt,chunk", SMALLEST, ids=["no-block", "block3", "block4"])
def test_no_smaller_single_request_stream_ends_so(block, prompt, chunk, cache):
    if block == 4 and upstream.installed() != "0.33.0":
        pytest.skip(f"vLLM {upstream.installed()}'s scheduler never finishes a block-4 stream with a step budget of 3 "
                    "(the search's smallest budget); the bound is 0.33.0's")
    found = []
    for budget in (3, 4, 5):
        for p in range(1, 7):
            for acc in (None, [2], [1]):
                seq = Sequence([Request(0, p, 2, preempt_after=1, accept=acc)], num_slots=1, max_tokens=budget,
                               spec_tokens=2, block_size=block)
                at = _recompute_chunk(_run(seq)[1], 2)
                if at:
                    found.append((at[0], p, budget))
    assert min(found) == (chunk[0], prompt, 3)
