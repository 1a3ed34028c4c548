"""The `triton` provider of the speculative-decoding ops (and of the plain conv ops on a cache with
draft columns), against the reference, on an NVIDIA GPU or under Triton's CPU interpreter
(`TRITON_INTERPRET=1`, small shapes: slow).

On a GPU: conv outputs and cache bit for bit; GDN within the decode kernel's bounds of the
reference and of the float64 recurrence; with k = 0 the GDN kernel is the decode kernel bit for
bit. Under the interpreter the kernels' exp and divisions are numpy's, not the CUDA library's
(`kernels/triton_helpers.py`), so outputs agree to rounding; the copies (conv cache) are exact.
"""
import pytest
import torch

from kernels import registry
from kernels.availability import interpreting
from kernels.gdn.naive import gated_delta_rule_spec_recurrent
from kernels.samples import sample_args

OPS = ("causal_conv1d_update_spec", "gated_delta_rule_spec")
DEVICE = "cpu" if interpreting() else "cuda"
GPU = not interpreting()
# (rtol, atol): GDN output and state as tests/test_kernels_fast.py's decode bounds; conv outputs
# under the interpreter within one bf16 rounding
GDN_OUT, GDN_STATE, CONV_OUT = (2 ** -7, 1e-5), (1e-5, 1e-6), (2 ** -7, 1e-6)
LAYOUTS = [dict(sentinel=-1), dict(sentinel=0, spec_k=0), dict(sentinel=0, B=6, S=3, spec_k=4),
           dict(sentinel=-1, B=3, spec_k=1)]


@pytest.fixture(autouse=True)
def needs_triton():
    ok, why = registry.providers(OPS[0])["triton"]
    if not ok:
        pytest.skip(f"needs an NVIDIA GPU with triton, or Triton's interpreter (TRITON_INTERPRET=1): {why}")


def _call(op, provider, args):
    args = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    with registry.using(**{op: provider}):
        out = getattr(torch.ops.repro, op)(*args)
    return out, args


def _close(got, want, tol, exact):
    if exact:
        assert torch.equal(got, want), f"max |diff| {(got.float() - want.float()).abs().max().item():.3g}"
    else:
        torch.testing.assert_close(got.float(), want.float(), rtol=tol[0], atol=tol[1])


@pytest.mark.parametrize("dims", LAYOUTS, ids=str)
def test_conv_spec_triton_matches_the_reference(dims):
    args = sample_args("causal_conv1d_update_spec", device=DEVICE, seed=3, **dims)
    (y, a), (y_ref, a_ref) = (_call("causal_conv1d_update_spec", p, args) for p in ("triton", "reference"))
    _close(y, y_ref, CONV_OUT, exact=GPU)
    assert torch.equal(a[2], a_ref[2])                                     # the cache: copies only


@pytest.mark.parametrize("dims", LAYOUTS, ids=str)
def test_gdn_spec_triton_matches_the_reference_and_the_recurrence(dims):
    args = sample_args("gated_delta_rule_spec", device=DEVICE, seed=3, **dims)
    (o, a), (o_ref, a_ref) = (_call("gated_delta_rule_spec", p, args) for p in ("triton", "reference"))
    _close(o, o_ref, GDN_OUT, exact=False)
    _close(a[5], a_ref[5], GDN_STATE, exact=False)
    o64, s64 = gated_delta_rule_spec_recurrent(*args)
    torch.testing.assert_close(o.double(), o64.to(o.dtype).double(), rtol=2 ** -7, atol=1e-5)
    torch.testing.assert_close(a[5].double(), s64, rtol=1e-4, atol=2e-5)


