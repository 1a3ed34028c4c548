"""MoE: torch == reference bit for bit with W8A8 experts (both the gathered and the per-expert
regime, ties in the router), bf16 experts to bf16 matmul tolerance, and an independent
per-token formulation of the reference."""
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

from kernels import registry
from kernels.moe.vectorized import SPARSE_PAIRS_PER_EXPERT
from kernels.ops import moe, moe_block, quantize_per_token
from kernels.samples import moe_args
from repro.model.weights import Experts, Linear, MoEWeights


def _both(args):
    out = {}
    for provider in ("reference", "torch"):
        with registry.using(moe=provider):
            out[provider] = moe(*args)
    return out["reference"], out["torch"]


@settings(max_examples=40, deadline=None)
@given(T=st.integers(1, 12), E=st.integers(2, 10), top_k=st.integers(1, 4), I=st.sampled_from([4, 8, 12]),
       Is=st.sampled_from([4, 8]), H=st.sampled_from([8, 16, 24]), renormalize=st.booleans(),
       ties=st.booleans(), seed=st.integers(0, 999))
def test_torch_equals_reference_w8a8(T, E, top_k, I, Is, H, renormalize, ties, seed):
    top_k = min(top_k, E)
    args = list(moe_args(torch.Generator().manual_seed(seed), T=T, H=H, E=E, I=I, Is=Is, top_k=top_k,
                         quantized=True, renormalize=renormalize))
    if ties:                                     # duplicated router rows: equal probabilities
        router = args[1].clone()
        router[1::2] = router[0::2][: router[1::2].shape[0]]
        args[1] = router
    ref, fast = _both(args)
    assert fast.dtype == torch.bfloat16 and fast.shape == (T, H)
    assert torch.equal(ref, fast)


@settings(max_examples=20, deadline=None)
@given(T=st.integers(1, 12), E=st.integers(2, 10), top_k=st.integers(1, 4), seed=st.integers(0, 999))
def test_the_stacked_down_projection_equals_the_per_expert_one(T, E, top_k, seed):
    """An accelerator's down projection (one `_int_mm` of every pair against all experts) gives the
    per-expert form's bits: the same integers, the same epilogue; only the launch count differs."""
    from kernels.moe.vectorized import _down_per_expert, _down_stacked
    top_k = min(top_k, E)
    g = torch.Generator().manual_seed(seed)
    act = torch.randn(T, top_k, 16, generator=g).bfloat16()
    w2 = torch.randint(-127, 128, (E, 24, 16), generator=g, dtype=torch.int8)
    s2 = torch.rand(E, 24, generator=g) / 100
    ids = torch.stack([torch.randperm(E, generator=g)[:top_k] for _ in range(T)])
    assert torch.equal(_down_stacked(act, w2, s2, ids), _down_per_expert(act, w2, s2, ids))


def test_both_regimes_are_exercised_and_exact():
    E, top_k = 8, 2
    for T in (1, 5):                             # 2 pairs -> gathered, 10 pairs -> per expert
        gathered = T * top_k <= E * SPARSE_PAIRS_PER_EXPERT
        assert gathered == (T == 1)
        args = moe_args(torch.Generator().manual_seed(T), T=T, H=16, E=E, I=8, Is=8, top_k=top_k, quantized=True)
        ref, fast = _both(args)
        assert torch.equal(ref, fast)


@settings(max_examples=15, deadline=None)
@given(T=st.integers(1, 8), E=st.integers(2, 8), seed=st.integers(0, 999))
def test_torch_close_to_reference_bf16(T, E, seed):
    args = moe_args(torch.Generator().manual_seed(seed), T=T, H=16, E=E, I=8, Is=8, top_k=min(2, E),
                    quantized=False)
    ref, fast = _both(args)
    torch.testing.assert_close(fast, ref, rtol=2e-2, atol=2e-2)


