"""The `triton` provider (kernels/<op>/triton.py) against the reference, on an NVIDIA GPU.

Bit for bit: `w8a8_linear`, `moe` (W8A8 experts), `causal_conv1d_update`, `causal_conv1d_fn` and
`causal_conv1d_update_spec` (outputs and conv state), `gdn_gating`, the sum of `add_rms_norm`.
Within a stated tolerance: `rms_norm`, the norm of `add_rms_norm`, `rms_norm_gated` (one bf16
rounding: the mean is reduced in another order), `gated_delta_rule_decode` and
`gated_delta_rule_spec` (fp32 state within 1e-5 relative, bf16 output within one bf16 rounding),
`gated_delta_rule_prefill` (the recurrent form against the reference's chunked one: the same
bounds, and against the float64 recurrence on long requests). State rules (sentinel
rows, duplicate slots: snapshot read, last valid row wins) are checked with batches that repeat a
slot. Also: each op captured
in a CUDA graph replays bit-exactly against eager, and the islands at baseline replay == eager in
lockstep with every op on `triton`.
"""
import pytest
import torch

from kernels import registry
from kernels.samples import sample_args

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")]

EXACT = {"w8a8_linear", "moe", "causal_conv1d_update", "causal_conv1d_fn", "causal_conv1d_update_spec", "gdn_gating"}
STATE_OPS = {"causal_conv1d_update", "causal_conv1d_fn", "causal_conv1d_update_spec", "gated_delta_rule_decode",
             "gated_delta_rule_prefill", "gated_delta_rule_spec"}
# (rtol, atol) for outputs and for mutated fp32 state
TOL = {"rms_norm": ((2 ** -7, 1e-6), None), "add_rms_norm": ((2 ** -7, 1e-6), None),
       "rms_norm_gated": ((2 ** -7, 1e-6), None),
       "gated_delta_rule_decode": ((2 ** -7, 1e-5), (1e-5, 1e-6)),
       "gated_delta_rule_prefill": ((2 ** -7, 1e-5), (1e-5, 1e-6)),
       "gated_delta_rule_spec": ((2 ** -7, 1e-5), (1e-5, 1e-6))}

VARIANTS = {
    "w8a8_linear": [dict(T=1), dict(T=3), dict(T=33, K=300, N=40), dict(T=1, K=2048, N=8192),
                    dict(T=8, K=2048, N=32), dict(T=32, K=4096, N=2048)],
    "moe": [dict(T=1), dict(T=5, top_k=3), dict(T=1, H=2048, E=32, I=512, Is=512, top_k=8),
            dict(T=32, H=2048, E=32, I=512, Is=512, top_k=8)],
    "rms_norm": [dict(T=1), dict(T=32, H=2048)],
    "add_rms_norm": [dict(T=1), dict(T=32, H=2048)],
    "rms_norm_gated": [dict(T=3), dict(T=32, Hv=32, dv=128)],
    "gdn_gating": [dict(T=1), dict(T=32, Hv=32)],
    "causal_conv1d_update": [dict(sentinel=-1), dict(sentinel=0), dict(sentinel=0, B=6, S=3),
                             dict(sentinel=0, B=32, S=33, C=8192)],
    "gated_delta_rule_decode": [dict(sentinel=-1), dict(sentinel=0), dict(sentinel=0, B=6, S=3),
                                dict(sentinel=0, B=8, S=9, Hk=16, Hv=32, dk=128, dv=128)],
    "causal_conv1d_fn": [dict(sentinel=-1), dict(sentinel=0), dict(sentinel=0, B=6, S=3),
                         dict(sentinel=0, B=8, S=9, C=8192)],
    "gated_delta_rule_prefill": [dict(sentinel=-1), dict(sentinel=0), dict(sentinel=0, B=6, S=3),
                                 dict(sentinel=0, B=8, S=9, Hk=16, Hv=32, dk=128, dv=128)],
    "causal_conv1d_update_spec": [dict(sentinel=-1), dict(sentinel=0, spec_k=0), dict(sentinel=0, B=6, S=3),
                                  dict(sentinel=0, B=8, S=9, C=8192, spec_k=4)],
    "gated_delta_rule_spec": [dict(sentinel=-1), dict(sentinel=0, spec_k=0), dict(sentinel=0, B=6, S=3),
                              dict(sentinel=0, B=8, Hk=16, Hv=32, dk=128, dv=128, spec_k=4)],
}