def test_spec_triton_repeated_slots_last_writer_wins():
    """Two rows on one conv slot (the last writer of each column wins) and GDN rows whose slots
    cross (row 1 reads slot 2 as it was before row 0 wrote it, then writes it last; row 0's token 1
    has the sentinel for a destination)."""
    g = torch.Generator().manual_seed(7)
    i32 = dict(dtype=torch.int32, device=DEVICE)
    x = torch.randn(4, 3, generator=g).to(torch.bfloat16).to(DEVICE)
    w = torch.randn(3, 4, generator=g).to(torch.bfloat16).to(DEVICE)
    conv = torch.randn(3, 3, 5, generator=g).to(torch.bfloat16).to(DEVICE)
    meta = (torch.tensor([1, 1], **i32), torch.tensor([2, 1], **i32), torch.tensor([0, 3, 4], **i32))
    args = (x, w, conv, *meta, -1)
    (y, a), (y_ref, a_ref) = (_call("causal_conv1d_update_spec", p, args) for p in ("triton", "reference"))
    _close(y, y_ref, CONV_OUT, exact=GPU)
    assert torch.equal(a[2], a_ref[2])
    q, k = (torch.randn(4, 1, 16, generator=g).to(torch.bfloat16).to(DEVICE) for _ in range(2))
    v = torch.randn(4, 2, 16, generator=g).to(DEVICE)
    gate, beta = (-torch.rand(4, 2, generator=g)).to(DEVICE), torch.rand(4, 2, generator=g).to(DEVICE)
    ssm = (torch.randn(5, 2, 16, 16, generator=g) * 0.3).to(DEVICE)
    meta = (torch.tensor([[1, -1, 2], [2, -1, -1]], **i32), torch.tensor([1, 1], **i32), torch.tensor([0, 3, 4], **i32))
    args = (q, k, v, gate, beta, ssm, *meta, -1)
    (o, a), (o_ref, a_ref) = (_call("gated_delta_rule_spec", p, args) for p in ("triton", "reference"))
    _close(o, o_ref, GDN_OUT, exact=False)
    _close(a[5], a_ref[5], GDN_STATE, exact=False)
    assert all(torch.equal(a[5][i], ssm[i]) for i in (0, 3, 4))          # a sentinel column writes nothing


@pytest.mark.parametrize("sentinel", [-1, 0])
def test_gdn_spec_triton_without_drafts_is_the_decode_kernel(sentinel):
    q, k, v, g, beta, state, idx, _ = sample_args("gated_delta_rule_decode", device=DEVICE, seed=4, sentinel=sentinel,
                                                  B=6, S=4)
    idx[1] = idx[3]
    B = q.shape[0]
    ones = torch.ones(B, dtype=torch.int32, device=DEVICE)
    qsl = torch.arange(B + 1, dtype=torch.int32, device=DEVICE)
    want, a_want = _call("gated_delta_rule_decode", "triton", (q, k, v, g, beta, state, idx, sentinel))
    got, a_got = _call("gated_delta_rule_spec", "triton", (q, k, v, g, beta, state, idx[:, None], ones, qsl, sentinel))
    assert torch.equal(got, want) and torch.equal(a_got[5], a_want[5])


@pytest.mark.parametrize("op", ["causal_conv1d_update", "causal_conv1d_fn"])
def test_plain_conv_triton_keeps_the_extra_columns(op):
    """A cache with k = 3 draft columns: columns 0..2 as the reference writes them, the rest untouched."""
    args = list(sample_args(op, device=DEVICE, seed=5, sentinel=0, B=5, S=4))
    g = torch.Generator().manual_seed(5)
    args[2] = torch.cat([args[2], torch.randn(*args[2].shape[:2], 3, generator=g).to(args[2].dtype).to(DEVICE)], 2)
    (y, a), (y_ref, a_ref) = (_call(op, p, args) for p in ("triton", "reference"))
    _close(y, y_ref, CONV_OUT, exact=GPU)
    assert torch.equal(a[2], a_ref[2]) and torch.equal(a[2][..., 3:], args[2][..., 3:])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU (graph capture)")
@pytest.mark.parametrize("op", OPS)
def test_spec_triton_graph_replay_equals_eager(op):
    fn = getattr(torch.ops.repro, op)
    first, second = (sample_args(op, device="cuda", seed=s, sentinel=0, B=6, spec_k=3) for s in (1, 2))
    second[-2].copy_(torch.tensor([0, 2, 3, 7, 8, 8, 8], dtype=torch.int32))   # other lengths, same T
    second[-3].copy_(torch.tensor([4, 1, 2, 3, 1, 1], dtype=torch.int32))
    with registry.using(**{op: "triton"}):
        static = [a.clone() if isinstance(a, torch.Tensor) else a for a in first]
        fn(*[a.clone() if isinstance(a, torch.Tensor) else a for a in first])  # compile outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = fn(*static)
        for args in (first, second, first):
            for s, a in zip(static, args):
                if isinstance(s, torch.Tensor):
                    s.copy_(a)
            graph.replay()
            eager = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
            expect = fn(*eager)
            torch.cuda.synchronize()
            assert torch.equal(out, expect)
            assert all(torch.equal(s, e) for s, e in zip(static, eager) if isinstance(s, torch.Tensor))
