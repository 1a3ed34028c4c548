"""Checkpoint loading on real safetensors files: layouts, lazy reads, TP shards, and refusals."""
import json
import os

import pytest
import torch
from safetensors.torch import load_file, save_file

from repro.model.checkpoint import (Checkpoint, deinterleave_ba, deinterleave_qkvz, interleave_ba, interleave_qkvz,
                                    merge_shards)
from repro.model.config import TINY, ConfigError
from repro.errors import BadInput, CheckpointError
from repro.model.quant import quantize_weight
from repro.model.tiny import make_tiny
from repro.model.weights import tensors_of

P = "model.language_model.layers."
# Tiny has Hk=2, Hv=4: TP4 needs more heads.
WIDE = TINY.replace(linear_num_key_heads=4, linear_num_value_heads=8)


def _rewrite(file, fn):
    d = load_file(str(file))
    fn(d)
    save_file(d, str(file), metadata={"format": "pt"})


def _equal(a, b):
    ta, tb = tensors_of(a), tensors_of(b)
    assert ta.keys() == tb.keys()
    for k in ta:
        assert ta[k].dtype == tb[k].dtype and torch.equal(ta[k], tb[k]), k


def test_fused_qkvz_layout_is_the_qwen3_next_one():
    # transformers' Qwen3NextGatedDeltaNet.fix_query_key_value_ordering, restated: the projection output
    # is viewed as [Hk, 2*dk + 2*r*dv] and split per key head into q (dk), k (dk), v (r*dv), z (r*dv);
    # v and z then read as [Hv, dv] (value head j = g*r + t); ba as [Hk, 2r] split into b (r), a (r).
    Hk, Hv, dk, dv = 2, 6, 3, 2
    r = Hv // Hk
    out = torch.arange(Hk * (2 * dk + 2 * r * dv))  # feature index of each fused output row
    q, k, v, z = [], [], [], []
    for g in range(Hk):
        base = g * (2 * dk + 2 * r * dv)
        q += list(range(base, base + dk))
        k += list(range(base + dk, base + 2 * dk))
        v += list(range(base + 2 * dk, base + 2 * dk + r * dv))
        z += list(range(base + 2 * dk + r * dv, base + 2 * dk + 2 * r * dv))
    qkv, zz = deinterleave_qkvz(out, Hk, dk, dv, r)
    assert qkv.tolist() == q + k + v and zz.tolist() == z
    assert torch.equal(interleave_qkvz(qkv, zz, Hk, dk, dv, r), out)
    ba = torch.arange(2 * Hv)
    b, a = deinterleave_ba(ba, Hk, r)
    assert b.tolist() == [g * 2 * r + t for g in range(Hk) for t in range(r)]
    assert a.tolist() == [g * 2 * r + r + t for g in range(Hk) for t in range(r)]
    assert torch.equal(interleave_ba(b, a, Hk, r), ba)


@pytest.fixture(scope="module")
def prod(tmp_path_factory):
    return make_tiny(tmp_path_factory.mktemp("ck") / "prod")


def test_load_layer_shapes_and_dtypes(prod):
    ck = Checkpoint.open(prod)
    assert ck.prefix == "model.language_model." and ck.check_all() == []
    w = ck.load_layer(0)
    c = ck.config
    g = w.gdn
    assert g.in_proj_qkv.weight.dtype == torch.int8 and g.in_proj_qkv.weight.shape == (c.conv_dim, c.hidden_size)
    assert g.in_proj_qkv.scale.dtype == torch.float32 and g.in_proj_qkv.scale.shape == (c.conv_dim,)
    assert g.out_proj.weight.shape == (c.hidden_size, c.value_dim) and g.out_proj.quantized
    assert w.moe.experts.w13.shape == (c.num_experts, 2 * c.moe_intermediate_size, c.hidden_size)
    assert w.moe.experts.w13_scale.shape == (c.num_experts, 2 * c.moe_intermediate_size)
    assert w.moe.experts.w2.shape == (c.num_experts, c.hidden_size, c.moe_intermediate_size)
    assert w.moe.gate.dtype == torch.bfloat16 and w.moe.shared_expert_gate.shape == (1, c.hidden_size)
    full = ck.load_layer(3)
    assert full.gdn is None and full.layer_type == "full_attention" and full.moe.experts.quantized


