"""Block-aligned prefix caching of GDN state (vLLM's mamba_cache_mode "align", `--block-size N`):
each rule as vLLM 0.33.0's source states it, then the property that matters: with a block size,
replay equals eager bit for bit and the third copy agrees, over hundreds of steps in which prefix
hits occur."""
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from repro.control.batch import StepBatch
from repro.control.builder import Common, GDNMetadataBuilder
from repro.control.prefix import copy_states, forward_copies, running_column, state_block_columns
from repro.errors import BadInput
from repro.graphs import make_provider
from repro.islands import Model
from repro.job.cases import Case, default_sequence, run_case
from repro.scheduler.prefix import BlockPool, aligned_chunk, saved_boundary
from repro.scheduler.sequence import Request, Sequence
from repro.search.strategies import sequences
from repro.capture.runner import EagerRunner
from tests.refusals import refused

BS = 4


def prefix_hits(batches) -> int:
    """Rows that start a request (new, or back after a preemption) with tokens already computed:
    only a prefix hit does that."""
    hits, active = 0, set()
    for b in batches:
        active -= set(b.finished)
        for j, rid in enumerate(b.request_ids):
            if rid not in active and b.num_computed[j] > 0:
                hits += 1
            active.add(rid)
    return hits


# -- the rules, as vLLM states them -----------------------------------------------------------------

def test_running_column_is_seq_len_minus_one_over_the_block_size():
    """preprocess_mamba: curr = cdiv(num_computed + num_scheduled, block_size) - 1."""
    for s in range(1, 40):
        assert running_column(s, BS) == (s - 1) // BS
    assert running_column(0, BS) == -1  # a new request's previous column
    seq = default_sequence(3, 80, block_size=BS)
    for b in seq.batches():
        for c, q, col, row, slot in zip(b.num_computed, b.query_lens, b.state_cols, b.blocks, b.slots):
            assert col == (c + q - 1) // BS and len(row) == col + 1 and row[col] == slot


def test_the_forward_copy_across_a_block_boundary():
    """conv from block[prev] at offset accepted-1, SSM from block[prev + accepted - 1], into block[curr];
    the accepted count becomes 1; nothing where the column stays or nothing was computed."""
    b = StepBatch([1, 2, 3], [6, 5, 9], [1, 1, 4], [True, True, False], [0] * 6, num_computed=[8, 5, 0],
                  prompt_lens=[4, 4, 4], num_accepted=[3, 1, 1], blocks=[[0, 4, 6, 8, 7], [0, 5], [9]],
                  block_size=BS, state_cols=[2, 1, 0], prev_cols=[1, 1, -1])
    copies, accepted = forward_copies(b)
    assert [(c.dst, c.conv_src, c.conv_offset, c.ssm_src) for c in copies] == [(6, 4, 2, 8)]
    assert accepted == [1, 1, 1]
    conv = torch.arange(10 * 2 * 5, dtype=torch.float32).reshape(10, 2, 5)
    ssm = torch.arange(10 * 3, dtype=torch.float32).reshape(10, 3)
    before = conv.clone()
    copy_states(conv, ssm, copies)
    assert torch.equal(conv[6, :, :3], before[4, :, 2:]) and torch.equal(ssm[6], ssm[8])
    assert torch.equal(conv[4], before[4])  # the source is read, not moved
    none = StepBatch([1], [1], [1], [True], [0], num_computed=[3], prompt_lens=[1])
    assert forward_copies(none) == ([], [1])  # no block size: mode "none", no copy


def test_a_mid_prompt_chunk_is_floored_to_a_block_boundary_the_last_chunk_exempt():
    """_mamba_block_aligned_split: end < prefill_end floors to a boundary; the prompt's last chunk keeps
    its end; a chunk clipped to nothing waits unless the block is wider than the budget."""
    assert aligned_chunk(0, 10, 20, BS, 16) == 8  # a first chunk ending mid-block
    assert aligned_chunk(16, 4, 20, BS, 16) == 4  # the last chunk: 16..20, exempt
    assert aligned_chunk(16, 3, 19, BS, 16) == 3  # exempt though 19 is no boundary
    assert aligned_chunk(9, 2, 20, BS, 16) == 0  # would end at 11: floored to 8 < start
    assert aligned_chunk(0, 16, 100, 32, 16) == 16  # a block wider than the budget advances within it
    assert aligned_chunk(16, 16, 100, 32, 16) == 16  # ... and stops at its boundary (32)
    assert aligned_chunk(20, 5, 21, BS, 16) == 5 and aligned_chunk(30, 1, 20, BS, 16) == 1  # the last; a decode
    assert aligned_chunk(0, 10, 10, BS, 16) == 8  # one chunk would skip the last boundary before the end
    # the scheduler's chunks of a prompt longer than the budget end on boundaries, but the last
    seq = Sequence([Request(0, 37, 1)], max_tokens=10, block_size=BS)
    ends = [c + q for b in seq.batches() for c, q in zip(b.num_computed, b.query_lens)]
    assert ends[:-2] and all(e % BS == 0 for e in ends[:-2]) and ends[-2] == 37


