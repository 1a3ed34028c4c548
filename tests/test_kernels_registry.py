"""The kernel provider registry: selection, errors, absent providers, env configuration."""
from unittest import mock

import pytest
import torch

import kernels
from kernels import registry
from kernels.registry import KernelSelectionError
from kernels.samples import sample_args


@pytest.fixture(autouse=True)
def clean_registry():
    registry.reset()
    yield
    registry.reset()


def test_every_op_registered_with_reference():
    assert set(registry.ops()) == set(kernels.ops.OPS)
    for op in registry.ops():
        assert registry.providers(op)["reference"] == (True, "always available")


def test_defaults_prefer_torch_then_reference():
    for op in registry.ops():
        expected = "torch" if "torch" in registry.providers(op) else "reference"
        assert registry.selected(op) == expected
    assert registry.selected("w8a8_linear") == "torch"
    assert registry.selected("gdn_gating") == "reference"


def test_unknown_op_and_provider_raise_naming_them():
    with pytest.raises(KernelSelectionError, match="no_such_op"):
        registry.select("no_such_op", "torch")
    with pytest.raises(KernelSelectionError, match="cuda_magic"):
        registry.select("w8a8_linear", "cuda_magic")
    with pytest.raises(KernelSelectionError, match="no_such_op"):
        registry.providers("no_such_op")
    # kernels raises its own error (kernels.errors), a ValueError; it does not depend on repro
    assert issubclass(KernelSelectionError, ValueError)
    assert KernelSelectionError.__module__ == "kernels.errors"


def test_fla_reported_absent_with_reason_and_selecting_it_raises():
    if registry.providers("gated_delta_rule_decode")["fla"][0]:
        pytest.skip("fla is present here")
    for op in ("gated_delta_rule_decode", "gated_delta_rule_prefill"):
        ok, reason = registry.providers(op)["fla"]
        assert not ok and reason
        with pytest.raises(KernelSelectionError, match="absent") as e:
            registry.select(op, "fla")
        assert "fla" in str(e.value) and op in str(e.value)
    with pytest.raises(KernelSelectionError):
        registry.configure("gdn=fla")
    assert registry.selected("gated_delta_rule_decode") == "torch"


def test_vllm_xpu_reported_absent_without_xpu():
    if registry.providers("moe")["vllm_xpu"][0]:
        pytest.skip("vllm-xpu-kernels present here")
    ok, reason = registry.providers("rms_norm")["vllm_xpu"]
    assert not ok and reason
    with pytest.raises(KernelSelectionError, match="vllm_xpu"):
        registry.select("rms_norm", "vllm_xpu")


def test_configure_groups_and_all_or_nothing():
    got = registry.configure(" w8a8_linear=reference , gdn=reference,conv1d=torch ")
    assert got["w8a8_linear"] == "reference"
    assert registry.selected("gated_delta_rule_decode") == "reference"
    assert registry.selected("gdn_gating") == "reference"
    assert registry.selected("causal_conv1d_fn") == "torch"
    registry.reset()
    with pytest.raises(KernelSelectionError, match="bogus"):
        registry.configure("w8a8_linear=reference,moe=bogus")
    assert registry.selected("w8a8_linear") == "torch"  # nothing applied
    with pytest.raises(KernelSelectionError, match="OP=PROVIDER"):
        registry.configure("w8a8_linear")
    registry.configure("all=reference")
    assert {registry.selected(op) for op in registry.ops()} == {"reference"}


def test_configure_from_env():
    registry.configure_from_env({"REPRO_KERNELS": "moe=reference"})
    assert registry.selected("moe") == "reference"
    registry.configure_from_env({})
    assert registry.selected("moe") == "reference"
    with pytest.raises(KernelSelectionError, match="REPRO_KERNELS"):
        registry.configure_from_env({"REPRO_KERNELS": "moe=nope"})


def test_using_restores_previous_selection():
    registry.select("moe", "reference")
    with registry.using(moe="torch", w8a8_linear="reference"):
        assert registry.selected("moe") == "torch"
        assert registry.selected("w8a8_linear") == "reference"
    assert registry.selected("moe") == "reference"
    assert registry.selected("w8a8_linear") == "torch"
    with pytest.raises(KernelSelectionError):
        with registry.using(moe="torch", rms_norm="nope"):
            pass
    assert registry.selected("moe") == "reference"


def test_defaults_forgets_selections_for_a_while():
    registry.select("moe", "reference")
    with registry.using(w8a8_linear="reference"):
        with registry.defaults():
            assert registry.selected("moe") == "torch" and registry.selected("w8a8_linear") == "torch"
        assert registry.selected("moe") == "reference" and registry.selected("w8a8_linear") == "reference"
    assert registry.selected("moe") == "reference" and registry.selected("w8a8_linear") == "torch"


def test_op_body_dispatches_to_selected_provider_at_call_time():
    calls = []
    real = registry._providers["w8a8_linear"]["reference"]

    def spy(*args):
        calls.append(args)
        return real.fn(*args)

    args = sample_args("w8a8_linear")
    with mock.patch.dict(registry._providers["w8a8_linear"], {"reference": registry._Provider(spy, real.available)}):
        torch.ops.repro.w8a8_linear(*args)
        assert not calls
        with registry.using(w8a8_linear="reference"):
            torch.ops.repro.w8a8_linear(*args)
        assert len(calls) == 1


def test_describe_lists_everything():
    d = registry.describe()
    assert d["gated_delta_rule_decode"]["selected"] == "torch"
    assert set(d["gated_delta_rule_decode"]["providers"]) == {"reference", "torch", "fla", "triton"}


def test_batch_invariance_is_declared_per_provider():
    # ours are batch-invariant on purpose, and so is FLA's decode called by keyword (measured);
    # FLA's chunked prefill (not measured), vllm-xpu-kernels' norm (work-group size chosen by
    # the token count) and its fused GDN core and that core's rules (a prefill in the batch sends
    # every row through the chunk kernel) are declared batch-variant
    variant = {(op, name) for op in registry.ops() for name in registry.providers(op)
               if not registry.batch_invariant(op, name)}
    assert variant == {("gated_delta_rule_prefill", "fla"), ("rms_norm", "vllm_xpu"), ("gdn_attention", "vllm_xpu"),
                       ("gdn_attention", "xpu_semantics")}
    assert registry.batch_invariant("moe", "vllm_xpu")  # fixed-order router logits, row-wise top-k
    assert registry.batch_invariant("rms_norm") is True  # the selected (default) provider
    d = registry.describe()
    assert d["rms_norm"]["providers"]["vllm_xpu"]["batch_invariant"] is False
    with pytest.raises(KernelSelectionError, match="nope"):
        registry.batch_invariant("rms_norm", "nope")


def test_the_reference_of_each_selected_provider_is_what_an_independent_copy_runs():
    """`references()`: `reference` for every op, except a fused GDN core, whose reference is the
    plain-torch statement of its kernel's rules (the composition's semantics are another's)."""
    assert set(registry.references().values()) == {"reference"}
    registry.configure("gdn=xpu_semantics")
    refs = registry.references()
    assert refs["gdn_attention"] == "xpu_semantics" and refs["gated_delta_rule_decode"] == "reference"
    assert registry.where("gdn_attention", "vllm_xpu") == ("kernels.gdn.vllm_xpu", "gdn_attention_vllm_xpu")