def test_quantised_values_are_quark_math_of_the_bf16_weights(tmp_path):
    q = Checkpoint.open(make_tiny(tmp_path / "q", seed=5)).load_layer(1)
    f = Checkpoint.open(make_tiny(tmp_path / "f", seed=5, quantised="none")).load_layer(1)
    assert not f.gdn.in_proj_qkv.quantized and f.gdn.in_proj_qkv.weight.dtype == torch.bfloat16
    for ql, fw in [(q.gdn.in_proj_qkv, f.gdn.in_proj_qkv.weight), (q.gdn.out_proj, f.gdn.out_proj.weight),
                   (q.moe.shared_down, f.moe.shared_down.weight)]:
        qq, ss = quantize_weight(fw, scale_dtype=torch.bfloat16)
        assert torch.equal(ql.weight, qq) and torch.equal(ql.scale, ss)
    qq, ss = quantize_weight(f.moe.experts.w13, scale_dtype=torch.bfloat16)
    assert torch.equal(q.moe.experts.w13, qq) and torch.equal(q.moe.experts.w13_scale, ss)
    assert torch.equal(q.gdn.A_log, f.gdn.A_log) and torch.equal(q.moe.gate, f.moe.gate)


def test_no_quantization_config_loads_all_bf16(tmp_path):
    ck = Checkpoint.open(make_tiny(tmp_path / "n", quantised="none"))
    assert not ck.quant.quantized
    w = ck.load_layer(0)
    for name, t in tensors_of(w).items():
        assert t.dtype == torch.bfloat16, name
    assert not w.moe.experts.quantized and w.moe.experts.w13_scale is None and w.gdn.out_proj.scale is None


def test_lazy_loading_reads_only_the_requested_layer(prod):
    ck = Checkpoint.open(prod)
    assert ck.stats.tensors_read == 0
    ck.load_layer(1)
    names = ck.stats.names_read
    assert names and all(n.startswith(P + "1.") for n in names)
    assert ck.stats.tensors_read == len(names) and 0 < ck.stats.bytes_read <= ck.layer_bytes(1)
    ck.stats.reset()
    ck.load_layer(2, tp_rank=1, tp_size=2)
    assert all(n.startswith(P + "2.") for n in ck.stats.names_read)
    assert ck.stats.bytes_read < 0.6 * ck.layer_bytes(2)  # a TP2 shard reads about half the layer
    ck.stats.reset()
    h = ck.load_head(rows=[7, 3, 3])
    assert set(ck.stats.names_read) == {"model.language_model.embed_tokens.weight",
                                        "model.language_model.norm.weight", "lm_head.weight"}
    full = ck.load_head()
    assert torch.equal(h.lm_head, full.lm_head[[7, 3, 3]]) and torch.equal(h.embed_tokens, full.embed_tokens[[7, 3, 3]])
    assert torch.equal(ck.load_head(rows=range(10, 20)).lm_head, full.lm_head[10:20])


@pytest.mark.parametrize("quantised", ["production", "experts", "none"])
def test_naming_schemes_and_expert_layouts_load_identically(tmp_path, quantised):
    ref = Checkpoint.open(make_tiny(tmp_path / "ref", seed=3, quantised=quantised))
    for naming, experts, mm, shards in [("fused", "per_expert", True, 1), ("split", "fused", False, 2),
                                        ("fused", "fused", True, 2)]:
        ck = Checkpoint.open(make_tiny(tmp_path / f"{naming}-{experts}-{mm}", seed=3, quantised=quantised,
                                       naming=naming, experts=experts, multimodal=mm, shards=shards))
        assert ck.layout(0) == {"gdn": naming, "experts": experts} and ck.check_all() == []
        for layer in range(4):
            _equal(ck.load_layer(layer), ref.load_layer(layer))
        _equal(ck.load_layer(1, tp_rank=1, tp_size=2), ref.load_layer(1, tp_rank=1, tp_size=2))
        _equal(ck.load_head(), ref.load_head())