def test_a_prefix_hit_starts_at_its_blocks_from_the_cached_block():
    """find_longest_cache_hit: the last cached block i of the request's tokens, [null]*i + [cached],
    (i+1)*block_size tokens computed; then the copy moves it to the running column."""
    reqs = [Request(0, 13, 2), Request(1, 15, 2, arrive=8, prefix_of=0, prefix_len=13)]
    bs = Sequence(reqs, num_slots=2, block_size=BS).batches()
    filled = next(b for b in bs if 0 in b.request_ids and b.num_computed[0] + b.query_lens[0] == 12)
    cached = filled.slots[0]  # request 0's block holding its state after 12 tokens
    first = next(b for b in bs if 1 in b.request_ids)
    j = first.request_ids.index(1)
    assert first.num_computed[j] == 12 and first.prev_cols[j] == 2 and first.state_cols[j] == 3
    assert first.blocks[j][:3] == [0, 0, cached] and first.has_initial_state[j]
    assert prefix_hits(bs) == 1
    pool = BlockPool([1, 2, 3])
    pool.cache(tuple(range(8)), 2)
    assert pool.longest_hit(list(range(9)), BS) == (1, 2)
    assert pool.longest_hit(list(range(8)), BS) == (0, None) or pool.longest_hit(list(range(8)), BS)[1] is None


def test_the_builder_gathers_1_plus_k_columns_from_the_running_column():
    """mamba_get_block_table_tensor ("align"): columns (seq_len-1)//block_size .. +K, clamped at 0."""
    blocks = np.array([[0, 3, 4, 5, 6, 0], [7, 8, 9, 0, 0, 0], [0, 0, 0, 0, 0, 0]], dtype=np.int32)
    seq_lens = np.array([6, 1, 0])
    assert state_block_columns(blocks, seq_lens, 3, BS).tolist() == [[3, 4, 5], [7, 8, 9], [0, 0, 0]]
    q = np.array([3, 3, 0], dtype=np.int32)
    c = Common(q, seq_lens - q.clip(max=seq_lens), np.zeros(3, bool), np.array([2, 2, -1], np.int32),
               np.array([1, 2, 1], np.int32), blocks, 6, BS)
    meta = GDNMetadataBuilder(2, 4, "cpu", full_graphs=False, pad=0).build(c)
    assert meta.spec_state_indices.tolist() == [[3, 4, 5], [7, 8, 9]]
    c0 = Common(np.array([1], np.int32), np.array([4], np.int32), np.zeros(1, bool), np.array([-1], np.int32),
                np.ones(1, np.int32), blocks[:1], 1, BS)
    assert GDNMetadataBuilder(0, 4, "cpu", full_graphs=False, pad=0).build(c0).non_spec_state_indices.tolist() == [3]


def test_refusals_name_the_field():
    with pytest.raises(BadInput, match=r"requests\[1\].prefix_of"):
        Sequence.from_json({"requests": [{"rid": 0, "prompt_len": 4, "decode_steps": 1},
                                         {"rid": 1, "prompt_len": 4, "decode_steps": 1, "prefix_of": 5, "prefix_len": 2}]})
    with pytest.raises(BadInput, match=r"requests\[0\].prefix_len"):
        Sequence.from_json({"requests": [{"rid": 0, "prompt_len": 4, "decode_steps": 1, "prefix_len": 2}]})
    with pytest.raises(BadInput, match="block_size 2 with spec_tokens 2: a block must be wider"):
        Sequence.from_json({"requests": [{"rid": 0, "prompt_len": 4, "decode_steps": 1}], "block_size": 2,
                            "spec_tokens": 2})
    step = {"step": 0, "request_ids": [0], "slots": [1], "query_lens": [1], "has_initial_state": [False],
            "token_ids": [3], "post_copies": [[1, 2, 3, 4]]}
    with pytest.raises(BadInput, match=r"steps\[0\].post_copies\[0\]\[2\]: 3 is out of range 0..2"):
        Sequence.from_json({"steps": [step], "block_size": 4, "spec_tokens": 2})
    with pytest.raises(BadInput, match="block_size: 0 is out of range"):
        Sequence.from_json({"requests": [{"rid": 0, "prompt_len": 4, "decode_steps": 1}], "block_size": 0})


