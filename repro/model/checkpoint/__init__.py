"""Lazy, validating loader of real-layout checkpoints (Quark W8A8 INT8 or BF16), one layer at a time.

A checkpoint is a directory with `config.json` and `model.safetensors` or a sharded
`model.safetensors.index.json`. Headers are parsed at `open` (no tensor data); `load_layer`
reads only that layer's tensors (TP shards through `get_slice`, so only the shard's bytes) and
returns the canonical `repro.model.weights` structures.

Accepted layouts (all converted to the canonical one):
- GDN: `linear_attn.in_proj_qkv|in_proj_z|in_proj_b|in_proj_a` (Qwen3.5/3.6) or the fused
  Qwen3-Next `in_proj_qkvz` / `in_proj_ba`, whose rows are grouped per key head g:
  `[q_g (dk) | k_g (dk) | v_g (r*dv) | z_g (r*dv)]` and `[b_g (r) | a_g (r)]`, r = Hv/Hk
  (transformers `Qwen3NextGatedDeltaNet.fix_query_key_value_ordering`);
- experts: per expert `mlp.experts.{e}.gate_proj|up_proj|down_proj` (`.weight`, `.weight_scale`,
  `.weight_zero_point`), or fused `mlp.experts.gate_up_proj [E, 2I, H]` / `mlp.experts.down_proj
  [E, H, I]` (no `.weight` suffix, as transformers names the parameters) with int8 siblings
  `mlp.experts.gate_up_proj_scale [E, 2I]`, `mlp.experts.down_proj_scale [E, H]` and optional
  `..._zero_point` of the scale's shape;
- a quantised linear: int8 weight, 1-D `[N]` or `[N, 1]` bf16/fp16/fp32 scale (returned fp32
  1-D), optional int8 zero point that must be all zero.

Norms, conv1d, `A_log` and `dt_bias` may be bf16, fp16 or fp32 and are returned as stored;
linear weights, the router, `shared_expert_gate` and the embedding must be bf16 (or int8 where
quantised). Every error is a `CheckpointError` naming the file and the tensor.

Split by concern: `files.py` (shards, headers, reads), `layout.py` (the names and shapes a layer
should hold), `checks.py` (validation against the quant scheme), `sharding.py` (TP-sharded loads
and their inverse), `core.py` (the `Checkpoint` that ties them together).
"""
from __future__ import annotations

from ...errors import CheckpointError
from .core import Checkpoint
from .files import IGNORED_PREFIXES, INDEX_FILE, PREFIX_MULTIMODAL, PREFIX_TEXT, SINGLE_FILE, ReadStats, TensorInfo
from .layout import Param, QTensor, Spec, deinterleave_ba, deinterleave_qkvz, interleave_ba, interleave_qkvz
from .sharding import merge_shards

__all__ = ["IGNORED_PREFIXES", "INDEX_FILE", "PREFIX_MULTIMODAL", "PREFIX_TEXT", "SINGLE_FILE", "Checkpoint",
           "CheckpointError", "Param", "QTensor", "ReadStats", "Spec", "TensorInfo", "deinterleave_ba",
           "deinterleave_qkvz", "interleave_ba", "interleave_qkvz", "merge_shards"]