@pytest.mark.parametrize("n,preset,naming,experts", [(2, TINY, "split", "per_expert"), (2, TINY, "fused", "fused"),
                                                     (4, WIDE, "split", "fused"), (4, WIDE, "fused", "per_expert")])
def test_tp_shards_concatenate_back(tmp_path, n, preset, naming, experts):
    ck = Checkpoint.open(make_tiny(tmp_path / "m", preset=preset, naming=naming, experts=experts))
    c = ck.config
    full = ck.load_layer(0)
    shards = [ck.load_layer(0, tp_rank=r, tp_size=n) for r in range(n)]
    _equal(merge_shards(shards), full)
    s1 = shards[1]
    assert s1.tp_rank == 1 and s1.tp_size == n
    hv, dv, i = c.linear_num_value_heads // n, c.linear_value_head_dim, c.moe_intermediate_size // n
    assert s1.gdn.in_proj_qkv.weight.shape[0] == c.conv_dim // n
    # rank 1 holds the second block of each part, independent of merge_shards
    assert torch.equal(s1.gdn.in_proj_z.weight, full.gdn.in_proj_z.weight[hv * dv:2 * hv * dv])
    assert torch.equal(s1.gdn.in_proj_z.scale, full.gdn.in_proj_z.scale[hv * dv:2 * hv * dv])
    kd = c.key_dim // n
    assert torch.equal(s1.gdn.in_proj_qkv.weight[kd:2 * kd], full.gdn.in_proj_qkv.weight[c.key_dim + kd:c.key_dim + 2 * kd])
    assert torch.equal(s1.gdn.conv1d_weight[:kd], full.gdn.conv1d_weight[kd:2 * kd])
    assert torch.equal(s1.gdn.A_log, full.gdn.A_log[hv:2 * hv])
    assert torch.equal(s1.gdn.out_proj.weight, full.gdn.out_proj.weight[:, hv * dv:2 * hv * dv])
    assert torch.equal(s1.gdn.out_proj.scale, full.gdn.out_proj.scale)  # row-parallel: scale not split
    I = c.moe_intermediate_size
    assert torch.equal(s1.moe.experts.w13[:, i:], full.moe.experts.w13[:, I + i:I + 2 * i])  # up_r
    assert torch.equal(s1.moe.experts.w13_scale[:, :i], full.moe.experts.w13_scale[:, i:2 * i])  # gate_r
    assert torch.equal(s1.moe.experts.w2, full.moe.experts.w2[:, :, i:2 * i])
    assert torch.equal(s1.moe.experts.w2_scale, full.moe.experts.w2_scale)
    assert torch.equal(s1.moe.gate, full.moe.gate)


def test_tp_size_not_dividing_heads_is_refused(prod):
    ck = Checkpoint.open(prod)
    with pytest.raises(CheckpointError, match="linear_num_key_heads = 2"):
        ck.load_layer(0, tp_rank=0, tp_size=4)
    with pytest.raises(CheckpointError, match="tp_size 3 does not divide"):
        ck.load_layer(0, tp_rank=0, tp_size=3)
    with pytest.raises(CheckpointError, match="tp_rank"):
        ck.load_layer(0, tp_rank=2, tp_size=2)


def test_layer_index_is_checked(prod):
    ck = Checkpoint.open(prod)
    with pytest.raises(ConfigError, match="out of range"):
        ck.load_layer(4)
    with pytest.raises(BadInput, match="must be an int"):
        ck.load_layer("1")


# ----------------------------------------------------------------- corrupted copies


def _one(tmp_path, **kw):
    p = make_tiny(tmp_path / "c", **kw)
    return p, p / "model.safetensors"


