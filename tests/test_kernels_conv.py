"""Causal conv1d: torch == reference (exact, outputs and state caches), prefill == repeated
decode (exact), sentinel rows never touch state, a direct formula check."""
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

from kernels import registry
from kernels.conv1d.reference import causal_conv1d_fn_reference
from kernels.ops import causal_conv1d_fn, causal_conv1d_update
from kernels.samples import draw_layout, layout_tensors

bf16 = torch.bfloat16


def _tensors(layout, C, K, seed):
    g = torch.Generator().manual_seed(seed)
    qsl, idx, has, T = layout_tensors(layout)
    x = torch.randn(T, C, generator=g).to(bf16)
    weight = (torch.randn(C, K, generator=g) * 0.5).to(bf16)
    state = torch.randn(layout["S"], C, K - 1, generator=g).to(bf16)
    return x, weight, state, qsl, idx, has


def _run(op, provider, *args):
    args = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    with registry.using(**{op: provider}):
        return getattr(torch.ops.repro, op)(*args), args


def _untouched_rows(layout):
    live = {i % layout["S"] for i in layout["indices"] if i != layout["sentinel"]}
    return [r for r in range(layout["S"]) if r not in live]


@settings(max_examples=30, deadline=None)
@given(data=st.data(), C=st.integers(1, 12), K=st.integers(2, 5), seed=st.integers(0, 999))
def test_prefill_torch_equals_reference(data, C, K, seed):
    layout = draw_layout(data.draw)
    x, weight, state, qsl, idx, has = _tensors(layout, C, K, seed)
    sentinel = layout["sentinel"]
    (y_ref, a_ref), (y_t, a_t) = (_run("causal_conv1d_fn", p, x, weight, state, qsl, idx, has, sentinel)
                                  for p in ("reference", "torch"))
    assert torch.equal(y_ref, y_t)
    assert torch.equal(a_ref[2], a_t[2])
    for r in _untouched_rows(layout):
        assert torch.equal(a_t[2][r], state[r])
    starts = qsl.tolist()
    for b, i in enumerate(layout["indices"]):
        if i == sentinel:
            assert y_t[starts[b]:starts[b + 1]].eq(0).all()
    assert y_t[starts[-1]:].eq(0).all()                              # tokens after the last request


@settings(max_examples=30, deadline=None)
@given(data=st.data(), C=st.integers(1, 12), K=st.integers(2, 5), seed=st.integers(0, 999))
def test_decode_torch_equals_reference(data, C, K, seed):
    layout = draw_layout(data.draw)
    g = torch.Generator().manual_seed(seed)
    B = len(layout["indices"])
    x = torch.randn(B, C, generator=g).to(bf16)
    weight = (torch.randn(C, K, generator=g) * 0.5).to(bf16)
    state = torch.randn(layout["S"], C, K - 1, generator=g).to(bf16)
    idx = torch.tensor(layout["indices"], dtype=torch.int32)
    (y_ref, a_ref), (y_t, a_t) = (_run("causal_conv1d_update", p, x, weight, state, idx, layout["sentinel"])
                                  for p in ("reference", "torch"))
    assert torch.equal(y_ref, y_t)
    assert torch.equal(a_ref[2], a_t[2])
    for r in _untouched_rows(layout):
        assert torch.equal(a_t[2][r], state[r])
    for b, i in enumerate(layout["indices"]):
        if i == layout["sentinel"]:
            assert y_t[b].eq(0).all()


@settings(max_examples=20, deadline=None)
@given(data=st.data(), C=st.integers(1, 8), K=st.integers(2, 5), seed=st.integers(0, 999),
       provider=st.sampled_from(["reference", "torch"]))
def test_prefill_equals_repeated_decode_exactly(data, C, K, seed, provider):
    layout = draw_layout(data.draw, duplicates=False, pad_tokens=False)
    x, weight, state, qsl, idx, has, = _tensors(layout, C, K, seed)
    sentinel = layout["sentinel"]
    y_pre, (_, _, state_pre, *_) = _run("causal_conv1d_fn", provider, x, weight, state, qsl, idx, has, sentinel)
    dec_state = state.clone()
    for b, i in enumerate(layout["indices"]):                          # start from zeros where no history
        if i != sentinel and not layout["has_initial"][b]:
            dec_state[i] = 0
    y_dec = torch.zeros_like(y_pre)
    starts = qsl.tolist()
    with registry.using(causal_conv1d_update=provider):
        for b, i in enumerate(layout["indices"]):
            for t in range(starts[b], starts[b + 1]):
                y_dec[t] = causal_conv1d_update(x[t:t + 1], weight, dec_state,
                                                torch.tensor([i], dtype=torch.int32), sentinel)[0]
    assert torch.equal(y_pre, y_dec)
    assert torch.equal(state_pre, dec_state)


def test_formula_against_conv1d():
    """One request with history: y == silu(conv1d over [history, x]) (fp32, tolerance of reduction order)."""
    g = torch.Generator().manual_seed(0)
    C, K, L = 6, 4, 9
    x = torch.randn(L, C, generator=g).to(bf16)
    weight = torch.randn(C, K, generator=g).to(bf16)
    state = torch.randn(2, C, K - 1, generator=g).to(bf16)
    before = state.clone()
    y = causal_conv1d_fn_reference(x, weight, state, torch.tensor([0, L]), torch.tensor([1]),
                                   torch.tensor([True]), -1)
    seq = torch.cat([before[1].double(), x.double().t()], dim=1)[None]  # [1, C, K-1+L]
    expect = F.silu(F.conv1d(seq, weight.double()[:, None, :], groups=C))[0].t()
    torch.testing.assert_close(y.double(), expect, rtol=1e-2, atol=1e-2)  # bf16 output
    assert torch.equal(state[1], x[-(K - 1):].t())                        # last K-1 inputs
    assert torch.equal(state[0], before[0])


def test_short_request_shifts_history():
    C, K = 2, 4
    state = torch.arange(2 * C * (K - 1), dtype=torch.float32).view(2, C, K - 1).to(bf16)
    x = torch.tensor([[100.0, 200.0]], dtype=bf16)
    for provider in ("reference", "torch"):
        s = state.clone()
        with registry.using(causal_conv1d_fn=provider):
            causal_conv1d_fn(x, torch.ones(C, K, dtype=bf16), s, torch.tensor([0, 1], dtype=torch.int32),
                             torch.tensor([0], dtype=torch.int32), torch.tensor([True]), -1)
        assert s[0].tolist() == [[1.0, 2.0, 100.0], [4.0, 5.0, 200.0]]
        assert torch.equal(s[1], state[1])