def test_a_sequence_with_a_block_size_round_trips_and_one_without_writes_no_new_key():
    seq = default_sequence(1, 60, block_size=BS)
    again = Sequence.from_json(seq.to_json())
    assert [b.to_json() for b in again.batches()] == [b.to_json() for b in seq.batches()]
    plain = default_sequence(1, 60).to_json()
    keys = {k for s in plain["steps"] for k in s} | {k for r in plain["requests"] for k in r} | set(plain)
    assert not keys & {"block_size", "state_cols", "prev_cols", "prefix_of", "prefix_len"}


def test_the_cli_refuses_a_bad_block_size(capsys):
    refused(capsys, ["run", "--block-size", "0", "--device", "cpu"], "--block-size")
    refused(capsys, ["run", "--block-size", "2", "--spec-tokens", "2", "--device", "cpu", "--steps", "2"],
            "--block-size 2 with --spec-tokens 2", "wider than the draft tokens")
    refused(capsys, ["bench", "--block-size", "4", "--device", "cpu"], "--block-size", "--hunt-rates")


def test_a_spec_decode_saves_the_block_boundary_its_kept_tokens_reached():
    """postprocess_mamba_fused_kernel: running = computed+1 tokens, new = computed+kept; the last
    boundary `aligned` <= new, if >= running, is saved from window token aligned-running into column
    aligned//block_size - 1; into the running column itself the next step reads from its start."""
    assert saved_boundary(5, 3, BS) == (2, 1)  # 6..8 kept: the state after 8 tokens, window token 2
    assert saved_boundary(3, 1, BS) == (0, 0)  # the bonus token fills block 0
    assert saved_boundary(3, 3, BS) == (0, 0)  # ... whatever the drafts do
    assert saved_boundary(4, 3, BS) is None  # 5..7: no boundary reached
    assert saved_boundary(6, 1, BS) is None and saved_boundary(6, 2, BS) == (1, 1)
    # the scheduler: request 0 (prompt 5, K = 2, every draft kept) decodes 5..7 and keeps them all,
    # reaching 8 in its running column 1, whose block then holds window token 2's state: a copy in
    # place, its accepted count 1 for the next step, which copies column 1 on to column 2
    seq = Sequence([Request(0, 5, 3, accept=[3])], spec_tokens=2, block_size=BS)
    steps = seq.batches()
    first, nxt = next((i, b) for i, b in enumerate(steps) if b.draft_lens == [2])[1], None
    i = steps.index(first)
    nxt = steps[i + 1]
    run = first.blocks[0][first.state_cols[0]]
    assert first.num_computed == [5] and first.state_cols == [1]
    assert nxt.post_copies == [[run, run, 2, first.blocks[0][3]]] and nxt.num_accepted == [1]
    assert nxt.prev_cols == [1] and nxt.state_cols == [2]
    copies, accepted = forward_copies(nxt)
    assert [(c.dst, c.conv_src, c.conv_offset, c.ssm_src) for c in copies][0] == (run, run, 2, first.blocks[0][3])
    assert accepted == [1] and copies[1].conv_src == run and copies[1].conv_offset == 0


def test_a_window_moves_its_left_behind_speculative_blocks_forward():
    """allocate_new_blocks / _relocate_speculative_block: the speculative blocks a moved window left
    behind fill its new columns, so a move takes one new block from the pool however far it goes."""
    moves = 0
    for accept in ([3], [1, 3, 2]):
        seq = Sequence([Request(0, 3, 8, accept=accept)], spec_tokens=2, block_size=BS)
        steps = [b for b in seq.batches() if b.draft_lens == [2]]
        for a, b in zip(steps, steps[1:]):
            ca, cb, ra, rb = a.state_cols[0], b.state_cols[0], a.blocks[0], b.blocks[0]
            if ca == cb:
                assert ra[ca:] == rb[cb:]  # the same window (the column before it may be let go)
                continue
            moves += 1
            behind = [ra[j] for j in range(ca + 1, ca + 3) if j < cb]
            window = rb[cb:]
            assert set(behind) <= set(window) and len(set(window)) == 3, (ra, rb)
            assert len(set(window) - set(ra)) == 1, (ra, rb)  # one block from the pool
    assert moves >= 4


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(st.integers(0, 3).flatmap(lambda k: sequences(max_requests=6, max_tokens=8, num_slots=3, max_prompt=20,
                                                      spec_tokens=k, block_size=4)))
