"""The MoE block of any layer: router top-k, W8A8 routed experts, sigmoid-gated shared expert."""
from __future__ import annotations

import torch.nn.functional as F

from ..model.config import ModelConfig
from ..model.weights import HeadWeights, LayerWeights
from .base import Island, ops


class MoEBlock:
    """The block as a callable, used inside submod1 and as the `moe` island."""

    def __init__(self, cfg: ModelConfig, layer: LayerWeights):
        self.cfg, self.w = cfg, layer.moe
        # `keep_input`: hold the last input (eager copies only, never one that captures: a held
        # intermediate would change the pool), so the oracle can tell a router near-tie
        # (`oracle.routing_ties`) from corruption
        self.keep_input, self.last_input = False, None

    def __call__(self, x):
        if self.keep_input:
            self.last_input = x
        m, e = self.w, self.w.experts
        return ops.moe(x, m.gate, e.w13, e.w13_scale, e.w2, e.w2_scale,
                       m.shared_gate_up.weight, m.shared_gate_up.scale,
                       m.shared_down.weight, m.shared_down.scale, m.shared_expert_gate,
                       self.cfg.num_experts_per_tok, self.cfg.norm_topk_prob)


class MoEIsland(Island):
    """embedding -> post-attention norm -> MoE, so the island is fed real token rows."""

    name = "moe"
    inputs = ("input_ids",)
    outputs = ("moe_out",)

    def __init__(self, cfg: ModelConfig, layer: LayerWeights, head: HeadWeights):
        super().__init__()
        self.cfg, self.w, self.embed = cfg, layer, head.embed_tokens
        self.block = MoEBlock(cfg, layer)

    def forward(self, input_ids):
        x = ops.rms_norm(F.embedding(input_ids, self.embed), self.w.post_attention_layernorm, self.cfg.rms_norm_eps)
        return {"moe_out": self.block(x)}
