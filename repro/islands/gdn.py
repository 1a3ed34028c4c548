"""The GDN layer as vLLM's PIECEWISE split cuts it: submod0 -> gdn_core (splitting op) -> submod1.

submod0: embedding -> input norm -> W8A8 projections; it also allocates `core_out`, the
buffer the splitting op writes into (vLLM allocates it in the model's forward, so it is a
graph output living in the pool).
gdn_core: conv1d + gating + gated delta rule; mutates `core_out` and the state caches in place.
submod1: gated norm -> out_proj -> residual -> post-attention norm -> MoE -> residual ->
next layer's input norm.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..control.meta import GDNMeta
from ..model.config import ModelConfig
from ..model.weights import HeadWeights, LayerWeights
from kernels.gdn import fused
from kernels.gdn.core import composed

from .hazard_ops import gated_delta_rule_decode_undeclared, gdn_attention_undeclared
from .base import Island, linear, ops


class StateCache:
    """conv and SSM states indexed by state block. With sentinel 0, block 0 is the null block.
    With k speculative tokens a conv row keeps k more columns than the kernel width needs (vLLM's
    `gated_delta_net_state_shape`): a spec step reads its window at the accepted offset."""

    def __init__(self, cfg: ModelConfig, num_slots: int, device, tp_size: int = 1, sentinel: int = 0,
                 spec_tokens: int = 0):
        hv = cfg.linear_num_value_heads // tp_size
        conv_dim = cfg.conv_dim // tp_size
        self.sentinel = sentinel
        self.num_slots = num_slots + (1 if sentinel == 0 else 0)
        self.conv = torch.zeros(self.num_slots, conv_dim, cfg.linear_conv_kernel_dim - 1 + spec_tokens,
                                dtype=torch.bfloat16, device=device)
        self.ssm = torch.zeros(self.num_slots, hv, cfg.linear_key_head_dim, cfg.linear_value_head_dim,
                               dtype=torch.float32, device=device)

    @property
    def usable(self) -> range:
        return range(1, self.num_slots) if self.sentinel == 0 else range(self.num_slots)

    def tensors(self) -> dict[str, torch.Tensor]:
        return {"conv_state": self.conv, "ssm_state": self.ssm}


class Submod0(Island):
    name = "submod0"
    inputs = ("input_ids",)
    outputs = ("qkv", "z", "b", "a", "residual", "core_out")

    def __init__(self, cfg: ModelConfig, layer: LayerWeights, head: HeadWeights, tp_size: int = 1):
        super().__init__()
        self.cfg, self.w, self.embed = cfg, layer, head.embed_tokens
        self.hv = cfg.linear_num_value_heads // tp_size

    def forward(self, input_ids):
        g = self.w.gdn
        residual = F.embedding(input_ids, self.embed)
        x = ops.rms_norm(residual, self.w.input_layernorm, self.cfg.rms_norm_eps)
        if self.opts.escape_z:
            # e.g. a oneDNN matmul on its own cached queue: it runs during capture, is not recorded
            with self.escape():
                z = linear(x, g.in_proj_z)
            qkv, b, a = linear(x, g.in_proj_qkv), linear(x, g.in_proj_b), linear(x, g.in_proj_a)
        elif g.in_proj is not None:  # the four stacked (weights.fuse_in_proj): one GEMM, row views of it
            qkv, z, b, a = linear(x, g.in_proj).split(
                [p.out_features for p in (g.in_proj_qkv, g.in_proj_z, g.in_proj_b, g.in_proj_a)], dim=-1)
        else:
            qkv, z, b, a = (linear(x, p) for p in (g.in_proj_qkv, g.in_proj_z, g.in_proj_b, g.in_proj_a))
        out = {
            "qkv": qkv,
            "z": z,
            "b": b,
            "a": a,
            "residual": residual,
            "core_out": torch.empty(x.shape[0], self.hv, self.cfg.linear_value_head_dim,
                                    dtype=torch.bfloat16, device=x.device),
        }
        return out


class GDNCore(Island):
    """The splitting op. Writes `core_out` and the state caches in place, returns nothing new
    (unless the `fresh-alloc-split-op` hazard makes it return a fresh tensor)."""

    name = "gdn_core"
    inputs = ("qkv", "b", "a", "core_out")
    outputs = ("core_out",)

    def __init__(self, cfg: ModelConfig, layer: LayerWeights, cache: StateCache, tp_size: int = 1):
        super().__init__()
        self.cfg, self.w, self.cache = cfg, layer.gdn, cache
        self.hk = cfg.linear_num_key_heads // tp_size
        self.hv = cfg.linear_num_value_heads // tp_size
        self.conv_w = self.w.conv1d_weight.squeeze(1)

    def state(self):
        return self.cache.tensors()

    def forward(self, qkv, b, a, core_out, meta: GDNMeta):
        """vLLM's `_forward_core` (`kernels/gdn/core.py`: the pieces, each its own op), or, when a
        fused provider of `repro::gdn_attention` is selected (`kernels.gdn.fused`), that one call with
        the metadata vLLM's XPU path hands it (`vllm/_xpu_ops.py: _gdn_attention_core_xpu_impl`:
        `has_initial_state` is None without prefills, as `GDNAttentionMetadataBuilder.build` leaves it)."""
        out = torch.empty_like(core_out) if self.opts.fresh_core_out else core_out
        m = meta
        args = (out, qkv, b, a, self.conv_w, self.w.A_log, self.w.dt_bias, self.cache.conv, self.cache.ssm,
                m.num_prefills, m.num_decodes, m.num_spec_decodes, m.num_actual_tokens, m.num_decode_tokens,
                m.num_prefill_tokens)
        rest = (m.non_spec_query_start_loc, m.non_spec_token_indx, m.non_spec_state_indices,
                m.spec_query_start_loc, m.spec_token_indx, m.spec_state_indices, m.num_accepted_tokens,
                self.cache.sentinel)
        if fused():
            call = gdn_attention_undeclared if self.opts.undeclared_decode else ops.gdn_attention
            call(*args, m.has_initial_state if m.num_prefills else None, *rest)
        else:
            composed(*args, m.has_initial_state, *rest,
                     decode_rule=gated_delta_rule_decode_undeclared if self.opts.undeclared_decode else None)
        return {"core_out": out}


class Submod1(Island):
    name = "submod1"
    inputs = ("core_out", "z", "residual")
    outputs = ("hidden", "next_normed")

    def __init__(self, cfg: ModelConfig, layer: LayerWeights, next_norm: torch.Tensor, moe, tp_size: int = 1):
        super().__init__()
        self.cfg, self.w, self.next_norm, self.moe = cfg, layer, next_norm, moe
        self.hv = cfg.linear_num_value_heads // tp_size

    def forward(self, core_out, z, residual):
        c = self.cfg
        t = core_out.shape[0]
        zz = z.reshape(t, self.hv, c.linear_value_head_dim)
        gated = ops.rms_norm_gated(core_out, zz, self.w.gdn.norm_weight, c.rms_norm_eps)
        attn = linear(gated.reshape(t, -1), self.w.gdn.out_proj)
        if self.opts.reinplace_residual:
            # Inductor's reinplacing would do this inside a compiled piece: `residual` looks dead
            # to this graph, but it is graph 0's output and its holder still reads it.
            h = residual.add_(attn)
            x = ops.rms_norm(h, self.w.post_attention_layernorm, c.rms_norm_eps)
        else:
            h, x = ops.add_rms_norm(residual, attn, self.w.post_attention_layernorm, c.rms_norm_eps)
        n = self.ctx.num_actual_tokens if self.opts.trim_moe_to_context else None
        if n is not None:
            # vLLM's MoE trims to the forward context's token count: a Python int a graph freezes.
            m = torch.zeros_like(x)
            m[:n] = self.moe(x[:n])
        else:
            m = self.moe(x)
        hidden, next_normed = ops.add_rms_norm(h, m, self.next_norm, c.rms_norm_eps)
        return {"hidden": hidden, "next_normed": next_normed}


class CanaryHead(Island):
    """Final norm + lm_head rows -> greedy token ids, as the lab's canary prompts were read."""

    name = "head"
    inputs = ("hidden",)
    outputs = ("token_ids",)

    def __init__(self, cfg: ModelConfig, head: HeadWeights):
        super().__init__()
        self.cfg, self.norm, self.lm_head = cfg, head.norm, head.lm_head

    def forward(self, hidden):
        x = ops.rms_norm(hidden, self.norm, self.cfg.rms_norm_eps)
        logits = torch.nn.functional.linear(x, self.lm_head).float()
        return {"token_ids": logits.argmax(-1)}
