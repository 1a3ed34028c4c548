"""`xpu_semantics` (`kernels/gdn/xpu_semantics.py`): vllm-xpu-kernels' `gdn_attention`, rule by rule
(the numbers are `kernels/gdn/xpu_rules.py`'s).

Where its rules agree with the composition of the per-piece ops (`reference` of `repro::gdn_attention`,
vLLM's CUDA path: live rows, real blocks), outputs and states equal it and the independent float64
recurrence (`kernels/gdn/naive.py`); where they do not (padding, the null block, -1, spec columns),
each test states the XPU outcome beside the composition's. Outputs of the decode recurrence differ
from the composition's only in the last bits: the semantics sum with the `torch` provider's
batch-invariant tree, the composition here with the reference's matmul (`TOL`)."""
import pytest
import torch

from kernels import registry
from kernels.errors import KernelRefused
from kernels.gdn.naive import gated_delta_rule_recurrent
from kernels.gdn.reference import gdn_gating_reference
from kernels.gdn.core import head_dims, split_qkv
from kernels.conv1d.reference import causal_conv1d_fn_reference
from kernels.ops import gdn_attention
from kernels.samples import gdn_core_args

TOL = dict(atol=1e-6, rtol=1e-5)  # fp32 sums in another order (module docstring); observed <= 3e-8


def run(provider, **batch):
    """gdn_attention under `provider` (the pieces on `reference`): (core_out, conv_state, ssm_state, args)."""
    args = gdn_core_args(seed=5, **batch)
    with registry.using(all="reference", gdn_attention=provider):
        gdn_attention(*args)
    return args[0], args[7], args[8], args


def blocks_changed(before, after) -> list[int]:
    return [s for s in range(before.shape[0]) if not torch.equal(before[s], after[s])]


def initial(batch):
    """(conv_state, ssm_state) as a batch's call finds them."""
    args = gdn_core_args(seed=5, **batch)
    return args[7], args[8]


DECODES = dict(T=3, num_decodes=3, num_actual_tokens=3, num_decode_tokens=3, non_spec_query_start_loc=[0, 1, 2, 3],
               non_spec_state_indices=[2, 5, 1])
PREFILLS = dict(T=9, num_decodes=1, num_prefills=2, num_actual_tokens=9, num_decode_tokens=1, num_prefill_tokens=8,
                non_spec_query_start_loc=[0, 1, 4, 9], non_spec_state_indices=[3, 5, 1],
                has_initial_state=[True, True, False])


@pytest.mark.parametrize("batch", [DECODES, PREFILLS], ids=["decodes", "decode and prefills"])
def test_live_rows_agree_with_the_composition(batch):
    """Real blocks, no padding: the XPU rules and vLLM's CUDA path give the same outputs and states."""
    x_out, x_conv, x_ssm, _ = run("xpu_semantics", **batch)
    r_out, r_conv, r_ssm, _ = run("reference", **batch)
    assert torch.equal(x_conv, r_conv)
    torch.testing.assert_close(x_ssm, r_ssm, **TOL)
    torch.testing.assert_close(x_out.float(), r_out.float(), atol=2 ** -8, rtol=2 ** -8)  # bf16 of the fp32 above


def test_prefills_agree_with_the_token_by_token_recurrence():
    """The XE2 chunked path (rule 5) against the independent float64 recurrence, from the conv
    output the reference conv gives."""
    out, _, ssm, args = run("xpu_semantics", **PREFILLS)
    before = gdn_core_args(seed=5, **PREFILLS)
    qkv, b, a, w, A_log, dt_bias, conv0, ssm0 = before[1:9]
    qsl, idx, init = before[16], before[18], before[15]
    y = causal_conv1d_fn_reference(qkv, w, conv0.clone(), qsl, idx, init, -2)
    Hk, dk, Hv, dv = head_dims(qkv, ssm0)
    q, k, v = split_qkv(y, Hk, dk, Hv, dv)
    g, beta = gdn_gating_reference(A_log, a, dt_bias, b)
    o, cache = gated_delta_rule_recurrent(q, k, v.float(), g, beta, ssm0, qsl, idx, init, -2)
    torch.testing.assert_close(out.float(), o.float(), atol=2e-2, rtol=2e-2)  # out is bf16
    torch.testing.assert_close(ssm, cache.float(), atol=2e-5, rtol=1e-4)      # test_kernels_gdn's chunked tolerance


PADDED = dict(T=4, num_decodes=4, num_actual_tokens=4, num_decode_tokens=4, non_spec_query_start_loc=[0, 1, 2, 2, 2],
              non_spec_state_indices=[3, 5, 0, 0])