def test_drawn_sequences_with_a_block_size_schedule_and_their_steps_pass_the_schema(seq):
    """What `repro hunt --block-size 4` draws at K = 0..3 schedules, and every step it makes (rows,
    running columns, boundary copies) is one the sequence schema accepts."""
    steps = seq.batches()
    again = Sequence.from_json({**seq.to_json(), "steps": [b.to_json() for b in steps]})
    assert [b.to_json() for b in again.batches()] == [b.to_json() for b in steps]
    if seq.spec_tokens:
        assert all(r.accept is None or all(1 <= a <= 1 + seq.spec_tokens for a in r.accept) for r in seq.requests)


# -- the copies: a hit's state is the state its prefix computed, and replay equals eager ----------

@pytest.fixture(scope="module")
def setup(tiny_path, device):
    provider = make_provider(device)
    return Model(tiny_path, provider.device), provider


def test_a_hit_continues_from_the_state_its_prefix_computed(setup):
    """Request 1 repeats request 0's 13 prompt tokens and hits its block of 12; after its first step
    its running block holds what computing its whole prompt from nothing gives (up to rounding)."""
    model, _ = setup
    reqs = [Request(0, 13, 1), Request(1, 15, 1, arrive=8, prefix_of=0, prefix_len=13)]
    aligned = Sequence(reqs, num_slots=2, block_size=BS)
    plain = Sequence(reqs, num_slots=2)
    states = []
    for seq in (aligned, plain):
        copy = model.copy(num_slots=seq.copy_slots())
        runner = EagerRunner(copy)
        for b in seq.batches():
            runner.step(b)
            if 1 in b.request_ids and b.num_computed[b.request_ids.index(1)] + b.query_lens[0] >= 15:
                slot = b.slots[b.request_ids.index(1)]
                states.append((copy.cache.ssm[slot].clone(), copy.cache.conv[slot].clone()))
                break
    (ssm_a, conv_a), (ssm_p, conv_p) = states
    assert torch.allclose(ssm_a, ssm_p, rtol=1e-2, atol=1e-3) and torch.allclose(conv_a.float(), conv_p.float())
    assert prefix_hits(aligned.batches()) == 1


def _resumed_state(model, seq):
    """Eager over `seq` up to the step that ends request 0's recompute after its preemption (a chunk of
    one token left after a hit is padded to 1+K with placeholder drafts): that step, and the state
    its running block then holds (SSM, conv)."""
    copy = model.copy(num_slots=seq.copy_slots(), spec_tokens=seq.spec_tokens)
    runner = EagerRunner(copy)
    preempted = False
    for b in seq.batches():
        runner.step(b)
        preempted |= 0 in b.finished
        if preempted and b.request_ids == [0]:
            c, end = b.num_computed[0], b.num_computed[0] + b.query_lens[0] - b.draft_lens[0]
            if c < b.prefills()[0] <= end:  # its recompute's last chunk
                return b, (copy.cache.ssm[b.slots[0]].clone(), copy.cache.conv[b.slots[0]].clone())
    raise AssertionError("request 0 was not recomputed")


