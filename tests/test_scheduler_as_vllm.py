"""Rules of vLLM 0.33.0's V1 scheduler that running it beside the mirror showed (`repro conform`'s
scheduler family, `repro/upstream/compare/scheduler.py`), each stated here on the mirror alone: the
streams are those whose steps vLLM's own `Scheduler` makes (`tests/test_vllm_schedule.py` runs it)."""
from repro.scheduler.prefix import aligned_chunk
from repro.scheduler.sequence import Request, Sequence


def _steps(seq):
    return [(b.query_lens, b.num_computed, b.prefill_lens, b.draft_lens) for b in seq.batches()]


def test_a_resume_recomputes_every_token_the_request_holds_the_last_sampled_one_too():
    """`Scheduler._preempt_request` sets num_computed_tokens to 0 and `schedule()` then schedules
    `num_tokens - num_computed_tokens`: the prompt, the first sampled token and every token kept
    since, the bonus token of the last decode included (it is known, not yet computed). Prompt 2,
    one decode keeping its 3 tokens, a budget of 3: 6 tokens in chunks of 3 and 3, the last exactly
    1+K past the prompt (vLLM PR #53059's hole), then decodes from 6."""
    seq = Sequence([Request(0, 2, 2, preempt_after=1)], num_slots=1, max_tokens=3, spec_tokens=2)
    assert _steps(seq) == [([2], [0], None, [0]), ([3], [2], None, [2]), ([3], [0], [6], [0]), ([3], [3], [6], [0]),
                           ([3], [6], [6], [2]), ([3], [9], [6], [2])]
    # with a block size the request's own cached block (3 tokens) starts the resume: one chunk, 3..6
    seq.block_size = 3
    assert _steps(seq)[2:4] == [([3], [3], [6], [0]), ([3], [6], [6], [2])]


def test_a_recompute_chunk_ending_one_token_short_of_its_end_is_not_floored():
    """`_mamba_block_aligned_split`: chunks are floored to block boundaries before `prefill_end =
    max(num_prompt_tokens, num_tokens - 1)`; a resumed request's last token is its last sampled one,
    so a recompute chunk ending just before it is exempt as a prompt's last chunk is (block 4,
    prompt 5, 10 tokens held: 8..9 is kept), where a 10-token prompt's chunk 8..9 is floored to nothing."""
    assert aligned_chunk(8, 1, 10, 4, 16, num_prompt=5) == 1
    assert aligned_chunk(8, 1, 10, 4, 16) == 0


def test_a_waiting_prompt_is_chunked_to_the_budget_left():
    """`Scheduler.schedule`'s waiting loop schedules `min(num_tokens - num_computed_tokens, budget
    left)` while budget is left: a prompt that would fit a later step whole is not held back."""
    seq = Sequence([Request(0, 6, 1), Request(1, 5, 1)], num_slots=2, max_tokens=8)
    assert _steps(seq)[:2] == [([6, 2], [0, 0], None, [0, 0]), ([1, 3], [6, 2], None, [0, 0])]


def test_a_prefix_shared_past_the_cached_states_stops_the_chunk_at_its_junction():
    """`KVCacheManager.get_computed_blocks`: the attention layers cache every full block computed, the
    state layers only the blocks their chunks end on; a request whose tokens match more blocks than
    any cached state covers gets that longer match as its `shared_prefix_boundary`, and
    `_mamba_block_aligned_split` ends its chunk there (block-floored) so the state at the junction is
    cached for the next sibling. Request 0's first chunk (16 tokens, block 4) caches a state only at
    16; request 1 repeats its first 10 tokens: 8 tokens of full blocks, no state hit, so its first
    chunk stops at 8, not at the last boundary before its end (12)."""
    seq = Sequence([Request(0, 20, 2), Request(1, 15, 1, arrive=2, prefix_of=0, prefix_len=10)], num_slots=2,
                   max_tokens=16, block_size=4)
    assert _steps(seq)[2:5] == [([1, 8], [20, 0], None, [0, 0]), ([1, 4], [21, 8], None, [0, 0]),
                                ([3], [12], None, [0])]
