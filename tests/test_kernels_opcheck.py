"""torch.library.opcheck for every op and every provider available here (schema incl. declared
mutations, fake tensors, autograd registration, AOT dispatch), on the selected test device
(`--device`, conftest's `device` fixture): GPU providers (`triton`, `fla`) get device tensors."""
import pytest
import torch

from kernels import registry
from kernels.ops import OPS
from kernels.samples import sample_args

CASES = [(op, provider, sentinel)
         for op in OPS
         for provider, (ok, _) in registry.providers(op).items() if ok
         for sentinel in ((-1, 0) if op in ("causal_conv1d_fn", "causal_conv1d_update", "causal_conv1d_update_spec",
                                            "gated_delta_rule_decode", "gated_delta_rule_prefill",
                                            "gated_delta_rule_spec") else (-1,))]


@pytest.mark.parametrize("op,provider,sentinel", CASES)
def test_opcheck(op, provider, sentinel, device):
    args = sample_args(op, device=device, seed=1, sentinel=sentinel)
    assert all(a.device.type == torch.device(device).type for a in args if isinstance(a, torch.Tensor))
    with registry.using(**{op: provider}):
        torch.library.opcheck(getattr(torch.ops.repro, op), args)


@pytest.mark.parametrize("op", OPS)
def test_samples_are_built_on_the_device_asked_for(op):
    """Every tensor of every op's sample on the device given (the meta device stands in for a GPU
    here: a CPU tensor in a GPU sample would fail opcheck there)."""
    args = sample_args(op, device="meta", seed=1)
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    assert tensors and all(t.device.type == "meta" for t in tensors), op
    cpu = sample_args(op, device="cpu", seed=1)
    assert [tuple(t.shape) for t in tensors] == [tuple(a.shape) for a in cpu if isinstance(a, torch.Tensor)]


@pytest.mark.parametrize("quantized", [True, False])
def test_opcheck_moe_bf16_and_dense_regime(quantized, device):
    for provider in ("reference", "torch"):
        with registry.using(moe=provider):
            torch.library.opcheck(torch.ops.repro.moe, sample_args("moe", device=device, T=7, quantized=quantized))


def test_opcheck_w8a8_without_bias(device):
    x, w, s, _ = sample_args("w8a8_linear", device=device)
    torch.library.opcheck(torch.ops.repro.w8a8_linear, (x, w, s, None))


def test_mutates_args_declared_exactly():
    expected = {"causal_conv1d_fn": {"conv_state"}, "causal_conv1d_update": {"conv_state"},
                "causal_conv1d_update_spec": {"conv_state"}, "gated_delta_rule_decode": {"ssm_state"},
                "gated_delta_rule_prefill": {"ssm_state"}, "gated_delta_rule_spec": {"ssm_state"},
                "gdn_attention": {"core_out", "conv_state", "ssm_state"}}
    for op in OPS:
        schema = getattr(torch.ops.repro, op).default._schema
        mutated = {a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write}
        assert mutated == expected.get(op, set()), op


# ---- the direct call (`kernels._library`: an `Op` skips the dispatcher when it could only call the body)
def _spy(monkeypatch, name):
    """Count the calls of `name` that go through the dispatcher."""
    from kernels._library import namespace
    op = getattr(namespace, name)
    n = [0]
    real = op._op

    def counted(*a, **kw):
        n[0] += 1
        return real(*a, **kw)
    monkeypatch.setattr(op, "_op", counted)
    return op, n


def _clones(args):
    return [a.clone() if isinstance(a, torch.Tensor) else a for a in args]


def _same(a, b):
    if a is None or b is None:  # an op that only writes its arguments (gdn_attention)
        return a is b
    a = list(a) if isinstance(a, (tuple, list)) else [a]
    b = list(b) if isinstance(b, (tuple, list)) else [b]
    return len(a) == len(b) and all(x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("op,provider,sentinel", CASES)
def test_the_direct_call_is_the_dispatched_call(op, provider, sentinel, device, monkeypatch):
    """Under inference mode, no mode active, plain tensors: the island's call reaches the body
    without the dispatcher, and returns (and writes) bit for bit what `torch.ops.repro` does."""
    from kernels._library import namespace
    fn, dispatched = _spy(monkeypatch, op)
    assert fn is getattr(namespace, op)
    args = sample_args(op, device=device, seed=3, sentinel=sentinel)
    with registry.using(**{op: provider}), torch.inference_mode():
        a, b = _clones(args), _clones(args)
        want = getattr(torch.ops.repro, op)(*a)
        got = fn(*b)
    assert dispatched[0] == 0, f"{op}: went through the dispatcher"
    assert _same(got, want), f"{op} ({provider}): direct result differs"
    assert _same([x for x in b if isinstance(x, torch.Tensor)], [x for x in a if isinstance(x, torch.Tensor)])


def test_the_dispatcher_is_kept_wherever_it_could_do_more(monkeypatch):
    """Each condition alone sends the call through `torch.ops.repro`: a dispatch mode (what the
    CPU tape and the lint are), a function mode, gradients on, a keyword argument, a meta tensor,
    a tensor subclass, an argument of another type."""
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode

    class Seen(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    class Watched(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    x, w = torch.randn(3, 8), torch.zeros(8)
    fn, n = _spy(monkeypatch, "rms_norm")

    def through(call, grad=False):
        before = n[0]
        with torch.set_grad_enabled(grad):
            call()
        return n[0] - before
    assert through(lambda: fn(x, w, 1e-6)) == 0  # the direct call
    with Seen():
        assert through(lambda: fn(x, w, 1e-6)) == 1
    with Watched():
        assert through(lambda: fn(x, w, 1e-6)) == 1
    assert through(lambda: fn(x, w, 1e-6), grad=True) == 1
    assert through(lambda: fn(x, w, eps=1e-6)) == 1
    assert through(lambda: fn(x.to("meta"), w.to("meta"), 1e-6)) == 1
    assert through(lambda: fn(x, torch.nn.Parameter(w, requires_grad=False), 1e-6)) == 1
    with pytest.raises(Exception):  # a list where the schema has a float: the dispatcher refuses it
        fn(x, w, [1e-6])
    assert n[0] == 7  # six conditions above, and the list
