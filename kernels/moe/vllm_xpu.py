"""`vllm_xpu` provider of `repro::moe`: routing by vllm-xpu-kernels' `_moe_C.topk_softmax`, the
experts and the shared expert as the `torch` provider (the wheel registers no dense W8A8 op).

Contract (schema and checks in `kernels/vllm_xpu_ops.py`, tested on the CPU by
`tests/test_xpu_contract.py`): `topk_softmax(topk_weights!, topk_indices!, token_expert_indices!,
gating_output, renormalize, bias, is_padding)` writes fp32 weights and int32 ids (int64 and uint32
ids are accepted too; int32 token-expert indices only) for [T, k] outputs; the gating output may
be fp32, fp16 or bf16.

Router logits: `fixed_order_linear`, the fixed-order sums every other provider uses (exact fp32
products of the weights and x, rounded once to x's dtype), not a library GEMM, whose sum order
may depend on the batch size and which would need the router weight in x's dtype. The
kernel's softmax and top-k work row by row (the kernel is chosen by the number of experts), so
routing is batch-invariant; the softmax is the kernel's own, so weights may differ from the
reference's in the last bits.
"""
from __future__ import annotations

import torch

from kernels import registry
from kernels.moe.common import finish, fixed_order_linear, shared_expert
from kernels.moe.vectorized import routed_experts
from kernels.vllm_xpu_ops import namespace
from kernels.w8a8_linear.torch_int_mm import int8_matmul_int_mm


def moe_vllm_xpu(x, router_w, w13, w13_scale, w2, w2_scale, shared_w13, shared_w13_scale,
                 shared_w2, shared_w2_scale, shared_gate_w, top_k, renormalize, *, ns=None):
    """`ns`: the namespace holding `topk_softmax` (default `torch.ops._moe_C`; a test passes its own)."""
    ns = namespace("_moe_C") if ns is None else ns
    T = x.shape[0]
    # zeros, not empty: a recorded call's inputs must repeat (`registry.call`)
    weights = torch.zeros(T, top_k, dtype=torch.float32, device=x.device)
    ids = torch.zeros(T, top_k, dtype=torch.int32, device=x.device)
    token_expert = torch.zeros(T, top_k, dtype=torch.int32, device=x.device)
    logits = fixed_order_linear(x, router_w)
    registry.call(ns.topk_softmax, weights, ids, token_expert, logits, renormalize, None, None)
    routed = routed_experts(x, weights, ids.long(), w13, w13_scale, w2, w2_scale)
    shared = shared_expert(x, shared_w13, shared_w13_scale, shared_w2, shared_w2_scale, int8_matmul_int_mm)
    return finish(x, routed, shared, shared_gate_w)

