"""make_tiny writes the real Quark layout; inspect describes it; default checkpoint is cached atomically."""
import json
import os
import time

import pytest
import torch
from safetensors import safe_open

from repro.model import tiny
from repro.errors import BadInput
from repro.model.inspect import format_inspect, inspect
from repro.model.quant import BF16, W8A8_INT8

P = "model.language_model.layers."


def _tensors(path):
    with safe_open(str(path / "model.safetensors"), framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def test_make_tiny_is_fast_and_deterministic(tmp_path):
    t0 = time.perf_counter()
    a = tiny.make_tiny(tmp_path / "a", seed=1)
    assert time.perf_counter() - t0 < 2.0
    b = tiny.make_tiny(tmp_path / "b", seed=1)
    c = tiny.make_tiny(tmp_path / "c", seed=2)
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()
    assert (a / "model.safetensors").read_bytes() != (c / "model.safetensors").read_bytes()
    assert sorted(os.listdir(tmp_path)) == ["a", "b", "c"]  # no temp dirs left behind


def test_production_layout_matches_a_quark_export(tmp_path):
    p = tiny.make_tiny(tmp_path / "m")
    cfg = json.loads((p / "config.json").read_text())
    qc = cfg["quantization_config"]
    assert qc["quant_method"] == "quark" and qc["export"]["pack_method"] == "reorder"
    assert qc["global_quant_config"]["weight"]["qscheme"] == "per_channel"
    assert qc["global_quant_config"]["input_tensors"]["is_dynamic"] is True
    assert {"lm_head", P + "0.mlp.gate", P + "3.mlp.shared_expert_gate"} <= set(qc["exclude"])
    assert not any("experts" in e or "in_proj" in e for e in qc["exclude"])
    t = _tensors(p)
    w = P + "0.linear_attn.in_proj_qkv"
    assert t[w + ".weight"].dtype == torch.int8 and t[w + ".weight"].shape == (128, 64)
    assert t[w + ".weight_scale"].dtype == torch.bfloat16 and t[w + ".weight_scale"].shape == (128,)
    assert t[w + ".weight_zero_point"].dtype == torch.int8 and not t[w + ".weight_zero_point"].any()
    assert not any(k.endswith("input_scale") for k in t)
    assert t[P + "0.mlp.gate.weight"].dtype == torch.bfloat16
    assert t["lm_head.weight"].dtype == torch.bfloat16
    assert t[P + "3.self_attn.q_proj.weight"].shape == (2 * 4 * 16, 64)  # query + output gate
    assert t[P + "3.self_attn.q_proj.weight"].dtype == torch.int8
    assert t[P + "0.linear_attn.conv1d.weight"].shape == (128, 1, 4)
    a_log = t[P + "0.linear_attn.A_log"].float()
    assert torch.all(a_log >= 0) and torch.all(a_log <= torch.log(torch.tensor(16.0)) + 0.01)
    assert (P + "3.linear_attn.in_proj_qkv.weight") not in t  # layer 3 is full attention
    assert any(k.startswith("mtp.") for k in t) and any(k.startswith("model.visual.") for k in t)


def test_experts_recipe_and_no_quant(tmp_path):
    t = _tensors(tiny.make_tiny(tmp_path / "e", quantised="experts"))
    assert t[P + "1.mlp.experts.5.down_proj.weight"].dtype == torch.int8
    assert t[P + "1.linear_attn.out_proj.weight"].dtype == torch.bfloat16
    assert t[P + "1.mlp.shared_expert.up_proj.weight"].dtype == torch.bfloat16
    p = tiny.make_tiny(tmp_path / "n", quantised="none")
    assert "quantization_config" not in json.loads((p / "config.json").read_text())
    assert all(v.dtype == torch.bfloat16 for v in _tensors(p).values())


def test_inspect_lists_gdn_and_full_layers_with_w8a8_modules(tmp_path):
    d = inspect(tiny.make_tiny(tmp_path / "m"))
    assert [lay["type"] for lay in d["layers"]] == ["linear_attention"] * 3 + ["full_attention"]
    m0, m3 = d["layers"][0]["modules"], d["layers"][3]["modules"]
    assert m0["in_proj_qkv"] == W8A8_INT8 and m0["out_proj"] == W8A8_INT8
    assert m0["experts.*.gate_proj"] == W8A8_INT8 and m0["gate"] == BF16 and m0["shared_expert_gate"] == BF16
    assert m3["q_proj"] == W8A8_INT8 and "in_proj_qkv" not in m3
    assert d["head"]["modules"]["lm_head"] == BF16
    assert d["problems"] == [] and d["ignored_tensors"] == 3
    assert d["total_bytes"] == sum(lay["bytes"] for lay in d["layers"]) + d["head"]["bytes"]
    text = format_inspect(d)
    assert "GDN" in text and "full" in text and "in_proj_qkv" in text and "problems: none" in text
    json.dumps(d)


def test_write_is_atomic(tmp_path, monkeypatch):
    def boom(*a, **k):
        raise RuntimeError("disk full")

    monkeypatch.setattr(tiny, "save_file", boom)
    with pytest.raises(RuntimeError):
        tiny.make_tiny(tmp_path / "x")
    assert os.listdir(tmp_path) == []


def test_existing_target_is_kept_unless_overwrite(tmp_path):
    p = tiny.make_tiny(tmp_path / "m", seed=0)
    before = (p / "model.safetensors").read_bytes()
    with pytest.raises(BadInput, match="already exists"):
        tiny.make_tiny(p, seed=1)
    assert (p / "model.safetensors").read_bytes() == before
    tiny.make_tiny(p, seed=1, overwrite=True)
    assert (p / "model.safetensors").read_bytes() != before
    assert sorted(os.listdir(tmp_path)) == ["m"]


def test_bad_options_are_refused(tmp_path):
    with pytest.raises(BadInput, match="naming"):
        tiny.make_tiny(tmp_path / "a", naming="interleaved")
    with pytest.raises(BadInput, match="preset"):
        tiny.make_tiny(tmp_path / "a", preset="huge")


def test_default_checkpoint_is_generated_once(tmp_path, monkeypatch):
    p = tiny.default_checkpoint(tmp_path / "cache")
    assert p == tmp_path / "cache" / "tiny-seed0-v1" and (p / "config.json").is_file()
    mtime = (p / "model.safetensors").stat().st_mtime_ns
    monkeypatch.setattr(tiny, "make_tiny", lambda *a, **k: pytest.fail("regenerated"))
    assert tiny.default_checkpoint(tmp_path / "cache") == p
    assert (p / "model.safetensors").stat().st_mtime_ns == mtime
    assert sorted(os.listdir(tmp_path / "cache")) == ["tiny-seed0-v1"]