def test_a_padded_decode_on_the_null_block_writes_block_0():
    """Rules 3-4: two live rows and two padded rows on the null block (vLLM 0.33's FULL padding). The
    composition skips index 0; the XPU conv kernel skips only -1, and the two tokens past every row's
    end belong to the last row (index 0): block 0's conv window is written. The live rows are the
    same either way."""
    conv0, ssm0 = initial(PADDED)
    x_out, x_conv, x_ssm, _ = run("xpu_semantics", **PADDED)
    r_out, r_conv, r_ssm, _ = run("reference", **PADDED)
    assert blocks_changed(conv0, r_conv) == [3, 5] and blocks_changed(ssm0, r_ssm) == [3, 5]
    assert blocks_changed(conv0, x_conv) == [0, 3, 5]
    # the recurrence steps no token of the padded rows: they write block 0 back as they read it
    assert blocks_changed(ssm0, x_ssm) == [3, 5]
    assert torch.equal(x_conv[[3, 5]], r_conv[[3, 5]])
    torch.testing.assert_close(x_out[:2].float(), r_out[:2].float(), atol=2 ** -8, rtol=2 ** -8)


def test_num_actual_tokens_bounds_the_conv_launch():
    """Rule 2: the token grid is num_actual_tokens long; with 2 there are no stray tokens, so block 0
    is not written, and output rows past it keep what they held."""
    x_out, x_conv, _, args = run("xpu_semantics", **{**PADDED, "num_actual_tokens": 2})
    conv0, _ = initial(PADDED)
    assert blocks_changed(conv0, x_conv) == [3, 5]
    assert not x_out[2:].any()


def test_a_stray_token_on_a_live_row_races_and_is_refused():
    """Rule 4 again, with no padded row: the stray token belongs to the last live row, whose own token
    writes the same block in the same launch; the device's order decides, so it is refused."""
    batch = dict(T=3, num_decodes=2, num_actual_tokens=3, non_spec_query_start_loc=[0, 1, 2],
                 non_spec_state_indices=[2, 4])
    with pytest.raises(KernelRefused, match=r"causal_conv1d_kernel: token 1, token 2 write block 4"):
        run("xpu_semantics", **batch)


@pytest.mark.parametrize("where", ["decode", "spec"])
def test_minus_one_reaching_a_recurrence_is_refused(where):
    """Rule 3: only the conv kernels know -1; the recurrence would read ssm_state[-1]."""
    batch = {**PADDED, "non_spec_state_indices": [3, 5, -1, -1]} if where == "decode" else dict(
        T=4, spec_k=1, num_spec_decodes=2, num_actual_tokens=4, spec_query_start_loc=[0, 2, 2],
        spec_state_indices=[[1, 2], [-1, -1]], num_accepted_tokens=[1, 1], spec_token_indx=[0, 1, 2, 3])
    with pytest.raises(KernelRefused, match=r"ssm_state\[-1\]"):
        run("xpu_semantics", **batch)
    run("reference", **{**batch, "sentinel": -1})  # the composition skips the sentinel it is given


SPEC = dict(T=6, spec_k=2, num_spec_decodes=2, num_actual_tokens=6, spec_query_start_loc=[0, 3, 6],
            spec_state_indices=[[1, 2, 3], [4, 5, 6]], spec_token_indx=[0, 1, 2, 3, 4, 5])


def test_spec_rows_agree_from_column_0_and_keep_their_conv_per_column_block():
    """Rule 7: with one accepted token both start from column 0's block, and outputs and the states of
    every column agree; the conv window after token t lands in column t's block (the composition
    keeps every window in column 0's block, at an offset)."""
    batch = {**SPEC, "num_accepted_tokens": [1, 1]}
    x_out, x_conv, x_ssm, _ = run("xpu_semantics", **batch)
    r_out, r_conv, r_ssm, _ = run("reference", **batch)
    conv0, _ = initial(batch)
    torch.testing.assert_close(x_out.float(), r_out.float(), atol=2 ** -8, rtol=2 ** -8)
    torch.testing.assert_close(x_ssm, r_ssm, **TOL)
    assert blocks_changed(conv0, r_conv) == [1, 4] and blocks_changed(conv0, x_conv) == [1, 2, 3, 4, 5, 6]


