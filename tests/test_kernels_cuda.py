"""On an NVIDIA GPU: every graph-safe op, each provider, captured in a torch.cuda.CUDAGraph,
replays bit-exactly against eager (outputs and mutated states), also after new inputs are
copied into the static buffers; and torch == reference on CUDA."""
import pytest
import torch

from kernels import registry
from kernels.ops import GRAPH_SAFE
from kernels.samples import sample_args

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU")]

EXACT_OPS = {"w8a8_linear", "moe", "causal_conv1d_fn", "causal_conv1d_update", "causal_conv1d_update_spec", "rms_norm",
             "add_rms_norm", "rms_norm_gated", "gdn_gating"}
STATE_OPS = {"causal_conv1d_update", "causal_conv1d_update_spec", "gated_delta_rule_decode", "gated_delta_rule_spec"}


def _clone(args):
    return [a.clone() if isinstance(a, torch.Tensor) else a for a in args]


def _copy_into(static, args):
    for s, a in zip(static, args):
        if isinstance(s, torch.Tensor):
            s.copy_(a)


def _equal(a, b):
    if isinstance(a, (tuple, list)):
        return all(_equal(x, y) for x, y in zip(a, b))
    return torch.equal(a, b)


def _cases():
    for op in GRAPH_SAFE:
        for provider, (ok, _) in registry.providers(op).items():
            if provider not in ("reference", "torch"):
                continue
            for variant in ((dict(sentinel=-1), dict(sentinel=0)) if op in STATE_OPS else
                            (dict(T=1), dict(T=7), dict(T=40, quantized=False)) if op == "moe" else
                            (dict(T=3), dict(T=40, K=64, N=24)) if op == "w8a8_linear" else (dict(),)):
                yield pytest.param(op, provider, variant, id=f"{op}-{provider}-{variant}")


@pytest.mark.parametrize("op,provider,dims", list(_cases()))
def test_graph_replay_equals_eager(op, provider, dims):
    fn = getattr(torch.ops.repro, op)
    first = sample_args(op, device="cuda", seed=1, **dims)
    second = sample_args(op, device="cuda", seed=2, **dims)
    with registry.using(**{op: provider}):
        static = _clone(first)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):                        # warm-up outside the graph
            fn(*static)
        torch.cuda.current_stream().wait_stream(side)
        _copy_into(static, first)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = fn(*static)
        for args in (first, second, first):
            _copy_into(static, args)
            graph.replay()
            eager_args = _clone(args)
            expect = fn(*eager_args)
            torch.cuda.synchronize()
            assert _equal(out, expect), f"{op}/{provider}: replay output differs from eager"
            for s, e in zip(static, eager_args):
                if isinstance(s, torch.Tensor):
                    assert torch.equal(s, e), f"{op}/{provider}: replayed state differs from eager"


def _provider_cases():
    for op in ("w8a8_linear", "moe", "causal_conv1d_fn", "causal_conv1d_update", "causal_conv1d_update_spec",
               "gated_delta_rule_decode", "gated_delta_rule_spec"):
        for dims in ((dict(T=1), dict(T=5), dict(T=40), dict(T=40, quantized=False)) if op == "moe" else
                     (dict(T=3), dict(T=33, K=2048, N=520), dict(T=4, K=20, N=12)) if op == "w8a8_linear" else
                     (dict(sentinel=-1), dict(sentinel=0))):
            yield pytest.param(op, dims, id=f"{op}-{dims}")


@pytest.mark.parametrize("op,dims", list(_provider_cases()))
def test_torch_equals_reference_on_cuda(op, dims):
    fn = getattr(torch.ops.repro, op)
    args = sample_args(op, device="cuda", seed=3, **dims)
    results = {}
    for provider in ("reference", "torch"):
        a = _clone(args)
        with registry.using(**{op: provider}):
            results[provider] = (fn(*a), a)
    (o_ref, a_ref), (o_t, a_t) = results["reference"], results["torch"]
    exact = op in EXACT_OPS and dims.get("quantized", True)
    check = (lambda x, y: torch.equal(x, y)) if exact else \
        (lambda x, y: torch.testing.assert_close(x, y, rtol=2e-2, atol=2e-2) or True)
    assert check(o_t, o_ref)
    for x, y in zip(a_t, a_ref):
        if isinstance(x, torch.Tensor):
            assert check(x, y)


def test_gdn_prefill_on_cuda_matches_cpu():
    args = sample_args("gated_delta_rule_prefill", device="cuda", seed=4)
    cpu = [a.cpu() if isinstance(a, torch.Tensor) else a for a in args]
    o = torch.ops.repro.gated_delta_rule_prefill(*args)
    o_cpu = torch.ops.repro.gated_delta_rule_prefill(*cpu)
    torch.testing.assert_close(o.cpu(), o_cpu, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(args[5].cpu(), cpu[5], rtol=1e-4, atol=1e-5)
