"""Each rule of the decode control path, stated as vLLM 0.33.0's source states it (`repro/control/`
cites the file and function each mirrors): the uniform-decode decision, graph modes, capture sizes
and the dispatcher, the persistent batch and its block table, and the GDN metadata builder."""
import numpy as np
import pytest
import torch

from repro.control.batch import StepBatch
from repro.control.builder import Common, GDNMetadataBuilder, common_for, draft_counts, split_non_spec
from repro.control.dispatch import (DEFAULT_SIZES, BatchDescriptor, Dispatcher, capture_sizes, configured_sizes,
                                    default_capture_sizes, uniform_decode)
from repro.control.input_batch import InputBatch
from repro.knobs.modes import MODES, Runtime, mode_name, parse_mode
from repro.errors import BadInput
from repro.knobs.options import ControlRules, FirstChunk, UniformDecode
from repro.knobs.stacks import stack
from repro.control.shape import StepShape

K = 2  # draft tokens a decode carries: a uniform decode query is 1+K = 3 tokens
ROWS = 4 * (1 + K)  # `decode_cudagraph_max_bs` of 4 sequences and capture sizes up to 12 (`staging_rows`)


# ---- the uniform-decode decision (GPUModelRunner._is_uniform_decode) ----------------------------
def test_a_chunk_of_1_plus_k_tokens_of_a_request_in_its_prompt_is_not_uniform_decode():
    assert not uniform_decode(UniformDecode.PAST_PROMPT, [3], [True], K)
    assert not uniform_decode(UniformDecode.NO_HYBRID_PREFILL, [3, 3], [False, True], K)


def test_by_shape_alone_the_same_chunk_is_uniform_decode():
    assert uniform_decode(UniformDecode.SHAPE, [3], [True], K)
    assert uniform_decode(UniformDecode.SHAPE, [3, 3], [True, False], K)


def test_uniform_decode_needs_every_query_at_1_plus_k():
    for rule in UniformDecode:
        assert uniform_decode(rule, [3, 3, 3], [False] * 3, K)
        assert not uniform_decode(rule, [3, 1], [False, False], K)
        assert not uniform_decode(rule, [2, 2], [False, False], K)
        assert not uniform_decode(rule, [], [], K)


# ---- graph modes (CUDAGraphMode, resolve_cudagraph_mode_and_sizes) -------------------------------
def test_a_mode_is_a_pair_of_decode_and_mixed_runtime_modes():
    assert (MODES["FULL_AND_PIECEWISE"].decode, MODES["FULL_AND_PIECEWISE"].mixed) == (Runtime.FULL, Runtime.PIECEWISE)
    assert (MODES["FULL_DECODE_ONLY"].decode, MODES["FULL_DECODE_ONLY"].mixed) == (Runtime.FULL, Runtime.NONE)
    assert MODES["FULL_AND_PIECEWISE"].separate_routine and not MODES["FULL"].separate_routine


def test_full_on_a_uniform_batch_backend_resolves_to_full_and_piecewise_and_any_case_parses():
    assert parse_mode("full").name == "FULL_AND_PIECEWISE" and mode_name("FULL") == "full_and_piecewise"
    assert parse_mode("full_and_piecewise").name == "FULL_AND_PIECEWISE"
    assert parse_mode("Full_Decode_Only").name == "FULL_DECODE_ONLY"
    assert parse_mode("piecewise").name == "PIECEWISE" and parse_mode("none").name == "NONE"
    with pytest.raises(BadInput, match="unknown mode"):
        parse_mode("fullish")


# ---- capture sizes and the dispatcher (CudagraphDispatcher) -----------------------------------------
def test_capture_sizes_are_rounded_up_to_multiples_of_1_plus_k_under_a_full_decode_mode():
    assert capture_sizes((1, 2, 4, 8, 16), parse_mode("full"), K) == (3, 6, 9)
    assert capture_sizes((1, 2, 4, 8, 16), parse_mode("piecewise"), K) == (1, 2, 4, 8, 16)
    assert capture_sizes((1, 2, 4, 8, 16), parse_mode("full"), 0) == (1, 2, 4, 8, 16)


