"""In-memory weights of one layer, in one canonical form whatever the checkpoint's naming.

The checkpoint loader turns both GDN naming schemes (`in_proj_qkv`/`in_proj_z`/`in_proj_b`/
`in_proj_a` and fused `in_proj_qkvz`/`in_proj_ba`) and both expert layouts (per expert and
fused `gate_up_proj`/`down_proj`) into these structures, sharded for a TP rank if asked.
The islands only ever see these.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

import torch


@dataclass
class Linear:
    """One projection `y = x @ weight.T`.

    W8A8: `weight` int8 [N, K], `scale` fp32 [N] (per output channel, symmetric).
    BF16: `weight` bf16 [N, K], `scale` None.
    """

    weight: torch.Tensor
    scale: torch.Tensor | None = None

    @property
    def quantized(self) -> bool:
        return self.scale is not None

    @property
    def out_features(self) -> int:
        return self.weight.shape[0]

    @property
    def in_features(self) -> int:
        return self.weight.shape[1]


@dataclass
class Experts:
    """Routed experts stacked: w13 = [gate; up] per expert, w2 = down.

    W8A8: w13 int8 [E, 2I, H] with w13_scale fp32 [E, 2I]; w2 int8 [E, H, I] with w2_scale [E, H].
    BF16: the same shapes in bf16 and scales None.
    """

    w13: torch.Tensor
    w13_scale: torch.Tensor | None
    w2: torch.Tensor
    w2_scale: torch.Tensor | None

    @property
    def quantized(self) -> bool:
        return self.w13_scale is not None


@dataclass
class GDNWeights:
    in_proj_qkv: Linear  # [2*Hk*dk + Hv*dv, H], rows [q | k | v], each head-major
    in_proj_z: Linear  # [Hv*dv, H]
    in_proj_b: Linear  # [Hv, H]
    in_proj_a: Linear  # [Hv, H]
    conv1d_weight: torch.Tensor  # bf16 [conv_dim, 1, K]
    A_log: torch.Tensor  # [Hv]
    dt_bias: torch.Tensor  # [Hv]
    norm_weight: torch.Tensor  # [dv], the gated norm's plain weight
    out_proj: Linear  # [H, Hv*dv]
    in_proj: Linear | None = None  # after fuse_in_proj(): rows [qkv | z | b | a], the four views of it


def fuse_in_proj(g: GDNWeights) -> GDNWeights:
    """Stack the four W8A8 input projections into one matrix `g.in_proj` and re-point the four at
    row views of it (no second copy). One GEMM of the stack gives the four outputs bit for bit:
    the activation scale is per token and every output channel has its own weight row and scale,
    so nothing couples the parts (for BF16 a library GEMM could sum in another order: those are
    left apart)."""
    parts = (g.in_proj_qkv, g.in_proj_z, g.in_proj_b, g.in_proj_a)
    if g.in_proj is not None or not all(p.quantized for p in parts) or \
            len({(p.weight.dtype, p.in_features, p.weight.device) for p in parts}) != 1:
        return g
    weight = torch.cat([p.weight for p in parts])
    scale = torch.cat([p.scale.reshape(-1) for p in parts])
    r = 0
    for p in parts:
        n = p.out_features
        p.weight, p.scale = weight[r:r + n], scale[r:r + n].view(p.scale.shape)
        r += n
    g.in_proj = Linear(weight, scale)
    return g


@dataclass
class MoEWeights:
    gate: torch.Tensor  # router, bf16 [E, H]
    experts: Experts
    shared_gate_up: Linear  # [2*Is, H], rows [gate; up]
    shared_down: Linear  # [H, Is]
    shared_expert_gate: torch.Tensor  # bf16 [1, H]


@dataclass
class LayerWeights:
    index: int
    layer_type: str
    input_layernorm: torch.Tensor  # [H], Gemma style (1 + w)
    post_attention_layernorm: torch.Tensor  # [H]
    moe: MoEWeights
    gdn: GDNWeights | None = None  # None for full-attention layers
    tp_rank: int = 0
    tp_size: int = 1


@dataclass
class HeadWeights:
    """What the canary head and submod0's embedding need: embedding rows, final norm, lm_head."""

    embed_tokens: torch.Tensor  # [V, H]
    norm: torch.Tensor  # [H]
    lm_head: torch.Tensor  # [V, H] (or the embedding when tied)


def tensors_of(obj) -> dict[str, torch.Tensor]:
    """Flatten a weights dataclass into name -> tensor (for moving, digests and byte counts)."""
    out: dict[str, torch.Tensor] = {}
    for f in fields(obj):
        v = getattr(obj, f.name)
        if isinstance(v, torch.Tensor):
            out[f.name] = v
        elif hasattr(v, "__dataclass_fields__"):
            out.update({f"{f.name}.{k}": t for k, t in tensors_of(v).items()})
    return out


def to_device(obj, device):
    """Move every tensor of a weights dataclass to `device` in place; returns obj."""
    for f in fields(obj):
        v = getattr(obj, f.name)
        if isinstance(v, torch.Tensor):
            setattr(obj, f.name, v.to(device))
        elif hasattr(v, "__dataclass_fields__"):
            to_device(v, device)
    return obj


def copy_weights(copy) -> dict[str, torch.Tensor]:
    """Every weight tensor a chain copy reads, by name (the layer's, the embedding, the head's,
    the next layer's norm)."""
    out = {f"layer.{k}": v for k, v in tensors_of(copy.submod0.w).items()}
    out.update({"head.embed_tokens": copy.submod0.embed, "head.norm": copy.head.norm,
                "head.lm_head": copy.head.lm_head, "next_norm": copy.submod1.next_norm})
    return out


def island_weights(island) -> dict[str, torch.Tensor]:
    """The same for the `moe` island."""
    out = {f"layer.{k}": v for k, v in tensors_of(island.w).items()}
    out["head.embed_tokens"] = island.embed
    return out
