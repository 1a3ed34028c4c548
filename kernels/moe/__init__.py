"""`repro::moe`: router top-k + routed experts (W8A8 or BF16) + sigmoid-gated shared expert.

Arithmetic and float order: `common.py`. Providers: `reference` (dense over experts, masked),
`torch` (only the chosen experts; bit-identical to the reference with W8A8 experts),
`vllm_xpu` (`vllm_xpu.py`: routing by `_moe_C.topk_softmax`, experts as `torch`), `triton`
(`triton.py`). All graph-safe.
`moe_block(x, mw, top_k)` runs a `repro.weights.MoEWeights`.
"""
from __future__ import annotations

from typing import Optional

import torch

from kernels import registry
from kernels._library import define
from kernels.availability import triton, vllm_xpu
from kernels.moe.common import check_moe
from kernels.registry import Source

__all__ = ["moe", "moe_block"]

registry.declare(__name__, "moe", {
    "moe": {
        "reference": Source(".reference:_provider"),
        "torch": Source(".vectorized:moe_vectorized"),
        "vllm_xpu": Source(".vllm_xpu:moe_vllm_xpu", vllm_xpu),
        "triton": Source(".triton:moe", triton),
    },
})


@define("moe", mutates_args=())
def moe(x: torch.Tensor, router_w: torch.Tensor, w13: torch.Tensor, w13_scale: Optional[torch.Tensor],
        w2: torch.Tensor, w2_scale: Optional[torch.Tensor], shared_w13: torch.Tensor,
        shared_w13_scale: Optional[torch.Tensor], shared_w2: torch.Tensor,
        shared_w2_scale: Optional[torch.Tensor], shared_gate_w: torch.Tensor, top_k: int,
        renormalize: bool) -> torch.Tensor:
    """x [T, H] -> [T, H] in x's dtype. w13 [E, 2I, H] (rows [gate; up]), w2 [E, H, I], scales
    [E, 2I] / [E, H] fp32 or None (bf16 experts); shared_w13 [2Is, H], shared_w2 [H, Is] with
    scales [2Is] / [H] or None; shared_gate_w [1, H]; router_w [E, H]."""
    check_moe(x, router_w, w13, w13_scale, w2, w2_scale, top_k)
    return registry.impl("moe")(x, router_w, w13, w13_scale, w2, w2_scale, shared_w13, shared_w13_scale,
                                shared_w2, shared_w2_scale, shared_gate_w, top_k, renormalize)


@moe.register_fake
def _(x, router_w, w13, w13_scale, w2, w2_scale, shared_w13, shared_w13_scale, shared_w2,
      shared_w2_scale, shared_gate_w, top_k, renormalize):
    check_moe(x, router_w, w13, w13_scale, w2, w2_scale, top_k)
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


def moe_block(x: torch.Tensor, mw, top_k: int, renormalize: bool = True) -> torch.Tensor:
    """Run `mw: repro.weights.MoEWeights` on x [T, H] (`norm_topk_prob` absent means renormalize)."""
    ex = mw.experts
    return moe(x, mw.gate, ex.w13, ex.w13_scale, ex.w2, ex.w2_scale, mw.shared_gate_up.weight,
               mw.shared_gate_up.scale, mw.shared_down.weight, mw.shared_down.scale,
               mw.shared_expert_gate, top_k, renormalize)
