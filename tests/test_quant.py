"""Quark W8A8 INT8: config parsing (which module is quantised) and the quantisation math."""
import pytest
import torch

from repro.errors import CheckpointError
from repro.model.quant import (BF16, W8A8_INT8, QuantScheme, dequantize, quantize_per_token, quantize_weight,
                               quark_config)


def _w(n=64, k=48, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, k, generator=g) / k ** 0.5).to(torch.bfloat16)


def test_scale_is_amax_over_127_5():
    w = _w()
    _, s = quantize_weight(w)
    assert s.dtype == torch.float32 and s.shape == (64,)
    assert torch.equal(s, w.float().abs().amax(dim=1) / 127.5)


def test_round_trip_within_half_a_step_and_minus_128_occurs():
    w = _w(256, 64)
    q, s = quantize_weight(w)
    assert q.dtype == torch.int8 and q.shape == w.shape
    err = (dequantize(q, s) - w.float()).abs().amax(dim=1)
    assert torch.all(err <= 0.5 * s * (1 + 1e-4))  # within one int8 step, in fact half of one
    assert (q == -128).any(), "Quark's full-range symmetric int8 uses -128"
    assert int(q.min()) == -128 and int(q.max()) == 127


def test_round_half_even_and_clamp():
    # amax 127.5 makes the scale exactly 1.0: x/scale are the values themselves
    x = torch.tensor([[127.5, 0.5, 1.5, 2.5, -0.5, -127.5, 3.49]])
    q, s = quantize_weight(x)
    assert float(s) == 1.0
    assert q.tolist() == [[127, 0, 2, 2, 0, -128, 3]]


def test_zero_row_is_guarded():
    w = torch.zeros(3, 8, dtype=torch.bfloat16)
    q, s = quantize_weight(w)
    assert torch.all(q == 0) and torch.all(s > 0) and torch.all(torch.isfinite(s))


def test_bf16_scale_is_the_scale_used():
    w = _w(32, 40, seed=3)
    q, s = quantize_weight(w, scale_dtype=torch.bfloat16)
    assert torch.equal(s, s.to(torch.bfloat16).float())
    assert torch.equal(s, (w.float().abs().amax(1) / 127.5).to(torch.bfloat16).float())
    assert torch.equal(q, torch.round(w.float() / s[:, None]).clamp(-128, 127).to(torch.int8))


def test_stacked_experts_and_per_token():
    w = torch.stack([_w(16, 8, seed=i) for i in range(3)])
    q, s = quantize_weight(w)
    assert q.shape == (3, 16, 8) and s.shape == (3, 16)
    q1, s1 = quantize_weight(w[1])
    assert torch.equal(q[1], q1) and torch.equal(s[1], s1)
    x = torch.randn(5, 8)
    qx, sx = quantize_per_token(x)
    assert sx.shape == (5,) and torch.equal(sx, x.abs().amax(1) / 127.5)


def test_scheme_from_quark_config():
    qc = quark_config(exclude=["lm_head", "model.layers.0.mlp.gate", "*.shared_expert_gate"])
    sch = QuantScheme.from_config(qc)
    assert sch.quantized and sch.quant_method == "quark" and sch.version == "0.13"
    assert sch.scheme_for("model.layers.0.mlp.experts.3.gate_proj") == W8A8_INT8
    assert sch.scheme_for("model.layers.0.linear_attn.in_proj_qkv") == W8A8_INT8
    assert sch.scheme_for("model.layers.0.mlp.gate") == BF16
    assert sch.scheme_for("model.layers.1.mlp.gate") == W8A8_INT8  # explicit names: only layer 0 excluded
    assert sch.scheme_for("model.layers.7.mlp.shared_expert_gate") == BF16
    assert sch.scheme_for("lm_head") == BF16
    assert qc["export"]["pack_method"] == "reorder" and qc["export"]["weight_format"] == "real_quantized"
    assert qc["layer_quant_config"] == {} and qc["layer_type_quant_config"] == {}


def test_layer_quant_config_overrides_global_and_regex_exclude():
    qc = quark_config(exclude=["re:.*\\.self_attn\\..*"])
    qc["global_quant_config"] = {"weight": None, "input_tensors": None, "output_tensors": None, "bias": None}
    qc["layer_quant_config"] = {"*mlp.experts*": quark_config()["global_quant_config"]}
    sch = QuantScheme.from_config(qc)
    assert sch.scheme_for("model.layers.2.mlp.experts.0.down_proj") == W8A8_INT8
    assert sch.scheme_for("model.layers.2.mlp.experts.gate_up_proj") == W8A8_INT8
    assert sch.scheme_for("model.layers.2.linear_attn.out_proj") == BF16
    qc["layer_quant_config"]["*self_attn*"] = quark_config()["global_quant_config"]
    assert QuantScheme.from_config(qc).scheme_for("model.layers.3.self_attn.q_proj") == BF16  # exclude wins


def test_no_quantization_config_is_all_bf16():
    sch = QuantScheme.from_config(None)
    assert not sch.quantized and sch.scheme_for("model.layers.0.mlp.experts.0.up_proj") == BF16


@pytest.mark.parametrize("method", ["fp8", "gptq", "compressed-tensors", None])
def test_unknown_quant_method_is_refused(method):
    qc = quark_config()
    qc["quant_method"] = method
    with pytest.raises(CheckpointError, match=f"quant_method {method!r}"):
        QuantScheme.from_config(qc, source="x/config.json")


@pytest.mark.parametrize("part,key,value", [
    ("weight", "dtype", "fp8_e4m3"),
    ("weight", "qscheme", "per_tensor"),
    ("weight", "symmetric", False),
    ("input_tensors", "is_dynamic", False),
    ("input_tensors", "qscheme", "per_tensor"),
    ("input_tensors", "dtype", "uint8"),
])
def test_other_quark_schemes_are_refused(part, key, value):
    qc = quark_config()
    qc["global_quant_config"][part][key] = value
    with pytest.raises(CheckpointError, match=f"{key}={value!r}") as e:
        QuantScheme.from_config(qc, source="ckpt/config.json")
    assert "ckpt/config.json" in str(e.value) and part in str(e.value)


def test_weight_only_int8_is_refused():
    qc = quark_config()
    qc["global_quant_config"]["input_tensors"] = None
    with pytest.raises(CheckpointError, match="input_tensors"):
        QuantScheme.from_config(qc)