def test_all_equal_logits_pick_lowest_indices():
    args = list(moe_args(torch.Generator().manual_seed(0), T=3, H=8, E=6, I=4, Is=4, top_k=3, quantized=True))
    args[1] = torch.zeros_like(args[1])          # every expert equally likely
    ref, fast = _both(args)
    assert torch.equal(ref, fast)
    x, _, w13, s13, w2, s2 = args[:6]
    only_first = list(args)                      # experts 0..2 chosen: drop the rest, same result
    only_first[1], only_first[2], only_first[3] = args[1][:3], w13[:3], s13[:3]
    only_first[4], only_first[5] = w2[:3], s2[:3]
    assert torch.equal(moe(*only_first), fast)


def _w8a8(x, w, s):
    q, xs = quantize_per_token(x)
    return ((q.long() @ w.long().t()).float() * xs[:, None] * s.float()).to(x.dtype)


def test_reference_matches_per_token_formulation():
    g = torch.Generator().manual_seed(7)
    T, H, E, I, Is, k = 4, 16, 5, 8, 8, 2
    args = moe_args(g, T=T, H=H, E=E, I=I, Is=Is, top_k=k, quantized=True)
    x, router, w13, s13, w2, s2, sw13, ss13, sw2, ss2, gate_w = args[:11]
    with registry.using(moe="reference"):
        out = moe(*args)
    for t in range(T):
        xt = x[t:t + 1]
        probs = torch.softmax(F.linear(xt, router).float(), dim=-1)[0]
        wts, ids = torch.topk(probs, k)
        wts = wts / wts.sum()

        def mlp(a, wa, sa, wb, sb):
            h = _w8a8(a, wa, sa)
            half = h.shape[-1] // 2
            act = (h[:, :half].float() * torch.sigmoid(h[:, :half].float()) * h[:, half:].float()).to(h.dtype)
            return _w8a8(act, wb, sb)

        routed = sum(wts[j] * mlp(xt, w13[e], s13[e], w2[e], s2[e]).float() for j, e in enumerate(ids.tolist()))
        shared = torch.sigmoid(F.linear(xt, gate_w).float()) * mlp(xt, sw13, ss13, sw2, ss2).float()
        torch.testing.assert_close(out[t:t + 1].float(), (routed + shared).to(x.dtype).float(),
                                   rtol=1e-2, atol=1e-2)


def test_moe_block_helper():
    args = moe_args(torch.Generator().manual_seed(1), T=3, H=16, E=4, I=8, Is=8, top_k=2, quantized=True)
    x, router, w13, s13, w2, s2, sw13, ss13, sw2, ss2, gate_w = args[:11]
    mw = MoEWeights(router, Experts(w13, s13, w2, s2), Linear(sw13, ss13), Linear(sw2, ss2), gate_w)
    assert torch.equal(moe_block(x, mw, 2), moe(*args))


def test_token_chunking_is_exact(monkeypatch):
    from kernels.moe import vectorized
    monkeypatch.setattr(vectorized, "SCRATCH_ELEMENTS", 1)          # one token per chunk
    for quantized in (True, False):
        args = moe_args(torch.Generator().manual_seed(9), T=5, H=16, E=4, I=8, Is=8, top_k=2, quantized=quantized)
        ref, fast = _both(args)
        if quantized:
            assert torch.equal(ref, fast)
        else:
            torch.testing.assert_close(fast, ref, rtol=2e-2, atol=2e-2)


def test_a_token_gets_the_same_bits_in_any_batch(monkeypatch):
    """The router logits, softmax, renormalisation and shared gate sum in orders fixed by their
    lengths, so a token's output does not depend on the rows beside it (a graph replayed at a
    padded batch must match eager at the exact one); also with `fixed_order_linear` chunking."""
    from kernels.moe import common
    args = list(moe_args(torch.Generator().manual_seed(4), T=9, H=48, E=16, I=8, Is=8, top_k=4, quantized=True))
    for provider in ("reference", "torch"):
        with registry.using(moe=provider):
            whole = moe(*args)
            monkeypatch.setattr(common, "ROWS_PER_CHUNK", 1)  # one token per chunk
            for rows in (slice(0, 1), slice(3, 5), slice(2, 9)):
                part = moe(*([args[0][rows]] + args[1:]))
                assert torch.equal(part, whole[rows]), (provider, rows)
            monkeypatch.undo()


