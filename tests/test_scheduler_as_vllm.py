"""Rules of vLLM 0.33.0's V1 scheduler that running it beside the mirror showed (`repro conform`'s
scheduler family, `repro/conform/scheduler.py`), each stated here on the mirror alone: the
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


def test_running_requests_go_in_the_order_they_came_and_the_last_decode_takes_what_budget_is_left():
    """`Scheduler.schedule` takes `self.running` in order, each `min(num_tokens_with_spec -
    num_computed_tokens, budget left)`: a decode whose 1+K tokens do not fit gets its drafts cut
    (K=2, budget 5: request 1's decode at step 3 is its token and one draft)."""
    seq = Sequence([Request(0, 4, 5), Request(1, 4, 5)], num_slots=2, max_tokens=5, spec_tokens=2)
    assert _steps(seq)[:4] == [([4, 1], [0, 0], None, [0, 0]), ([3, 2], [4, 1], None, [2, 0]),
                               ([3, 1], [7, 3], None, [2, 0]), ([3, 2], [10, 4], None, [2, 1])]


def test_a_decode_the_budget_left_no_drafts_takes_no_kept_count_of_the_list():
    """A decode cut to its one token is no spec decode (nothing to verify): request 1's first decode
    (step 1, beside request 0's) keeps its token, and its `accept` list starts at its next one."""
    seq = Sequence([Request(0, 1, 1), Request(1, 1, 3, accept=[2, 3])], num_slots=2, max_tokens=4, spec_tokens=2)
    assert [s[1] for s in _steps(seq)] == [[0, 0], [1, 1], [2], [4]]


def test_a_one_token_first_chunk_beside_decodes_is_padded_to_1_plus_k():
    """`Scheduler.schedule` ("Pad new decode requests to uniform spec decoding size"): a waiting
    request with one token to compute, beside running decodes and no running chunk, is scheduled
    1+K tokens, its K drafts placeholders (-1, which the runner clamps to 0); it keeps its one token."""
    seq = Sequence([Request(0, 3, 3), Request(1, 1, 2, arrive=1)], num_slots=2, max_tokens=8, spec_tokens=2)
    b = seq.batches()[1]
    assert (b.request_ids, b.query_lens, b.num_computed, b.draft_lens) == ([0, 1], [3, 3], [3, 0], [2, 2])
    assert b.token_ids[3:] == [b.token_ids[3], 0, 0] and seq.batches()[2].num_computed == [6, 1]


def test_a_preempted_request_goes_back_to_the_front_of_the_queue():
    """`Scheduler._preempt_request`: `waiting.prepend_request`. Request 0, preempted after its first
    decode, resumes at step 2 ahead of request 2, which arrived then (budget 4)."""
    seq = Sequence([Request(0, 2, 3, preempt_after=1), Request(1, 4, 2, arrive=1), Request(2, 4, 1, arrive=2)],
                   num_slots=3, max_tokens=4)
    b = seq.batches()[2]
    assert (b.request_ids, b.query_lens, b.num_computed, b.prefill_lens) == ([1, 0], [1, 3], [3, 0], [4, 4])


def test_rows_come_in_the_runners_order():
    """`GPUModelRunner._update_states` puts a new request into the row a finished one left, then
    `reorder_batch_to_split_decodes_and_prefills` moves it behind the decodes by swapping it with
    the last decode: request 3 takes request 0's row 0, then swaps with request 2."""
    seq = Sequence([Request(0, 1, 1), Request(1, 1, 3), Request(2, 1, 3), Request(3, 1, 1, arrive=2)], num_slots=4)
    assert [b.request_ids for b in seq.batches()][:3] == [[0, 1, 2], [0, 1, 2], [2, 1, 3]]


def test_a_request_back_in_the_runners_batch_reads_one_accepted_token():
    """A request not scheduled in a step leaves the runner's persistent batch (`_update_states`);
    `InputBatch.add_request` brings it back with `num_accepted_tokens` 1, whatever its last decode
    kept. K=1, block 8, budget 5: request 0, preempted and resumed behind request 1's long prompt,
    decodes at step 8 (keeps 2), gets no budget at step 9, and reads 1 at step 10."""
    seq = Sequence([Request(0, 1, 3, preempt_after=1), Request(1, 40, 1, arrive=1)], num_slots=2, max_tokens=5,
                   spec_tokens=1, block_size=8)
    steps = seq.batches()
    assert [0 in b.request_ids for b in steps[8:11]] == [True, False, True]
    assert steps[10].num_computed[0] - steps[8].num_computed[0] == 2 and steps[10].num_accepted[0] == 1


def test_a_hit_on_a_block_cached_in_the_same_step_waits_for_the_next():
    """`MambaManager.get_num_blocks_to_allocate`: a request whose longest hit ends on a block cached
    in the step being scheduled is not scheduled in it ("Mamba can't rely on blocks generated by
    other requests in the current step"); the next step it starts from that block."""
    seq = Sequence([Request(0, 5, 1), Request(1, 5, 1, prefix_of=0, prefix_len=5)], num_slots=2, block_size=4)
    assert [(b.request_ids, b.num_computed) for b in seq.batches()[:2]] == [([0], [0]), ([0, 1], [4, 4])]


def test_the_blocks_a_spec_decode_kept_are_cached_when_its_output_comes_back():
    """`Scheduler.update_from_output` caches the blocks a spec decode's kept tokens fill
    (`cache_blocks`), before any next step: request 1, preempted right after the decode that filled
    its third block (12 tokens), resumes from it."""
    seq = Sequence([Request(0, 1, 5), Request(1, 10, 2, preempt_after=1, accept=[3, 1], prefix_of=0, prefix_len=1)],
                   num_slots=4, max_tokens=8, spec_tokens=2, block_size=4)
    b = seq.batches()[4]
    assert b.request_ids == [0, 1] and b.num_computed == [10, 12] and b.prefill_lens == [1, 14]


def test_a_finishing_decode_saves_the_boundary_its_kept_tokens_reached():
    """`postprocess_mamba_fused_kernel` runs on every row of the step, a request's last decode too:
    request 0's decode at 6 keeps its 3 tokens (to 9), past the boundary at 8, whose state is copied
    into column 1 (from the running column 2, one token in); the copy rides the next step."""
    seq = Sequence([Request(0, 6, 1), Request(1, 1, 1, arrive=4)], num_slots=1, max_tokens=8, spec_tokens=2,
                   block_size=4)
    prev, b = seq.batches()[2:4]
    dst, src, offset, ssm = b.post_copies[0]
    assert len(b.post_copies) == 1 and offset == 1
    assert [prev.blocks[0].index(x) for x in (dst, src, ssm)] == [1, 2, 3]