def _refused(path, *needles, layer=0):
    with pytest.raises(CheckpointError) as e:
        Checkpoint.open(path).load_layer(layer)
    for s in needles:
        assert s in str(e.value), (s, str(e.value))
    return str(e.value)


def test_int8_weight_cast_to_float_is_refused(tmp_path):
    p, f = _one(tmp_path)
    name = P + "0.mlp.experts.2.up_proj.weight"
    _rewrite(f, lambda d: d.__setitem__(name, d[name].float()))
    msg = _refused(p, name, str(f), "F32")
    assert "W8A8" in msg
    assert any(name in prob for prob in Checkpoint.open(p).check_all())
    Checkpoint.open(p).load_layer(1)  # other layers still load


def test_deleted_tensor_is_refused(tmp_path):
    p, f = _one(tmp_path)
    name = P + "0.linear_attn.dt_bias"
    _rewrite(f, lambda d: d.pop(name))
    _refused(p, name, "missing", str(f))


def test_int8_without_scale_is_refused(tmp_path):
    p, f = _one(tmp_path)
    name = P + "0.linear_attn.out_proj.weight_scale"
    _rewrite(f, lambda d: d.pop(name))
    _refused(p, name, "no scale")


def test_scale_shape_mismatch_is_refused(tmp_path):
    p, f = _one(tmp_path)
    name = P + "0.mlp.shared_expert.down_proj.weight_scale"
    _rewrite(f, lambda d: d.__setitem__(name, torch.ones(65, dtype=torch.bfloat16)))
    _refused(p, name, "[65]", "[64]")


def test_scale_as_column_and_fp32_is_accepted(tmp_path):
    p, f = _one(tmp_path)
    name = P + "0.linear_attn.in_proj_z.weight_scale"
    ref = Checkpoint.open(p).load_layer(0)
    _rewrite(f, lambda d: d.__setitem__(name, d[name].float()[:, None].contiguous()))
    _equal(Checkpoint.open(p).load_layer(0), ref)


def test_nonzero_zero_point_is_refused(tmp_path):
    p, f = _one(tmp_path)
    name = P + "0.linear_attn.in_proj_qkv.weight_zero_point"

    def poke(d):
        d[name][5] = 3

    _rewrite(f, poke)
    _refused(p, name, "non-zero", "= 3")


def test_missing_zero_point_is_accepted(tmp_path):
    p, f = _one(tmp_path)
    ref = Checkpoint.open(p).load_layer(0)
    _rewrite(f, lambda d: [d.pop(k) for k in list(d) if k.endswith("weight_zero_point")])
    _equal(Checkpoint.open(p).load_layer(0), ref)


def test_truncated_shard_is_refused(tmp_path):
    p = make_tiny(tmp_path / "c", shards=2)
    f = p / "model-00002-of-00002.safetensors"
    data = f.read_bytes()
    f.write_bytes(data[:-100])
    with pytest.raises(CheckpointError, match="truncated") as e:
        Checkpoint.open(p)
    assert str(f) in str(e.value)


def test_missing_shard_listed_in_index_is_refused(tmp_path):
    p = make_tiny(tmp_path / "c", shards=2)
    os.remove(p / "model-00001-of-00002.safetensors")
    with pytest.raises(CheckpointError, match="model-00001-of-00002.safetensors.*missing"):
        Checkpoint.open(p)


def test_index_pointing_at_the_wrong_shard_names_it(tmp_path):
    p = make_tiny(tmp_path / "c", shards=2)
    idx = json.loads((p / "model.safetensors.index.json").read_text())
    name = P + "0.linear_attn.A_log"
    f1 = p / idx["weight_map"][name]
    _rewrite(f1, lambda d: d.pop(name))
    _refused(p, name, str(f1), "does not contain")


def test_missing_config_and_directory_are_refused(tmp_path):
    p, _ = _one(tmp_path)
    os.remove(p / "config.json")
    with pytest.raises(CheckpointError, match="config.json"):
        Checkpoint.open(p)
    with pytest.raises(CheckpointError, match="does not exist"):
        Checkpoint.open(tmp_path / "nowhere")


