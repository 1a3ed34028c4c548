"""What a layer should hold: the tensor names and shapes `config.json` implies, in either storage
layout (split or fused GDN projections, per-expert or fused experts), and the row shuffles
between the fused Qwen3-Next layout and the canonical one.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..config import GDN


@dataclass(frozen=True)
class QTensor:
    """A linear weight that may be quantised: its module name (for the scheme) and tensor names."""

    module: str
    weight: str
    scale: str
    zero_point: str
    shape: tuple[int, ...]  # expected weight shape, [N, K] or stacked [E, N, K]

    @classmethod
    def linear(cls, module: str, shape: tuple[int, ...]) -> "QTensor":
        return cls(module, f"{module}.weight", f"{module}.weight_scale", f"{module}.weight_zero_point", shape)

    @classmethod
    def fused(cls, name: str, shape: tuple[int, ...]) -> "QTensor":
        """A fused expert stack: the tensor is named like the module, scale is `{name}_scale`."""
        return cls(name, name, f"{name}_scale", f"{name}_zero_point", shape)

    def names(self) -> tuple[str, str, str]:
        return self.weight, self.scale, self.zero_point


@dataclass(frozen=True)
class Param:
    """A plain tensor: `strict` means bf16 only, else bf16/fp16/fp32."""

    name: str
    shape: tuple[int, ...]
    strict: bool = False


Spec = QTensor | Param


def deinterleave_qkvz(t: torch.Tensor, groups: int, dk: int, dv: int, ratio: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused Qwen3-Next `in_proj_qkvz` rows (per key-head group [q|k|v|z]) -> (qkv [q|k|v], z).

    Works on a weight [R, H] or a scale [R]; `groups` is the number of key heads present.
    """
    rest = tuple(t.shape[1:])
    g = t.reshape(groups, 2 * dk + 2 * ratio * dv, *rest)
    q, k, v, z = torch.split(g, [dk, dk, ratio * dv, ratio * dv], dim=1)
    flat = [x.reshape(-1, *rest) for x in (q, k, v, z)]
    return torch.cat(flat[:3]), flat[3]


def interleave_qkvz(qkv: torch.Tensor, z: torch.Tensor, groups: int, dk: int, dv: int, ratio: int) -> torch.Tensor:
    """Inverse of `deinterleave_qkvz`: canonical [q|k|v] and z -> fused per-group rows."""
    rest = tuple(qkv.shape[1:])
    q, k, v = torch.split(qkv, [groups * dk, groups * dk, groups * ratio * dv])
    parts = [q.reshape(groups, dk, *rest), k.reshape(groups, dk, *rest),
             v.reshape(groups, ratio * dv, *rest), z.reshape(groups, ratio * dv, *rest)]
    return torch.cat(parts, dim=1).reshape(-1, *rest)