def _needs_triton():
    ok, why = registry.providers("w8a8_linear")["triton"]
    if not ok:
        pytest.skip(why)


def _clone(args):
    return [a.clone() if isinstance(a, torch.Tensor) else a for a in args]


def _flat(x):
    return list(x) if isinstance(x, (tuple, list)) else [x]


def _close(op, got, want, what):
    if op in EXACT:
        assert torch.equal(got, want), f"{op} {what}: max |diff| {(got.float() - want.float()).abs().max().item():.3g}"
        return
    out_tol, state_tol = TOL[op]
    rtol, atol = out_tol if what == "output" else state_tol
    torch.testing.assert_close(got.float(), want.float(), rtol=rtol, atol=atol, msg=lambda m: f"{op} {what}: {m}")


def _cases():
    for op, variants in VARIANTS.items():
        for dims in variants:
            yield pytest.param(op, dims, id=f"{op}-{dims}")


@pytest.mark.parametrize("op,dims", list(_cases()))
def test_triton_matches_the_reference(op, dims):
    _needs_triton()
    fn = getattr(torch.ops.repro, op)
    args = sample_args(op, device="cuda", seed=3, **dims)
    ref_args, fast_args = _clone(args), _clone(args)
    with registry.using(**{op: "reference"}):
        want = fn(*ref_args)
    with registry.using(**{op: "triton"}):
        got = fn(*fast_args)
    torch.cuda.synchronize()
    for g, w in zip(_flat(got), _flat(want)):
        _close(op, g, w, "output")
    if op == "add_rms_norm":
        assert torch.equal(got[0], want[0])  # the sum itself is one rounding of an exact fp32 add
    if op in STATE_OPS:
        for a, b in zip(fast_args, ref_args):
            if isinstance(a, torch.Tensor) and a.dim() >= 3:
                _close(op, a, b, "state")
        for a, b in zip(fast_args, args):  # inputs that are not state are untouched
            if isinstance(a, torch.Tensor) and a.dim() < 3:
                assert torch.equal(a, b)


@pytest.mark.parametrize("op", sorted(VARIANTS))
def test_triton_graph_replay_equals_eager(op):
    _needs_triton()
    fn = getattr(torch.ops.repro, op)
    dims = VARIANTS[op][1]
    first, second = (sample_args(op, device="cuda", seed=s, **dims) for s in (1, 2))
    with registry.using(**{op: "triton"}):
        static = _clone(first)
        fn(*_clone(first))  # compile outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = fn(*static)
        for args in (first, second, first):
            for s, a in zip(static, args):
                if isinstance(s, torch.Tensor):
                    s.copy_(a)
            graph.replay()
            eager_args = _clone(args)
            expect = fn(*eager_args)
            torch.cuda.synchronize()
            assert all(torch.equal(o, e) for o, e in zip(_flat(out), _flat(expect)))
            for s, e in zip(static, eager_args):
                if isinstance(s, torch.Tensor):
                    assert torch.equal(s, e)


@pytest.mark.parametrize("mode", ["piecewise", "full"])
def test_islands_replay_equals_eager_on_triton(tiny_path, mode):
    _needs_triton()
    from repro.graphs import make_provider
    from repro.islands import Model
    from repro.job.cases import Case, default_sequence, run_case
    provider = make_provider("cuda")
    model = Model(tiny_path, provider.device)
    seq = default_sequence(0, 48, vocab=model.cfg.vocab_size)
    with registry.using(all="triton"):
        for island in ("chain", "moe"):
            if island == "moe" and mode == "full":
                continue
            r = run_case(model, provider, Case(island, mode), seq)
            assert r.steps > 0 and not r.diverged, r.first_divergence