def test_the_default_capture_list_is_vllms_grid_under_its_ceilings():
    """`_set_cudagraph_sizes`: 1, 2, 4, steps of 8, then of 16, up to min(max_num_seqs*(1+k)*2, 512)
    and the step budget; the budget itself and the uniform-decode sizes n*(1+k) are added."""
    assert default_capture_sizes(8, 16, 0) == DEFAULT_SIZES
    big = default_capture_sizes(256, 8192, 0)
    assert big == (1, 2, 4, *range(8, 256, 8), *range(256, 513, 16))
    assert default_capture_sizes(4, 16, 0) == (1, 2, 4, 8)  # the ceiling is 4 * 2, under the budget
    assert default_capture_sizes(8, 12, 0) == (1, 2, 4, 8, 12)  # the budget is the ceiling, captured
    assert default_capture_sizes(8, 16, K) == (1, 2, 3, 4, 6, 8, 12, 16)  # 3, 6, 12: 1, 2, 4 decodes
    assert default_capture_sizes(8, 48, K) == (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 40, 48)
    spec = default_capture_sizes(256, 8192, 1)  # decode sizes 2n reach 512 only through the request grid
    assert 2 * 248 in spec and 2 * 256 in spec and 2 * 250 not in spec and max(spec) == 512


def test_the_default_list_rounded_for_drafts_covers_every_step_when_the_budget_allows():
    full = parse_mode("full")
    assert capture_sizes(default_capture_sizes(8, 16, K), full, K) == (3, 6, 9, 12)  # 18 is over 16: dropped
    assert capture_sizes(default_capture_sizes(8, 48, K), full, K) == (3, 6, 9, 12, 18, 24, 33, 42, 48)


def test_vllm_0_26_adds_no_uniform_decode_sizes_to_the_default_list():
    """0.26.0's `_set_cudagraph_sizes` has the token grid and the budget alone: 3, 6 and 12 (1, 2 and 4
    decodes at K = 2) are 0.33.0's (`ControlRules.decode_capture_sizes`, False in the vllm-0.26 profile)."""
    assert default_capture_sizes(8, 16, K, decode_sizes=False) == (1, 2, 4, 8, 16)
    assert default_capture_sizes(5, 64, 0, decode_sizes=False) == (1, 2, 4, 8)  # 0.33.0 adds 5 (max_num_seqs)
    assert default_capture_sizes(5, 64, 0) == (1, 2, 4, 5, 8)
    assert not stack("vllm-0.26").rules.decode_capture_sizes and stack("vllm-0.33-mrv1").rules.decode_capture_sizes


def test_configured_sizes_above_the_step_budget_are_dropped_as_vllm_drops_them():
    """`_set_cudagraph_sizes` keeps a configured size only when a step can hold it (<= the budget):
    a 10-token step under [1, 2, 64] with a 16-token budget runs eagerly, it is not padded to 64."""
    assert configured_sizes((64, 1, 2, 2), 8, 16, 0) == (1, 2)
    assert configured_sizes(None, 8, 16, 0) == default_capture_sizes(8, 16, 0)
    d = Dispatcher(parse_mode("piecewise"), configured_sizes((1, 2, 64), 8, 16, 0), StepShape(0, 8))
    assert d.dispatch(10, False) == (Runtime.NONE, BatchDescriptor(10))
    assert Dispatcher(parse_mode("full"), configured_sizes((64,), 8, 16, K), StepShape(K, 8)).keys == {}  # nothing to capture


def test_a_uniform_full_key_exists_for_n_times_1_plus_k_tokens():
    d = Dispatcher(parse_mode("full_and_piecewise"), (1, 2, 4, 8, 16), StepShape(K, 8))
    for n in (1, 2, 3):
        assert d.keys[BatchDescriptor(3 * n, n, True)] is Runtime.FULL
    assert BatchDescriptor(3) in d.keys and d.keys[BatchDescriptor(3)] is Runtime.PIECEWISE  # relaxed


def test_dispatch_tries_the_exact_full_key_then_the_relaxed_piecewise_key_then_eager():
    d = Dispatcher(parse_mode("full_and_piecewise"), (1, 2, 4, 8, 16), StepShape(K, 8))
    assert d.dispatch(6, True) == (Runtime.FULL, BatchDescriptor(6, 2, True))
    assert d.dispatch(5, False) == (Runtime.PIECEWISE, BatchDescriptor(6))  # padded to 6, relaxed key
    assert d.dispatch(10, False) == (Runtime.NONE, BatchDescriptor(10))  # above the largest size
    only = Dispatcher(parse_mode("full_decode_only"), (1, 2, 4, 8, 16), StepShape(K, 8))
    assert only.dispatch(6, True)[0] is Runtime.FULL and only.dispatch(5, False) == (Runtime.NONE, BatchDescriptor(5))
    assert Dispatcher(parse_mode("none"), (1, 2), StepShape(0, 8)).dispatch(1, True) == (Runtime.NONE, BatchDescriptor(1))