def deinterleave_ba(t: torch.Tensor, groups: int, ratio: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused `in_proj_ba` rows (per key-head group [b (r) | a (r)]) -> (b, a), each [groups*r, ...]."""
    rest = tuple(t.shape[1:])
    b, a = torch.split(t.reshape(groups, 2 * ratio, *rest), [ratio, ratio], dim=1)
    return b.reshape(-1, *rest), a.reshape(-1, *rest)


def interleave_ba(b: torch.Tensor, a: torch.Tensor, groups: int, ratio: int) -> torch.Tensor:
    rest = tuple(b.shape[1:])
    return torch.cat([b.reshape(groups, ratio, *rest), a.reshape(groups, ratio, *rest)], dim=1).reshape(-1, *rest)


class _Layout:
    """`Checkpoint`'s expected tensors (a mixin: it needs `config`, `prefix`, `has`, `layer_prefix`)."""

    def layout(self, layer: int) -> dict[str, str | None]:
        """How this layer is stored: GDN naming ("split"/"fused"/None) and experts ("per_expert"/"fused")."""
        p = self.layer_prefix(layer)
        gdn = None
        if self.config.layer_type(layer) == GDN:
            gdn = "fused" if self.has(p + "linear_attn.in_proj_qkvz.weight") else "split"
        experts = "fused" if self.has(p + "mlp.experts.gate_up_proj") else "per_expert"
        return {"gdn": gdn, "experts": experts}

    def layer_specs(self, layer: int) -> dict[str, Spec]:
        """Every tensor (group) the layer should hold, keyed by its name without the layer prefix."""
        c, p = self.config, self.layer_prefix(layer)
        H, E, I, Is = c.hidden_size, c.num_experts, c.moe_intermediate_size, c.shared_expert_intermediate_size
        lay = self.layout(layer)
        s: dict[str, Spec] = {
            "input_layernorm.weight": Param(p + "input_layernorm.weight", (H,)),
            "post_attention_layernorm.weight": Param(p + "post_attention_layernorm.weight", (H,)),
        }
        la = p + "linear_attn."
        if lay["gdn"] == "split":
            s["linear_attn.in_proj_qkv"] = QTensor.linear(la + "in_proj_qkv", (c.conv_dim, H))
            s["linear_attn.in_proj_z"] = QTensor.linear(la + "in_proj_z", (c.value_dim, H))
            s["linear_attn.in_proj_b"] = QTensor.linear(la + "in_proj_b", (c.linear_num_value_heads, H))
            s["linear_attn.in_proj_a"] = QTensor.linear(la + "in_proj_a", (c.linear_num_value_heads, H))
        elif lay["gdn"] == "fused":
            s["linear_attn.in_proj_qkvz"] = QTensor.linear(la + "in_proj_qkvz", (c.conv_dim + c.value_dim, H))
            s["linear_attn.in_proj_ba"] = QTensor.linear(la + "in_proj_ba", (2 * c.linear_num_value_heads, H))
        if lay["gdn"]:
            s["linear_attn.conv1d.weight"] = Param(la + "conv1d.weight", (c.conv_dim, 1, c.linear_conv_kernel_dim))
            s["linear_attn.A_log"] = Param(la + "A_log", (c.linear_num_value_heads,))
            s["linear_attn.dt_bias"] = Param(la + "dt_bias", (c.linear_num_value_heads,))
            s["linear_attn.norm.weight"] = Param(la + "norm.weight", (c.linear_value_head_dim,))
            s["linear_attn.out_proj"] = QTensor.linear(la + "out_proj", (H, c.value_dim))
        else:
            sa, hd = p + "self_attn.", c.head_dim
            s["self_attn.q_proj"] = QTensor.linear(sa + "q_proj", (2 * c.num_attention_heads * hd, H))
            s["self_attn.k_proj"] = QTensor.linear(sa + "k_proj", (c.num_key_value_heads * hd, H))
            s["self_attn.v_proj"] = QTensor.linear(sa + "v_proj", (c.num_key_value_heads * hd, H))
            s["self_attn.o_proj"] = QTensor.linear(sa + "o_proj", (H, c.num_attention_heads * hd))
            s["self_attn.q_norm.weight"] = Param(sa + "q_norm.weight", (hd,))
            s["self_attn.k_norm.weight"] = Param(sa + "k_norm.weight", (hd,))
        m = p + "mlp."
        s["mlp.gate.weight"] = Param(m + "gate.weight", (E, H), strict=True)
        if lay["experts"] == "fused":
            s["mlp.experts.gate_up_proj"] = QTensor.fused(m + "experts.gate_up_proj", (E, 2 * I, H))
            s["mlp.experts.down_proj"] = QTensor.fused(m + "experts.down_proj", (E, H, I))
        else:
            for e in range(E):
                for proj, shape in (("gate_proj", (I, H)), ("up_proj", (I, H)), ("down_proj", (H, I))):
                    key = f"mlp.experts.{e}.{proj}"
                    s[key] = QTensor.linear(p + key, shape)
        for proj, shape in (("gate_proj", (Is, H)), ("up_proj", (Is, H)), ("down_proj", (H, Is))):
            s[f"mlp.shared_expert.{proj}"] = QTensor.linear(m + f"shared_expert.{proj}", shape)
        s["mlp.shared_expert_gate.weight"] = Param(m + "shared_expert_gate.weight", (1, H), strict=True)
        return s

    def head_specs(self) -> dict[str, Spec]:
        c = self.config
        s: dict[str, Spec] = {
            "embed_tokens.weight": Param(self.prefix + "embed_tokens.weight", (c.vocab_size, c.hidden_size), strict=True),
            "norm.weight": Param(self.prefix + "norm.weight", (c.hidden_size,)),
        }
        if not c.tie_word_embeddings or self.has("lm_head.weight"):
            s["lm_head"] = QTensor.linear("lm_head", (c.vocab_size, c.hidden_size))
        return s
