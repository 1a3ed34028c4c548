"""`vllm_xpu` provider: the production XPU ops of vllm-xpu-kernels behind our ops, where one fits.

Registered always, present only when `vllm_xpu_kernels._C` / `_moe_C` / `_xpu_C` import and an
XPU device exists (schemas: /work/shared/context/vllm-xpu-kernels-ops.md). Adapters:
- rms_norm -> `torch.ops._C.gemma_rms_norm(out, input, weight, eps)` (its schema marks input and
  weight mutable, so it gets copies: our op promises not to mutate them);
- moe -> routing by `torch.ops._moe_C.topk_softmax` on the bf16 router logits, experts and shared
  expert as the `torch` provider (no dense W8A8 op is registered there).
The GDN kernels there (`gdn_attention`, `*_non_spec`) fuse projection split, conv, gating and
the recurrence under other signatures, so they do not map onto one of our ops. Untested here.
"""
from __future__ import annotations

import functools
import importlib
import importlib.util

import torch
import torch.nn.functional as F

from kernels import registry
from kernels.moe.common import finish, shared_expert
from kernels.moe.vectorized import routed_experts
from kernels.w8a8_linear.torch_int_mm import int8_matmul_int_mm

EXTENSIONS = ("vllm_xpu_kernels._C", "vllm_xpu_kernels._moe_C", "vllm_xpu_kernels._xpu_C")


@functools.lru_cache(maxsize=None)
def available() -> tuple[bool, str]:
    if importlib.util.find_spec("vllm_xpu_kernels") is None:
        return False, "vllm-xpu-kernels is not installed"
    if not (hasattr(torch, "xpu") and torch.xpu.is_available()):
        return False, "needs an XPU device"
    try:
        for name in EXTENSIONS:
            importlib.import_module(name)
    except Exception as e:
        return False, f"vllm-xpu-kernels does not import: {type(e).__name__}: {e}"
    return True, "vllm-xpu-kernels imports"


def rms_norm_vllm_xpu(x, w, eps):
    flat = x.reshape(-1, x.shape[-1]).contiguous().clone()
    out = torch.empty_like(flat)
    torch.ops._C.gemma_rms_norm(out, flat, w.contiguous().clone(), eps)
    return out.view(x.shape)


def moe_vllm_xpu(x, router_w, w13, w13_scale, w2, w2_scale, shared_w13, shared_w13_scale,
                 shared_w2, shared_w2_scale, shared_gate_w, top_k, renormalize):
    T = x.shape[0]
    weights = torch.empty(T, top_k, dtype=torch.float32, device=x.device)
    ids = torch.empty(T, top_k, dtype=torch.int32, device=x.device)
    token_expert = torch.empty(T, top_k, dtype=torch.int32, device=x.device)
    torch.ops._moe_C.topk_softmax(weights, ids, token_expert, F.linear(x, router_w), renormalize, None, None)
    routed = routed_experts(x, weights, ids.long(), w13, w13_scale, w2, w2_scale)
    shared = shared_expert(x, shared_w13, shared_w13_scale, shared_w2, shared_w2_scale, int8_matmul_int_mm)
    return finish(x, routed, shared, shared_gate_w)


registry.register("rms_norm", "vllm_xpu", rms_norm_vllm_xpu, available, group="norms")
registry.register("moe", "vllm_xpu", moe_vllm_xpu, available, group="moe")