def test_full_uniform_keys_stop_at_1_plus_k_times_max_num_seqs():
    d = Dispatcher(parse_mode("full_and_piecewise"), (1, 2, 4, 8, 16), StepShape(K, 2))
    assert BatchDescriptor(6, 2, True) in d.keys and BatchDescriptor(9, 3, True) not in d.keys


# ---- the persistent batch (InputBatch, BlockTable) ------------------------------------------------
def test_a_vacated_block_table_row_is_the_null_block_after_condense():
    ib = InputBatch(4, 1 + K, 0)
    ib.update([(10, [1, 2, 3]), (11, [4, 5, 6]), (12, [7, 8, 9])])
    ib.update([(10, [1, 2, 3]), (12, [7, 8, 9])])  # 11 finished: 12 (the last row) moves into its row
    assert ib.row_of == {10: 0, 12: 1}
    assert ib.table[1].tolist() == [7, 8, 9] and ib.table[2].tolist() == [0, 0, 0]


def test_without_the_fix_move_row_leaves_the_vacated_row_as_it_was():
    ib = InputBatch(4, 1, 0, ControlRules(move_row_zeroes_source=False))
    ib.update([(10, [1]), (11, [4]), (12, [7])])
    ib.update([(10, [1]), (12, [7])])
    assert ib.table[2].tolist() == [7]  # a stale duplicate of a live request's blocks


def test_a_finished_request_row_is_cleared_unless_the_rule_keeps_it():
    for clear, want in ((True, [0]), (False, [4])):
        ib = InputBatch(4, 1, 0, ControlRules(clear_finished_row=clear))
        ib.update([(10, [1]), (11, [4])])
        ib.update([(10, [1])])  # 11 was the last row: nothing moves
        assert ib.table[1].tolist() == want


def test_a_new_request_takes_the_lowest_hole_and_commit_copies_only_the_first_rows():
    ib = InputBatch(4, 1, 0)
    ib.update([(1, [1]), (2, [2]), (3, [3])])
    ib.commit(3)
    ib.update([(2, [2]), (3, [3]), (4, [5])])  # 1 leaves row 0: 4 takes it
    assert ib.row_of[4] == 0
    ib.commit(1)
    assert ib.committed[:3, 0].tolist() == [5, 2, 3]
    ib.update([])
    assert ib.committed[:3, 0].tolist() == [5, 2, 3]  # rows reach the device only when committed


def test_update_removes_first_then_adds_new_requests_before_resumed_ones():
    """`GPUModelRunner._update_states` removes every unscheduled request, and a resumed one still in
    the batch, before it adds any; it adds `scheduled_new_reqs` first, then the resumed requests, each
    taking the lowest hole (`InputBatch.add_request`)."""
    ib = InputBatch(4, 1, 0)
    ib.update([(1, [1]), (2, [2]), (3, [3])])
    ib.update([(3, [3])])  # 1 and 2 leave; condense moves 3 to row 0
    ib.update([(3, [3]), (1, [4]), (5, [5])])  # 1 resumed, 5 new: 5 takes the lowest hole first
    assert ib.row_of == {3: 0, 5: 1, 1: 2}
    ib = InputBatch(4, 1, 0)
    ib.update([(1, [1])])
    ib.update([(1, [2]), (6, [6])])  # 1 rescheduled with another block leaves before 6 is added
    assert ib.row_of == {6: 0, 1: 1}


# ---- the GDN metadata builder (GDNAttentionMetadataBuilder) ----------------------------------------
def _common(q, computed, prompts, drafts, accepted, blocks, tokens=None):
    q = np.asarray(q, dtype=np.int32)
    computed = np.asarray(computed, dtype=np.int32)
    return Common(q, computed, computed < np.asarray(prompts), np.asarray(drafts, dtype=np.int32),
                  np.asarray(accepted, dtype=np.int32), np.asarray(blocks, dtype=np.int32),
                  int(q.sum()) if tokens is None else tokens)


def test_draft_counts_mark_prefill_chunks_minus_one_and_zero_draft_decodes_zero():
    assert draft_counts([3, 3, 1, 1], [2, 0, 0, 0], [5, 0, 7, 0], [2, 4, 3, 1]).tolist() == [2, -1, 0, -1]