def test_rms_norm_gated_reads_z_as_a_column_slice():
    """z comes from submod0's stacked projection: a [T, Hv, dv] view with a wide row stride. The
    kernel reads it in place, with the bits it gives a contiguous copy."""
    _needs_triton()
    x, z, w, eps = sample_args("rms_norm_gated", device="cuda", seed=5, T=5, Hv=4, dv=16)
    wide = torch.randn(5, 3 * 64 + 8, device="cuda").to(z.dtype)
    wide[:, 64:128] = z.reshape(5, 64)
    zv = wide[:, 64:128].view(5, 4, 16)
    assert not zv.is_contiguous()
    with registry.using(rms_norm_gated="triton"):
        assert torch.equal(torch.ops.repro.rms_norm_gated(x, zv, w, eps), torch.ops.repro.rms_norm_gated(x, z, w, eps))


def test_triton_prefill_long_requests():
    """Both prefill kernels on requests longer than the reference's 64-token chunk and the conv's
    history, with a request without an initial state, two requests naming one slot (the later
    one's final state wins) and a padding request: conv bit for bit against the reference, GDN
    against the independent float64 recurrence (`kernels/gdn/naive.py`) within the bounds the
    reference itself meets there (`tests/test_kernels_gdn.py`)."""
    _needs_triton()
    from kernels.gdn.naive import gated_delta_rule_recurrent
    g = torch.Generator().manual_seed(11)
    lengths, idx, has = [130, 5, 70, 1, 3], [2, 3, 2, -1, 0], [True, False, True, True, False]
    qsl = torch.tensor([0] + lengths).cumsum(0).to(torch.int32).cuda()
    T = sum(lengths) + 2  # two tokens outside every request
    idx_t, has_t = torch.tensor(idx, dtype=torch.int32).cuda(), torch.tensor(has).cuda()
    C, Hk, Hv, dk, dv, S = 96, 2, 4, 32, 32, 4
    x = torch.randn(T, C, generator=g).bfloat16().cuda()
    w = (torch.randn(C, 4, generator=g) * 0.5).bfloat16().cuda()
    conv = torch.randn(S, C, 3, generator=g).bfloat16().cuda()
    outs = {}
    for provider in ("reference", "triton"):
        st = conv.clone()
        with registry.using(causal_conv1d_fn=provider):
            outs[provider] = (torch.ops.repro.causal_conv1d_fn(x, w, st, qsl, idx_t, has_t, -1), st)
    assert torch.equal(outs["triton"][0], outs["reference"][0])
    assert torch.equal(outs["triton"][1], outs["reference"][1])
    assert not torch.equal(outs["triton"][1][2], conv[2])  # the slot was written
    q, k = (torch.randn(T, Hk, dk, generator=g).bfloat16().cuda() for _ in range(2))
    v = torch.randn(T, Hv, dv, generator=g).bfloat16().cuda()
    gate = (-torch.rand(T, Hv, generator=g) * 0.2).cuda()
    beta = torch.rand(T, Hv, generator=g).cuda()
    ssm = (torch.randn(S, Hv, dk, dv, generator=g) * 0.1).cuda()
    st = ssm.clone()
    with registry.using(gated_delta_rule_prefill="triton"):
        o = torch.ops.repro.gated_delta_rule_prefill(q, k, v, gate, beta, st, qsl, idx_t, has_t, -1)
    o64, s64 = gated_delta_rule_recurrent(q, k, v, gate, beta, ssm, qsl, idx_t, has_t, -1)
    torch.testing.assert_close(o.double(), o64.to(o.dtype).double(), rtol=2 ** -7, atol=1e-5)
    torch.testing.assert_close(st.double(), s64, rtol=1e-4, atol=2e-5)
    assert o[sum(lengths):].eq(0).all() and o[int(qsl[3]):int(qsl[4])].eq(0).all()  # outside / padding
    assert torch.equal(st[1], ssm[1])  # no request names slot 1
