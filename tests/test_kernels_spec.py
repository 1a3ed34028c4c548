"""The speculative-decoding ops, `causal_conv1d_update_spec` and `gated_delta_rule_spec`, on the
`reference` and `torch` providers (the `triton` ones: tests/test_kernels_spec_triton.py).

Layouts are drawn FLA-style over k = 0..4 draft tokens, up to 8 rows of 1..1+k tokens with 1..1+k
accepted, zero-length padding rows at the end, sentinel rows (-1 or 0) anywhere, repeated slots,
and tokens before the first row or after the last. What is checked:
- conv: torch == reference bit for bit (outputs and cache); each row is the plain decode op run
  token by token from the window at its accepted column, and the window the next step would read
  at accepted count a' (column a' - 1) is that loop's state after a' tokens; with k = 0 the op is
  `causal_conv1d_update` bit for bit; the plain conv ops on a cache with k extra columns.
- GDN: torch == reference to fp32 rounding (as the decode pair: matmul against tree sums), both
  bit for bit the decode op of their own provider run token by token (the state after token t in
  the slot of column t), and with k = 0 the decode op itself; both within fp32 rounding of the
  independent float64 recurrence (`kernels/gdn/naive.py`).
- both: the last writer wins on repeated slots, declared mutations are exact (opcheck), and each
  provider records on the CPU tape and replays new metadata as eager computes it (graph-safe).
"""
import pytest
import torch
from hypothesis import given, settings, strategies as st

from kernels import registry
from kernels.gdn.naive import gated_delta_rule_spec_recurrent
from kernels.ops import (causal_conv1d_fn, causal_conv1d_update, causal_conv1d_update_spec,
                         gated_delta_rule_decode, gated_delta_rule_spec)
from kernels.samples import sample_args

bf16 = torch.bfloat16
PROVIDERS = ("reference", "torch")
TOL = dict(atol=2e-5, rtol=1e-4)  # fp32 against float64, as tests/test_kernels_gdn.py


@st.composite
def layouts(draw, duplicates=True):
    """k, sentinel, S, and per row: tokens, accepted count, conv slot, GDN slots (1+k columns)."""
    k = draw(st.integers(0, 4))
    n, sentinel = k + 1, draw(st.sampled_from([-1, 0]))
    B = draw(st.integers(1, 8))
    pad = draw(st.integers(0, B - 1))                                  # padding rows at the end
    first = 1 if sentinel == 0 else 0
    S = draw(st.integers(2, B * n + 1)) if duplicates else B * n + first
    fresh = iter(draw(st.permutations(range(first, S))))

    def slot(sentinel_odds):
        kind = draw(st.sampled_from(["live"] * 4 + ["sentinel"] * sentinel_odds + ["repeat"] * duplicates))
        if kind == "repeat":
            return draw(st.integers(first, S - 1))
        return sentinel if kind == "sentinel" else next(fresh, sentinel)
    rows = []
    for b in range(B):
        rows.append(dict(length=0 if b >= B - pad else draw(st.integers(1, n)), accepted=draw(st.integers(1, n)),
                         conv=slot(1), gdn=[slot(1) for _ in range(n)]))
    return dict(k=k, sentinel=sentinel, S=S, rows=rows, before=draw(st.integers(0, 1)), after=draw(st.integers(0, 2)))


def _meta(layout, device="cpu"):
    """(query_start_loc, num_accepted, conv indices [B], GDN indices [B, 1+k], T), int32."""
    rows = layout["rows"]
    qsl = torch.tensor([layout.get("before", 0)] + [r["length"] for r in rows]).cumsum(0).to(torch.int32)
    i32 = dict(dtype=torch.int32, device=device)
    return (qsl.to(device), torch.tensor([r["accepted"] for r in rows], **i32),
            torch.tensor([r["conv"] for r in rows], **i32), torch.tensor([r["gdn"] for r in rows], **i32),
            int(qsl[-1]) + layout["after"])


def _conv_tensors(layout, C, K, seed):
    g = torch.Generator().manual_seed(seed)
    T = _meta(layout)[-1]
    return (torch.randn(T, C, generator=g).to(bf16), (torch.randn(C, K, generator=g) * 0.5).to(bf16),
            torch.randn(layout["S"], C, K - 1 + layout["k"], generator=g).to(bf16))