def test_vllm_0_26_leaves_a_zero_draft_decode_a_non_spec_row():
    """0.26.0's `_prepare_inputs` has no zero-draft lines: a one-token row past its prompt stays -1."""
    old = ControlRules(zero_draft_spec_row=False)
    assert draft_counts([3, 3, 1, 1], [2, 0, 0, 0], [5, 0, 7, 0], [2, 4, 3, 1], old).tolist() == [2, -1, -1, -1]


def test_the_builder_leaves_its_buffers_untouched_for_a_batch_with_a_prefill():
    b = GDNMetadataBuilder(K, ROWS, "cpu", full_graphs=True, pad=0)
    b.build(_common([3, 3], [5, 6], [2, 2], [2, 2], [1, 3], [[1, 2, 3], [4, 5, 6]]))  # staged: all spec
    staged = (b.spec_state_indices.clone(), b.spec_query_start_loc.clone(), b.num_accepted_tokens.clone())
    meta = b.build(_common([3, 3], [5, 0], [2, 3], [2, -1], [2, 1], [[7, 8, 9], [10, 11, 12]]))
    assert meta.num_prefills == 1 and meta.num_spec_decodes == 1
    assert torch.equal(b.spec_state_indices, staged[0]) and torch.equal(b.spec_query_start_loc, staged[1])
    assert torch.equal(b.num_accepted_tokens, staged[2])


def test_staging_pads_indices_with_the_null_block_start_locations_with_the_last_and_accepted_with_one():
    b = GDNMetadataBuilder(K, ROWS, "cpu", full_graphs=True, pad=0)
    b.spec_state_indices.fill_(9)
    meta = b.build(_common([3, 0, 0], [5, 0, 0], [2, 0, 0], [2, -1, -1], [2, 1, 1], [[1, 2, 3], [0] * 3, [0] * 3], 9))
    assert meta.spec_state_indices.tolist() == [[1, 2, 3], [0, 0, 0], [0, 0, 0]]
    assert meta.spec_query_start_loc.tolist() == [0, 3, 3, 3] and meta.num_accepted_tokens.tolist() == [2, 1, 1]
    assert meta.spec_state_indices.data_ptr() == b.spec_state_indices.data_ptr()  # the persistent buffer


def test_a_builder_without_full_graphs_never_stages():
    b = GDNMetadataBuilder(K, ROWS, "cpu", full_graphs=False, pad=0)
    meta = b.build(_common([3], [5], [2], [2], [2], [[1, 2, 3]]))
    assert meta.spec_state_indices.data_ptr() != b.spec_state_indices.data_ptr()
    assert b.spec_state_indices.abs().sum() == 0


def test_the_capture_build_makes_every_row_a_spec_row_that_kept_all_its_tokens():
    b = GDNMetadataBuilder(K, ROWS, "cpu", full_graphs=True, pad=0)
    meta = b.build_for_capture(_common([3, 3], [0, 0], [9, 9], [-1, -1], [1, 1], [[0] * 3, [0] * 3]))
    assert meta.num_spec_decodes == 2 and meta.num_prefills == 0
    assert meta.num_accepted_tokens.tolist() == [3, 3] and meta.spec_state_indices.abs().sum() == 0


def test_a_one_token_first_chunk_is_a_prefill_and_a_resumed_one_token_chunk_a_decode():
    c = _common([1, 1, 1], [4, 0, 2], [1, 1, 5], [-1, -1, -1], [1, 1, 1], [[1], [2], [3]])
    assert split_non_spec(c, FirstChunk.IS_PREFILLING) == 1  # the first chunk (row 1) is a prefill
    assert split_non_spec(c, FirstChunk.QUERY_LEN) == 3  # 0.26.0: every one-token row a decode
    resumed = _common([1, 1], [4, 2], [1, 5], [-1, -1], [1, 1], [[1], [3]])
    assert split_non_spec(resumed, FirstChunk.IS_PREFILLING) == 2


def test_beside_spec_rows_a_one_token_non_spec_row_goes_to_the_prefill_kernel():
    b = GDNMetadataBuilder(K, ROWS, "cpu", full_graphs=True, pad=0)
    meta = b.build(_common([3, 1], [5, 0], [2, 1], [2, -1], [3, 1], [[1, 2, 3], [4, 5, 6]]))
    assert (meta.num_spec_decodes, meta.num_decodes, meta.num_prefills) == (1, 0, 1)
    assert meta.spec_token_indx.tolist() == [0, 1, 2] and meta.non_spec_token_indx.tolist() == [3]
    assert meta.non_spec_state_indices.tolist() == [4] and meta.spec_state_indices.tolist() == [[1, 2, 3]]