@pytest.mark.parametrize("accept", [[3], [3, 1, 2], [2, 3]])
def test_a_preempted_request_resumes_from_the_boundary_state_its_spec_decodes_saved(setup, accept):
    """K = 2: request 0 decodes with drafts, is preempted, and comes back from the last cached block
    of its own tokens, a block its decodes' boundary copies (`post_copies`) filled; after the
    recompute its state is what recomputing everything from nothing gives (up to rounding)."""
    model, _ = setup
    reqs = [Request(0, 5, 6, preempt_after=3, accept=accept)]
    aligned = Sequence(reqs, spec_tokens=2, block_size=BS)
    steps = aligned.batches()
    b, (ssm_a, conv_a) = _resumed_state(model, aligned)
    _, (ssm_p, conv_p) = _resumed_state(model, Sequence(reqs, spec_tokens=2))
    saved = {c[0] for s in steps[:steps.index(b) + 1] for c in s.post_copies}
    resumed = next(s for s in steps if 0 in s.finished)  # the step after the preemption: back from its hit
    hit_block = resumed.blocks[0][resumed.num_computed[0] // BS - 1]
    assert prefix_hits(steps) == 1 and resumed.num_computed[0] > 5 and hit_block in saved  # past its prompt
    # the conv window: its last width-1 tokens; the K columns after them are what a spec decode
    # writes before it reads them (a decode after a prefill reads from offset accepted-1 = 0)
    w = model.cfg.linear_conv_kernel_dim - 1
    assert torch.allclose(ssm_a, ssm_p, rtol=1e-2, atol=1e-3)
    assert torch.allclose(conv_a[..., :w].float(), conv_p[..., :w].float())


@pytest.mark.parametrize("mode, k", [("piecewise", 0), ("full_and_piecewise", 0), ("full_and_piecewise", 2)])
def test_with_a_block_size_replay_equals_eager_and_the_third_copy_agrees(setup, mode, k):
    model, provider = setup
    seq = default_sequence(0, 200, spec_tokens=k, block_size=BS)
    batches = seq.batches()
    assert len(batches) == 200 and prefix_hits(batches) > 0
    assert any(p != c for b in batches for p, c in zip(b.prev_cols, b.state_cols) if p >= 0)  # copies happen
    assert bool(k) == any(b.post_copies for b in batches)  # boundary copies with drafts only
    r = run_case(model, provider, Case("chain", mode, spec_tokens=k, block_size=BS), seq, reference_every=1)
    assert r.steps == 200 and not r.diverged and not r.findings, (r.first_divergence, r.findings)
    assert r.to_json()["block_size"] == BS


def test_a_dummy_reads_a_finished_rows_block_only_where_column_0_holds_one():
    """With a block size a finished request's retired columns are the null block: an idle rank's dummy
    run (which reads column 0) reaches the stale-row trigger only through a row that still holds one."""
    from repro.job.triggers import _finished_row
    short = [Request(0, 3, 1)]  # never leaves column 0
    long = [Request(0, 9, 1)]  # its column 0 is retired
    fin = StepBatch([], [], [], [], [], dummy=True)
    for reqs, expect in ((short, True), (long, False)):
        steps = Sequence(reqs, block_size=BS).batches()
        fin.finished = [0]
        assert _finished_row(steps + [fin]) is expect


def test_run_with_a_block_size_exits_0_on_the_default_plan(capsys, tiny_path):
    """`repro run --block-size 4`: every case with prefix caching (K = 0, and the K = 2 rows), each
    live hazard found."""
    from repro.cli import main
    rc = main(["run", "--model", tiny_path, "--device", "cpu", "--block-size", str(BS), "--steps", "40",
               "--mode", "full"])
    assert rc == 0, capsys.readouterr()


@pytest.mark.parametrize("which", ["eager", "graph"])
def test_a_dummy_step_makes_the_boundary_copies_its_previous_step_queued(setup, which):
    """vLLM saves a spec decode's block-boundary state at the end of the step that kept its tokens
    (`vllm/v1/worker/gpu_model_runner.py: GPUModelRunner._update_states_after_model_execute` ->
    `postprocess_mamba_align_gpu`), whatever the rank runs next. The rebuild queues those copies for
    the next step (`post_copies`), so an idle rank's dummy step makes them, in every copy: the block
    holds the boundary state a later prefix hit reads."""
    from repro.capture.runner import GraphRunner
    model, provider = setup
    copy = model.copy(num_slots=2, spec_tokens=2)
    g = torch.Generator().manual_seed(1)
    for t in copy.cache.tensors().values():
        t.copy_(torch.randn(t.shape, generator=g).to(t.dtype))
    before = {k: v.clone() for k, v in copy.cache.tensors().items()}
    runner = EagerRunner(copy) if which == "eager" else GraphRunner(copy, provider, "full_and_piecewise")
    dst, conv_src, offset, ssm_src = 3, 1, 1, 2
    runner.step(StepBatch([], [], [], [], [], dummy=True, block_size=BS, post_copies=[[dst, conv_src, offset, ssm_src]]))
    conv, ssm = copy.cache.conv, copy.cache.ssm
    w = conv.shape[-1] - offset
    assert torch.equal(conv[dst, :, :w], before["conv_state"][conv_src, :, offset:])
    assert torch.equal(ssm[dst], before["ssm_state"][ssm_src])
    others = [b for b in range(len(ssm)) if b != dst]
    assert torch.equal(ssm[others], before["ssm_state"][others])  # the dummy run itself wrote nothing