def _gdn_tensors(layout, Hk, Hv, dk, dv, seed, v_dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    T = _meta(layout)[-1]
    return (torch.randn(T, Hk, dk, generator=g).to(bf16), torch.randn(T, Hk, dk, generator=g).to(bf16),
            torch.randn(T, Hv, dv, generator=g).to(v_dtype), -torch.rand(T, Hv, generator=g) * 2,
            torch.rand(T, Hv, generator=g), torch.randn(layout["S"], Hv, dk, dv, generator=g) * 0.3)


def _run(fn, provider, *args):
    """fn(*args) under `provider`, on copies: (result, the copies after the call)."""
    args = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    with registry.using(**{fn.name: provider}):
        return fn(*args), args


def _valid(layout, r):
    return r["length"] > 0 and r["conv"] != layout["sentinel"]


def _src(layout, r):
    return r["gdn"][min(r["accepted"], layout["k"] + 1) - 1]


# ---- causal_conv1d_update_spec --------------------------------------------------------------------
@settings(max_examples=40, deadline=None)
@given(layout=layouts(), C=st.integers(1, 12), K=st.integers(2, 5), seed=st.integers(0, 999))
def test_conv_spec_torch_equals_reference(layout, C, K, seed):
    x, w, state = _conv_tensors(layout, C, K, seed)
    qsl, acc, idx, _, _ = _meta(layout)
    (y_ref, a_ref), (y_t, a_t) = (_run(causal_conv1d_update_spec, p, x, w, state, idx, acc, qsl, layout["sentinel"])
                                  for p in PROVIDERS)
    assert torch.equal(y_ref, y_t) and torch.equal(a_ref[2], a_t[2])
    live = {r["conv"] % layout["S"] for r in layout["rows"] if _valid(layout, r)}
    for s in set(range(layout["S"])) - live:
        assert torch.equal(a_t[2][s], state[s])                       # padding and sentinel rows write nothing
    starts = qsl.tolist()
    for b, r in enumerate(layout["rows"]):
        if not _valid(layout, r):
            assert y_t[starts[b]:starts[b + 1]].eq(0).all()
    assert y_t[starts[-1]:].eq(0).all() and y_t[:starts[0]].eq(0).all()      # tokens outside every row


@settings(max_examples=40, deadline=None)
@given(layout=layouts(duplicates=False), C=st.integers(1, 8), K=st.integers(2, 5), seed=st.integers(0, 999),
       provider=st.sampled_from(PROVIDERS))
def test_conv_spec_is_the_decode_op_token_by_token(layout, C, K, seed, provider):
    """Reading the window at column a-1 and writing [window[1:], x_0..x_{L-1}] from column 0 is
    what the plain decode op does token by token from that window: its outputs, and at every
    accepted count a' the window the next step reads (columns a'-1 ..) is its state after a'."""
    x, w, state = _conv_tensors(layout, C, K, seed)
    qsl, acc, idx, _, _ = _meta(layout)
    y, (_, _, after, *_) = _run(causal_conv1d_update_spec, provider, x, w, state, idx, acc, qsl, layout["sentinel"])
    starts = qsl.tolist()
    with registry.using(causal_conv1d_update=provider):
        for b, r in enumerate(layout["rows"]):
            if not _valid(layout, r):
                continue
            s, a, L = r["conv"] % layout["S"], r["accepted"], r["length"]
            window = state[s:s + 1, :, a - 1:a - 1 + K - 1].clone()
            for t in range(L):
                step = causal_conv1d_update(x[starts[b] + t:starts[b] + t + 1], w, window,
                                            torch.tensor([0], dtype=torch.int32), -1)
                assert torch.equal(y[starts[b] + t], step[0])
                assert torch.equal(after[s, :, t:t + K - 1], window[0])
            assert torch.equal(after[s, :, K - 2 + L:], state[s, :, K - 2 + L:])   # the columns after: untouched


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("sentinel", [-1, 0])
def test_conv_spec_without_drafts_is_the_decode_op(provider, sentinel):
    x, w, state, idx, _ = sample_args("causal_conv1d_update", seed=4, sentinel=sentinel, B=6, S=4)
    idx[1] = idx[3]                                                     # a repeated slot: the last row wins
    B = x.shape[0]
    ones, qsl = torch.ones(B, dtype=torch.int32), torch.arange(B + 1, dtype=torch.int32)
    want, (_, _, s_want, *_) = _run(causal_conv1d_update, provider, x, w, state, idx, sentinel)
    got, (_, _, s_got, *_) = _run(causal_conv1d_update_spec, provider, x, w, state, idx, ones, qsl, sentinel)
    assert torch.equal(got, want) and torch.equal(s_got, s_want)


@pytest.mark.parametrize("provider", PROVIDERS)
def test_conv_spec_repeated_slot_last_writer_of_each_column_wins(provider):
    """Rows 0 (3 tokens, 2 accepted) and 1 (1 token) on slot 1, K = 4, k = 2: columns 0, 1 and 2
    are row 1's, 3 and 4 are row 0's last two tokens; both read the slot as it was before."""
    g = torch.Generator().manual_seed(7)
    x, w = torch.randn(4, 3, generator=g).to(bf16), torch.randn(3, 4, generator=g).to(bf16)
    state = torch.randn(3, 3, 5, generator=g).to(bf16)
    idx, acc, qsl = (torch.tensor(v, dtype=torch.int32) for v in ([1, 1], [2, 1], [0, 3, 4]))
    y, (_, _, after, *_) = _run(causal_conv1d_update_spec, provider, x, w, state, idx, acc, qsl, -1)
    assert torch.equal(after[1], torch.cat([state[1, :, 1:3], x[3:4].t(), x[1:3].t()], dim=1))
    assert torch.equal(after[0], state[0]) and torch.equal(after[2], state[2])
    for rows, a, first in ((slice(0, 3), 2, 0), (slice(3, 4), 1, 3)):  # each row alone gives its outputs
        alone, _ = _run(causal_conv1d_update_spec, provider, x[rows], w, state, idx[:1], torch.tensor([a]).int(),
                        torch.tensor([0, rows.stop - rows.start]).int(), -1)
        assert torch.equal(y[rows], alone)


@settings(max_examples=25, deadline=None)
@given(layout=layouts(), C=st.integers(1, 8), K=st.integers(2, 5), seed=st.integers(0, 999),
       provider=st.sampled_from(PROVIDERS))
def test_plain_conv_ops_keep_the_extra_columns(layout, C, K, seed, provider):
    """`causal_conv1d_update` and `causal_conv1d_fn` on a cache with k draft columns: columns
    0..K-2 as on a cache without them, the k after them untouched."""
    x, w, state = _conv_tensors(layout, C, K, seed)
    qsl, _, idx, _, _ = _meta(layout)
    has = torch.tensor([b % 2 == 0 for b in range(len(idx))])
    narrow = state[..., :K - 1].contiguous()
    for fn, args in ((causal_conv1d_update, (x[:len(idx)], w, None, idx, layout["sentinel"])) if len(x) >= len(idx)
                     else (causal_conv1d_fn, (x, w, None, qsl, idx, has, layout["sentinel"])),
                     (causal_conv1d_fn, (x, w, None, qsl, idx, has, layout["sentinel"]))):
        y_wide, a_wide = _run(fn, provider, *(state if a is None else a for a in args))
        y_narrow, a_narrow = _run(fn, provider, *(narrow if a is None else a for a in args))
        assert torch.equal(y_wide, y_narrow)
        assert torch.equal(a_wide[2][..., :K - 1], a_narrow[2]) and torch.equal(a_wide[2][..., K - 1:], state[..., K - 1:])


# ---- gated_delta_rule_spec --------------------------------------------------------------------------
@settings(max_examples=30, deadline=None)
@given(layout=layouts(), heads=st.sampled_from([(1, 1, 4, 4), (1, 2, 8, 4), (2, 4, 4, 8)]), seed=st.integers(0, 999))
def test_gdn_spec_providers_agree_and_match_the_float64_recurrence(layout, heads, seed):
    q, k, v, g, beta, state = _gdn_tensors(layout, *heads, seed)
    qsl, acc, _, idx, _ = _meta(layout)
    sentinel = layout["sentinel"]
    got = {p: _run(gated_delta_rule_spec, p, q, k, v, g, beta, state, idx, acc, qsl, sentinel) for p in PROVIDERS}
    o_naive, s_naive = gated_delta_rule_spec_recurrent(q, k, v, g, beta, state, idx, acc, qsl, sentinel)
    for o, args in got.values():
        torch.testing.assert_close(o.double(), o_naive, **TOL)
        torch.testing.assert_close(args[5].double(), s_naive, **TOL)
    (o_ref, a_ref), (o_t, a_t) = got["reference"], got["torch"]
    torch.testing.assert_close(o_t, o_ref)                              # matmul against tree sums, as decode
    torch.testing.assert_close(a_t[5], a_ref[5])
    written = {d % layout["S"] for r in layout["rows"] if r["length"] and _src(layout, r) != sentinel
               for d in r["gdn"][:r["length"]] if d != sentinel}
    for s in set(range(layout["S"])) - written:
        assert torch.equal(a_t[5][s], state[s]) and torch.equal(a_ref[5][s], state[s])
    starts = qsl.tolist()
    for b, r in enumerate(layout["rows"]):
        if not r["length"] or _src(layout, r) == sentinel:
            assert o_t[starts[b]:starts[b + 1]].eq(0).all() and o_ref[starts[b]:starts[b + 1]].eq(0).all()
    for o in (o_t, o_ref):                                               # tokens outside every row
        assert o[starts[-1]:].eq(0).all() and o[:starts[0]].eq(0).all()


@settings(max_examples=30, deadline=None)
@given(layout=layouts(duplicates=False), seed=st.integers(0, 999), provider=st.sampled_from(PROVIDERS))
def test_gdn_spec_is_the_decode_op_token_by_token(layout, seed, provider):
    """Each row: the decode op of the same provider, from the state of its accepted column, one
    token at a time: the same output bits, and the state after token t in the slot of column t."""
    q, k, v, g, beta, state = _gdn_tensors(layout, 2, 4, 8, 4, seed, bf16)
    qsl, acc, _, idx, _ = _meta(layout)
    sentinel = layout["sentinel"]
    o, args = _run(gated_delta_rule_spec, provider, q, k, v, g, beta, state, idx, acc, qsl, sentinel)
    starts = qsl.tolist()
    with registry.using(gated_delta_rule_decode=provider):
        for b, r in enumerate(layout["rows"]):
            if not r["length"] or _src(layout, r) == sentinel:
                continue
            S = state[_src(layout, r) % layout["S"]].clone()[None]
            for t in range(r["length"]):
                i = slice(starts[b] + t, starts[b] + t + 1)
                step = gated_delta_rule_decode(q[i], k[i], v[i], g[i], beta[i], S, torch.tensor([0]).int(), -1)
                assert torch.equal(o[i], step)
                if r["gdn"][t] != sentinel:
                    assert torch.equal(args[5][r["gdn"][t] % layout["S"]], S[0])


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("sentinel", [-1, 0])
def test_gdn_spec_without_drafts_is_the_decode_op(provider, sentinel):
    q, k, v, g, beta, state, idx, _ = sample_args("gated_delta_rule_decode", seed=4, sentinel=sentinel, B=6, S=4)
    idx[1] = idx[3]                                                     # a repeated slot: the last row wins
    B = q.shape[0]
    ones, qsl = torch.ones(B, dtype=torch.int32), torch.arange(B + 1, dtype=torch.int32)
    want, a_want = _run(gated_delta_rule_decode, provider, q, k, v, g, beta, state, idx, sentinel)
    got, a_got = _run(gated_delta_rule_spec, provider, q, k, v, g, beta, state, idx[:, None], ones, qsl, sentinel)
    assert torch.equal(got, want) and torch.equal(a_got[5], a_want[5])


@pytest.mark.parametrize("provider", PROVIDERS)
def test_gdn_spec_snapshot_reads_and_last_writer(provider):
    """Row 0 writes slots 1, 2, 3; row 1 reads slot 2 (as it was before the call) and writes it
    last; row 2 names slot 3 as its source but has no tokens; row 3's source is the sentinel."""
    layout = dict(k=2, sentinel=-1, S=5, after=1, rows=[
        dict(length=3, accepted=1, gdn=[1, 2, 3]), dict(length=1, accepted=1, gdn=[2, -1, -1]),
        dict(length=0, accepted=1, gdn=[3, 4, 4]), dict(length=2, accepted=2, gdn=[4, -1, 0])])
    for r in layout["rows"]:
        r["conv"] = r["gdn"][0]
    q, k, v, g, beta, state = _gdn_tensors(layout, 1, 2, 4, 4, seed=3)
    qsl, acc, _, idx, _ = _meta(layout)
    o, args = _run(gated_delta_rule_spec, provider, q, k, v, g, beta, state, idx, acc, qsl, -1)
    alone = {}
    for b, rows in ((0, slice(0, 3)), (1, slice(3, 4))):
        alone[b] = _run(gated_delta_rule_spec, provider, q[rows], k[rows], v[rows], g[rows], beta[rows], state,
                        idx[b:b + 1], acc[b:b + 1], torch.tensor([0, rows.stop - rows.start]).int(), -1)
        assert torch.equal(o[rows], alone[b][0])
    after = args[5]
    assert torch.equal(after[1], alone[0][1][5][1]) and torch.equal(after[3], alone[0][1][5][3])
    assert torch.equal(after[2], alone[1][1][5][2])
    assert torch.equal(after[0], state[0]) and torch.equal(after[4], state[4])
    assert o[4:].eq(0).all()


# ---- both: declared mutations, and the CPU tape ----------------------------------------------------
SPEC_OPS = ("causal_conv1d_update_spec", "gated_delta_rule_spec")


@pytest.mark.parametrize("op", SPEC_OPS)
@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("spec_k,sentinel", [(0, -1), (1, 0), (4, -1), (4, 0)])
def test_opcheck(op, provider, spec_k, sentinel):
    args = sample_args(op, seed=2, spec_k=spec_k, sentinel=sentinel, B=5)
    with registry.using(**{op: provider}):
        torch.library.opcheck(getattr(torch.ops.repro, op), args)


def _remeta(args, op, seed):
    """The same shapes with other metadata: lengths, accepted counts and slots moved around."""
    g = torch.Generator().manual_seed(seed)
    args = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    idx, acc, qsl = args[3:6] if op == SPEC_OPS[0] else args[6:9]
    n, B = (args[2].shape[2] - args[1].shape[-1] + 2) if op == SPEC_OPS[0] else idx.shape[1], acc.shape[0]
    lengths = torch.randint(0, n + 1, (B,), generator=g)
    qsl.copy_(torch.cat([torch.zeros(1), lengths.cumsum(0)]).clamp(max=int(qsl[-1])).to(qsl.dtype))
    acc.copy_(torch.randint(1, n + 1, (B,), generator=g))
    idx.copy_(idx.flatten()[torch.randperm(idx.numel(), generator=g)].view(idx.shape))
    return args


@pytest.mark.parametrize("op", SPEC_OPS)
@pytest.mark.parametrize("provider", PROVIDERS)
def test_records_on_the_cpu_tape_and_replays_new_metadata(op, provider):
    from repro.graphs import TapeProvider
    tape = TapeProvider()
    first = sample_args(op, seed=1, spec_k=3, B=5)
    static = [a.clone() if isinstance(a, torch.Tensor) else a for a in first]
    fn = getattr(torch.ops.repro, op)
    with registry.using(**{op: provider}), torch.inference_mode():
        graph, out = tape.capture(lambda: fn(*static), tape.new_pool())
        for seed in (2, 3, 4):
            new = _remeta(sample_args(op, seed=seed, spec_k=3, B=5), op, seed)
            for s, a in zip(static, new):
                if isinstance(s, torch.Tensor):
                    s.copy_(a)
            graph.replay()
            eager = [a.clone() if isinstance(a, torch.Tensor) else a for a in new]
            want = fn(*eager)
            assert torch.equal(out, want), (op, provider, seed)
            assert all(torch.equal(s, e) for s, e in zip(static, eager) if isinstance(s, torch.Tensor))