def test_common_for_reads_a_step_as_the_runner_does():
    b = StepBatch([1, 2], [1, 4], [3, 3], [True, False], list(range(6)), num_computed=[5, 0], prompt_lens=[2, 3],
                  draft_lens=[2, 0], num_accepted=[2, 1], blocks=[[1, 2, 3], [4, 5, 6]])
    c = common_for(b, np.asarray(b.blocks, dtype=np.int32), pad_rows=1)
    assert c.query_lens.tolist() == [3, 3, 0] and c.drafts.tolist() == [2, -1, -1]
    assert c.prefilling.tolist() == [False, True, False] and c.accepted.tolist() == [2, 1, 1]


# ---- the fixed stack's uniform-decode rule (vLLM PR #51865) against PR #53059's ------------------
def _resumed_recompute_tail():
    """A preempted request (prompt 8) resumed: its recompute covers the prompt and the 9 tokens it
    kept, and this step is the recompute's last chunk, 3 = 1+K tokens, from 14 computed."""
    return StepBatch([7], [1], [3], [True], [1, 2, 3], num_computed=[14], prompt_lens=[8], prefill_lens=[17],
                     draft_lens=[0], num_accepted=[1])


def test_a_resumed_requests_last_recompute_chunk_of_1_plus_k_is_uniform_under_53059_not_under_51865():
    from repro.control.dispatch import prefilling
    b = _resumed_recompute_tail()
    assert uniform_decode(UniformDecode.PAST_PROMPT, b.query_lens, prefilling(UniformDecode.PAST_PROMPT, b), K)
    assert uniform_decode(UniformDecode.NO_HYBRID_PREFILL, b.query_lens,
                          prefilling(UniformDecode.NO_HYBRID_PREFILL, b), K)
    assert not uniform_decode(UniformDecode.PHASE_AWARE, b.query_lens, prefilling(UniformDecode.PHASE_AWARE, b), K)
    assert ControlRules().uniform_decode is UniformDecode.PHASE_AWARE  # the fixed stack's form


def test_the_phase_aware_rule_keeps_a_one_token_row_over_context_and_holds_a_first_chunk():
    """`gather_batch_req_state`: a prefilling row of one new token over existing context stays
    eligible for the decode graph; a one-token first chunk (nothing computed) does not."""
    from repro.control.dispatch import prefilling
    mid = StepBatch([1, 2], [1, 2], [1, 1], [True, True], [5, 6], num_computed=[4, 9], prompt_lens=[6, 9])
    first = StepBatch([1, 2], [1, 2], [1, 1], [False, True], [5, 6], num_computed=[0, 9], prompt_lens=[6, 9])
    rule = UniformDecode.PHASE_AWARE
    assert uniform_decode(rule, mid.query_lens, prefilling(rule, mid), 0)
    assert not uniform_decode(UniformDecode.PAST_PROMPT, mid.query_lens, prefilling(UniformDecode.PAST_PROMPT, mid), 0)
    assert not uniform_decode(rule, first.query_lens, prefilling(rule, first), 0)


def test_a_spec_only_batch_carries_its_token_map_as_vllm_builds_it():
    """`GDNAttentionMetadataBuilder.build`'s spec-only branch: spec_token_indx =
    arange(min(num_spec_decodes * (1+k), tokens)) (the XPU kernel reads it; the CUDA path does not),
    staged into the persistent buffer for a FULL graph; a short row leaves it shorter."""
    b = GDNMetadataBuilder(K, 6, "cpu", full_graphs=True, pad=0)  # decode_cudagraph_max_bs 6: the 6 tokens fit
    meta = b.build(_common([3, 3, 0], [5, 6, 0], [2, 2, 0], [2, 2, -1], [1, 3, 1], [[1, 2, 3], [4, 5, 6], [0] * 3], 6))
    assert meta.spec_token_indx.tolist() == list(range(6))
    assert meta.spec_token_indx.data_ptr() == b.spec_token_indx.data_ptr()  # the persistent buffer
    eager = GDNMetadataBuilder(K, 4, "cpu", full_graphs=False, pad=0)
    short = eager.build(_common([3, 1], [5, 6], [2, 2], [2, 0], [1, 1], [[1, 2, 3], [4, 5, 6]]))
    assert short.num_spec_decodes == 2 and short.spec_token_indx.tolist() == [0, 1, 2, 3]