def test_spec_rows_are_always_1_plus_k_tokens():
    """Rule 7: a row's query length is not read; a batch whose spec rows are shorter fails the
    kernel's own count check."""
    short = {**SPEC, "T": 5, "num_actual_tokens": 5, "spec_query_start_loc": [0, 3, 5], "num_accepted_tokens": [1, 1],
             "spec_token_indx": [0, 1, 2, 3, 4]}
    with pytest.raises(KernelRefused, match=r"spec_token == num_spec_decodes \* \(num_speculative_tokens \+ 1\)"):
        run("xpu_semantics", **short)


def test_a_zero_length_row_beside_a_prefill_is_refused():
    """Rule 4: the state update after a launch with prefills writes every row whose length is not 1,
    a zero-length row's never-filled buffer included."""
    batch = {**PREFILLS, "non_spec_query_start_loc": [0, 1, 4, 4], "num_prefill_tokens": 3}
    with pytest.raises(KernelRefused, match="never filled"):
        run("xpu_semantics", **batch)


def test_has_initial_state_false_starts_a_decode_row_from_zeros():
    """Rule 6: given (vLLM gives it only with prefills), a false entry zeroes the loaded state; not
    given, every row loads its block."""
    given = run("xpu_semantics", **{**DECODES, "has_initial_state": [True, False, True]})
    absent = run("xpu_semantics", **DECODES)
    assert torch.equal(given[2][2], absent[2][2]) and not torch.equal(given[2][5], absent[2][5])


def test_spec_rows_beside_prefills_agree_with_the_composition():
    """Rule 1: the spec group, then the non-spec group, each on its own tokens (by index)."""
    batch = dict(T=7, spec_k=1, num_spec_decodes=1, num_prefills=2, num_actual_tokens=7, num_prefill_tokens=5,
                 spec_query_start_loc=[0, 2], spec_state_indices=[[5, 6]], num_accepted_tokens=[1],
                 spec_token_indx=[0, 1], non_spec_token_indx=[2, 3, 4, 5, 6], non_spec_query_start_loc=[0, 3, 5],
                 non_spec_state_indices=[2, 3], has_initial_state=[True, False])
    x_out, x_conv, x_ssm, _ = run("xpu_semantics", **batch)
    r_out, r_conv, r_ssm, _ = run("reference", **batch)
    torch.testing.assert_close(x_out.float(), r_out.float(), atol=2 ** -8, rtol=2 ** -8)
    torch.testing.assert_close(x_ssm, r_ssm, **TOL)
    assert torch.equal(x_conv[[2, 3]], r_conv[[2, 3]])  # the prefills' windows; the spec row's: per column


@pytest.mark.parametrize("tokens", [7, 8])
def test_a_stray_token_beside_prefills_races_below_8_tokens_and_is_dropped_from_8(tokens):
    """Rules 4 and 5: past every row's end, the untiled XE2 conv (fewer than 8 tokens) gives the token to
    the last row, writing that prefill's block in place while the row's first tokens read it: a race,
    refused. From 8 tokens the tiled kernel drops it: the call equals one without it."""
    lens = [tokens - 3, 2]
    batch = dict(T=tokens, num_prefills=2, num_actual_tokens=tokens, num_prefill_tokens=tokens - 1,
                 non_spec_query_start_loc=[0, lens[0], lens[0] + lens[1]], non_spec_state_indices=[2, 4],
                 has_initial_state=[True, True])
    if tokens < 8:
        with pytest.raises(KernelRefused, match="write block 4, which .* reads"):
            run("xpu_semantics", **batch)
    else:
        without = run("xpu_semantics", **{**batch, "num_actual_tokens": tokens - 1})
        with_stray = run("xpu_semantics", **batch)
        assert all(torch.equal(a, b) for a, b in zip(with_stray[:3], without[:3]))


def test_a_decode_row_rounds_otherwise_beside_a_prefill():
    """Rule 5: a prefill in the launch sends the decode rows through the chunked kernel too, so their
    bits may differ from a decode-only launch's (declared batch-variant); the values agree."""
    decode = dict(T=9, num_decodes=1, num_actual_tokens=1, num_decode_tokens=1, non_spec_query_start_loc=[0, 1],
                  non_spec_state_indices=[3])  # PREFILLS' first row alone (the same inputs: same seed and shapes)
    alone = run("xpu_semantics", **decode)
    beside = run("xpu_semantics", **PREFILLS)
    torch.testing.assert_close(beside[2][3], alone[2][3], **TOL)
    assert not torch.equal(beside[2][3], alone[2][3])  # chunked vs step by step: another rounding (here)
    assert not registry.batch_invariant("gdn_attention", "xpu_semantics")
