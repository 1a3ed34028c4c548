"""GDN: gating formula, decode torch == reference, chunked prefill == independent token-by-token
recurrence, prefill of T tokens == T decode steps, sentinel rows untouched.

Tolerances (fp32 compute; v in fp32 so outputs are not rounded to bf16): chunked prefill vs the
float64 recurrence and prefill vs decode steps agree to atol 2e-5 / rtol 1e-4 (observed ~1e-7);
decode providers to torch.testing's fp32 defaults (observed bit-identical on CPU).
"""
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

from kernels import registry
from kernels.gdn.naive import gated_delta_rule_recurrent
from kernels.gdn.reference import gated_delta_rule_prefill_reference
from kernels.ops import gated_delta_rule_decode, gated_delta_rule_prefill, gdn_gating
from kernels.samples import draw_layout, layout_tensors

TOL = dict(atol=2e-5, rtol=1e-4)


def _heads(draw):
    Hk = draw(st.sampled_from([1, 2]))
    return Hk, Hk * draw(st.sampled_from([1, 2])), draw(st.sampled_from([4, 8])), draw(st.sampled_from([4, 8]))


def _inputs(T, Hk, Hv, dk, dv, S, seed, v_dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(T, Hk, dk, generator=g).to(torch.bfloat16)
    k = torch.randn(T, Hk, dk, generator=g).to(torch.bfloat16)
    v = torch.randn(T, Hv, dv, generator=g).to(v_dtype)
    gate = -torch.rand(T, Hv, generator=g) * 2
    beta = torch.rand(T, Hv, generator=g)
    state = torch.randn(S, Hv, dk, dv, generator=g) * 0.3
    return q, k, v, gate, beta, state


def _untouched(layout):
    live = {i % layout["S"] for i in layout["indices"] if i != layout["sentinel"]}
    return [r for r in range(layout["S"]) if r not in live]


def test_gating_formula():
    g = torch.Generator().manual_seed(0)
    A_log, dt_bias = torch.randn(8, generator=g).to(torch.bfloat16), torch.randn(8, generator=g).to(torch.bfloat16)
    a = (torch.randn(5, 8, generator=g) * 15).to(torch.bfloat16)        # crosses the softplus threshold
    b = torch.randn(5, 8, generator=g).to(torch.bfloat16)
    gate, beta = gdn_gating(A_log, a, dt_bias, b)
    assert gate.dtype == beta.dtype == torch.float32
    expect = -torch.exp(A_log.double()) * F.softplus(a.double() + dt_bias.double())
    torch.testing.assert_close(gate.double(), expect, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(beta.double(), torch.sigmoid(b.double()), rtol=1e-6, atol=1e-7)


@settings(max_examples=30, deadline=None)
@given(data=st.data(), seed=st.integers(0, 999))
def test_decode_torch_equals_reference(data, seed):
    layout = draw_layout(data.draw)
    Hk, Hv, dk, dv = _heads(data.draw)
    B = len(layout["indices"])
    q, k, v, gate, beta, state = _inputs(B, Hk, Hv, dk, dv, layout["S"], seed, torch.bfloat16)
    idx = torch.tensor(layout["indices"], dtype=torch.int32)
    outs = {}
    for provider in ("reference", "torch"):
        s = state.clone()
        with registry.using(gated_delta_rule_decode=provider):
            outs[provider] = gated_delta_rule_decode(q, k, v, gate, beta, s, idx, layout["sentinel"]), s
    (o_ref, s_ref), (o_t, s_t) = outs["reference"], outs["torch"]
    assert o_t.dtype == torch.bfloat16
    torch.testing.assert_close(o_t, o_ref)
    torch.testing.assert_close(s_t, s_ref)
    for r in _untouched(layout):
        assert torch.equal(s_t[r], state[r]) and torch.equal(s_ref[r], state[r])
    for b, i in enumerate(layout["indices"]):
        if i == layout["sentinel"]:
            assert o_t[b].eq(0).all() and o_ref[b].eq(0).all()


@settings(max_examples=25, deadline=None)
@given(data=st.data(), seed=st.integers(0, 999), chunk=st.sampled_from([1, 3, 4, 16, 64]))
def test_chunked_prefill_equals_recurrence(data, seed, chunk):
    layout = draw_layout(data.draw, max_batch=3, max_len=20)
    Hk, Hv, dk, dv = _heads(data.draw)
    qsl, idx, has, T = layout_tensors(layout)
    q, k, v, gate, beta, state = _inputs(T, Hk, Hv, dk, dv, layout["S"], seed)
    s = state.clone()
    o = gated_delta_rule_prefill_reference(q, k, v, gate, beta, s, qsl, idx, has, layout["sentinel"],
                                           chunk_size=chunk)
    o_naive, s_naive = gated_delta_rule_recurrent(q, k, v, gate, beta, state, qsl, idx, has, layout["sentinel"])
    torch.testing.assert_close(o.double(), o_naive, **TOL)
    torch.testing.assert_close(s.double(), s_naive, **TOL)
    for r in _untouched(layout):
        assert torch.equal(s[r], state[r])
    assert o[int(qsl[-1]):].eq(0).all()


def test_long_sequence_several_chunks_through_the_op():
    q, k, v, gate, beta, state = _inputs(150, 2, 4, 16, 8, 3, seed=5)
    qsl = torch.tensor([0, 130, 150], dtype=torch.int32)
    idx, has = torch.tensor([2, 0], dtype=torch.int32), torch.tensor([True, False])
    s = state.clone()
    o = gated_delta_rule_prefill(q, k, v, gate, beta, s, qsl, idx, has, -1)
    o_naive, s_naive = gated_delta_rule_recurrent(q, k, v, gate, beta, state, qsl, idx, has, -1)
    torch.testing.assert_close(o.double(), o_naive, **TOL)
    torch.testing.assert_close(s.double(), s_naive, **TOL)
    assert torch.equal(s[1], state[1])


@settings(max_examples=20, deadline=None)
@given(data=st.data(), seed=st.integers(0, 999), provider=st.sampled_from(["reference", "torch"]))
def test_prefill_equals_decode_steps(data, seed, provider):
    layout = draw_layout(data.draw, max_batch=3, max_len=10, duplicates=False, pad_tokens=False)
    Hk, Hv, dk, dv = _heads(data.draw)
    qsl, idx, has, T = layout_tensors(layout)
    q, k, v, gate, beta, state = _inputs(T, Hk, Hv, dk, dv, layout["S"], seed)
    sentinel = layout["sentinel"]
    s_pre = state.clone()
    o_pre = gated_delta_rule_prefill(q, k, v, gate, beta, s_pre, qsl, idx, has, sentinel)
    s_dec = state.clone()
    for b, i in enumerate(layout["indices"]):
        if i != sentinel and not layout["has_initial"][b]:
            s_dec[i] = 0
    o_dec = torch.zeros_like(o_pre)
    starts = qsl.tolist()
    with registry.using(gated_delta_rule_decode=provider):
        for b, i in enumerate(layout["indices"]):
            for t in range(starts[b], starts[b + 1]):
                sl = slice(t, t + 1)
                o_dec[t] = gated_delta_rule_decode(q[sl], k[sl], v[sl], gate[sl], beta[sl], s_dec,
                                                   torch.tensor([i], dtype=torch.int32), sentinel)[0]
    torch.testing.assert_close(o_pre, o_dec, **TOL)
    torch.testing.assert_close(s_pre, s_dec, **TOL)


@pytest.mark.parametrize("sentinel", [-1, 0])
@pytest.mark.parametrize("provider", ["reference", "torch"])
def test_decode_sentinel_aliasing_a_live_slot(sentinel, provider):
    """Padding rows name slot 0 (sentinel 0) or -1; neither changes any slot, even slot 0 in use."""
    q, k, v, gate, beta, state = _inputs(4, 2, 4, 8, 8, 4, seed=3)
    live0 = 0 if sentinel == -1 else 1
    idx = torch.tensor([sentinel, live0, sentinel, 2], dtype=torch.int32)
    s = state.clone()
    with registry.using(gated_delta_rule_decode=provider):
        o = gated_delta_rule_decode(q, k, v, gate, beta, s, idx, sentinel)
    assert o[0].eq(0).all() and o[2].eq(0).all()
    untouched = [r for r in range(4) if r not in (live0, 2)]
    for r in untouched:
        assert torch.equal(s[r], state[r])
    assert not torch.equal(s[live0], state[live0])


@pytest.mark.parametrize("provider", ["reference", "torch"])
def test_decode_duplicate_slot_last_row_wins(provider):
    q, k, v, gate, beta, state = _inputs(3, 1, 2, 4, 4, 3, seed=4)
    idx = torch.tensor([1, 1, -1], dtype=torch.int32)
    s = state.clone()
    with registry.using(gated_delta_rule_decode=provider):
        gated_delta_rule_decode(q, k, v, gate, beta, s, idx, -1)
    only_last = state.clone()
    with registry.using(gated_delta_rule_decode=provider):
        gated_delta_rule_decode(q[1:2], k[1:2], v[1:2], gate[1:2], beta[1:2], only_last,
                                torch.tensor([1], dtype=torch.int32), -1)
    assert torch.equal(s, only_last)