def test_unknown_quant_method_in_config_is_refused(tmp_path):
    p, _ = _one(tmp_path)
    cfg = json.loads((p / "config.json").read_text())
    cfg["quantization_config"]["quant_method"] = "gptq"
    (p / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="quant_method 'gptq'.*") as e:
        Checkpoint.open(p)
    assert "config.json" in str(e.value)


def test_scheme_and_stored_dtype_must_agree(tmp_path):
    # the config says everything is BF16, but the tensors are int8
    p, _ = _one(tmp_path)
    cfg = json.loads((p / "config.json").read_text())
    del cfg["quantization_config"]
    (p / "config.json").write_text(json.dumps(cfg))
    _refused(p, "is I8", "no quantization_config")
    assert len(Checkpoint.open(p).check_all()) > 100


def test_prefix_must_match_the_config(tmp_path):
    p, _ = _one(tmp_path)  # multimodal names
    (p / "config.json").write_text(json.dumps(TINY.replace(multimodal=False).to_hf()))
    with pytest.raises(CheckpointError, match="model.language_model.layers"):
        Checkpoint.open(p)


def test_tied_embeddings_without_lm_head(tmp_path):
    p, f = _one(tmp_path, quantised="none")
    cfg = json.loads((p / "config.json").read_text())
    cfg["tie_word_embeddings"] = True
    (p / "config.json").write_text(json.dumps(cfg))
    _rewrite(f, lambda d: d.pop("lm_head.weight"))
    ck = Checkpoint.open(p)
    h = ck.load_head(rows=[1, 2])
    assert h.lm_head is h.embed_tokens and ck.check_all() == []


def test_check_all_reports_without_raising(tmp_path):
    p, f = _one(tmp_path)
    _rewrite(f, lambda d: (d.pop(P + "2.mlp.experts.1.down_proj.weight"),
                           d.__setitem__(P + "0.input_layernorm.weight", torch.ones(3, dtype=torch.bfloat16)),
                           d.__setitem__(P + "1.extra.weight", torch.ones(3, dtype=torch.bfloat16))))
    probs = Checkpoint.open(p).check_all()
    assert len(probs) == 3
    assert any(P + "2.mlp.experts.1.down_proj.weight" in s and "missing" in s for s in probs)
    assert any(P + "0.input_layernorm.weight" in s and "[3]" in s for s in probs)
    assert any(P + "1.extra.weight" in s and "unexpected" in s for s in probs)


@pytest.mark.parametrize("quantised", ["production", "none"])
def test_fused_in_proj_gives_the_four_projections_bit_for_bit(tmp_path, quantised):
    """submod0 runs its four input projections as one GEMM of the stacked W8A8 weights: the same
    bits as four, the four re-pointed at views of the stack (no second copy); BF16 left apart."""
    from repro.islands.base import linear
    from repro.model.weights import fuse_in_proj
    ck = Checkpoint.open(make_tiny(tmp_path / quantised, quantised=quantised))
    g = ck.load_layer(ck.config.gdn_layers()[0]).gdn
    four = (g.in_proj_qkv, g.in_proj_z, g.in_proj_b, g.in_proj_a)
    x = (torch.randn(7, ck.config.hidden_size, generator=torch.Generator().manual_seed(0)) * 3).bfloat16()
    separate = [linear(x, p) for p in four]
    fuse_in_proj(g)
    if quantised == "none":
        assert g.in_proj is None
        return
    ptr = g.in_proj.weight.untyped_storage().data_ptr()
    assert all(p.weight.untyped_storage().data_ptr() == ptr for p in four)
    fused = linear(x, g.in_proj).split([p.out_features for p in four], dim=-1)
    for a, b in zip(fused, separate):
        assert torch.equal(a, b)
    assert [torch.equal(linear(x, p), s) for p, s in zip(four, separate)] == [True] * 4  # the views still work