def test_fixed_order_linear_is_the_pairwise_sum_of_exact_products():
    from kernels._math import tree_sum
    from kernels.moe.common import fixed_order_linear
    g = torch.Generator().manual_seed(2)
    x, w = torch.randn(3, 100, generator=g).bfloat16(), torch.randn(5, 100, generator=g).bfloat16()
    got = fixed_order_linear(x, w)
    exact = (x.double() @ w.double().T)
    assert got.dtype == torch.bfloat16
    assert torch.equal(got, tree_sum(x.float()[:, None, :] * w.float()[None], -1).bfloat16())
    torch.testing.assert_close(got.double(), exact, rtol=1e-2, atol=1e-2)  # one bf16 rounding from exact


@settings(max_examples=30, deadline=None)
@given(T=st.integers(1, 24), E=st.integers(2, 12), top_k=st.integers(1, 4), quantized=st.booleans(),
       ties=st.booleans(), seed=st.integers(0, 999), H=st.sampled_from([16, 1100]),
       group_bytes=st.sampled_from([None, 1]))
def test_routed_reference_is_the_reference_bit_for_bit(T, E, top_k, quantized, ties, seed, H, group_bytes,
                                                       monkeypatch):
    """The third copy's MoE (`reference_routed`: only the experts in use, grouped into batched
    products) gives the dense reference's bits, W8A8 and bf16 experts, router ties included; with
    H=1100 the exact product runs in two K-blocks, and `group_bytes=1` puts one expert in each
    batched product."""
    from kernels.moe import reference
    from kernels.moe.reference import moe_reference, moe_reference_routed, routed_on_host
    if group_bytes is not None:
        monkeypatch.setattr(reference, "GROUP_BYTES", group_bytes)
    top_k = min(top_k, E)
    args = list(moe_args(torch.Generator().manual_seed(seed), T=T, H=H, E=E, I=8, Is=8, top_k=top_k,
                         quantized=quantized))
    if ties:
        router = args[1].clone()
        router[1::2] = router[0::2][: router[1::2].shape[0]]
        args[1] = router
    dense = moe_reference(*args)
    assert torch.equal(moe_reference_routed(*args), dense)
    with registry.using(moe="reference"), routed_on_host():  # as the third copy calls it
        assert torch.equal(moe(*args), dense)


def _topk_by_argmax_rounds(probs, k):
    """The reference's first formulation, kept as the oracle: k rounds of argmax (the first maximum),
    each chosen entry set to -inf before the next round."""
    remaining = probs.clone()
    values, ids = [], []
    for _ in range(k):
        i = remaining.argmax(dim=-1, keepdim=True)
        values.append(probs.gather(-1, i))
        ids.append(i)
        remaining = remaining.scatter(-1, i, float("-inf"))
    return torch.cat(values, dim=-1), torch.cat(ids, dim=-1)


@settings(max_examples=60, deadline=None)
@given(T=st.integers(1, 9), E=st.sampled_from([2, 8, 33, 256]), k=st.integers(1, 8), seed=st.integers(0, 9999),
       odd=st.sampled_from(["none", "ties", "zeros", "nan", "all-nan"]))
def test_top_k_is_k_rounds_of_argmax(device, T, E, k, seed, odd):
    """`topk_lowest_index` (one stable sort) picks what k rounds of argmax pick, in the same order and
    with the same values: ties to the lowest index, NaN first and in index order (as argmax does),
    softmax outputs, exact zeros and whole rows of NaN included."""
    from kernels.moe.reference import topk_lowest_index
    k = min(k, E)
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(T, E, generator=g)
    if odd == "ties":
        logits = torch.randint(0, 3, (T, E), generator=g).float()  # many equal probabilities
    probs = torch.softmax(logits, -1)
    if odd == "zeros":
        probs[:, ::2] = 0.0
    if odd == "nan":
        probs[0, torch.randint(E, (max(1, E // 4),), generator=g)] = float("nan")
    if odd == "all-nan":
        probs[-1] = float("nan")
    probs = probs.to(device)
    got_v, got_i = topk_lowest_index(probs, k)
    want_v, want_i = _topk_by_argmax_rounds(probs, k)
    assert torch.equal(got_i, want_i)
    assert torch.equal(got_v.isnan(), want_v.isnan())
    assert torch.equal(torch.nan_to_num(got_v), torch.nan_to_num(want_v))
