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
         for sentinel in ((-1, 0) if op in ("causal_conv1d_fn", "causal_conv1d_update",
                                            "gated_delta_rule_decode", "gated_delta_rule_prefill") else (-1,))]


@pytest.mark.parametrize("op,provider,sentinel", CASES)
def test_opcheck(op, provider, sentinel, device):
    args = sample_args(op, device=device, seed=1, sentinel=sentinel)
    assert all(a.device.type == torch.device(device).type for a in args if isinstance(a, torch.Tensor))
    with registry.using(**{op: provider}):
        torch.library.opcheck(getattr(torch.ops.repro, op), args)


@pytest.mark.parametrize("op", OPS)
def test_samples_are_built_on_the_device_asked_for(op):
    """Every tensor of every op's sample on the device given (the meta device stands in for a GPU
    here: a CPU tensor in a GPU sample would fail opcheck there, as in issue 15)."""
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
                "gated_delta_rule_decode": {"ssm_state"}, "gated_delta_rule_prefill": {"ssm_state"}}
    for op in OPS:
        schema = getattr(torch.ops.repro, op).default._schema
        mutated = {a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write}
        assert mutated == expected.get(op, set()), op
