"""Fast MoE (`torch` provider): only the chosen experts' weights per token, static shapes, no sync.

Work is organised per (token, choice) pair, P = T * top_k of them:
- few pairs (4 * P <= E, decode): gather each pair's expert weights (index_select) and contract
  with a batched matvec. W8A8 integers are exact in fp32 bmm over K-blocks of 1024 (the
  argument in `kernels/w8a8_linear/reference.py`).
- many pairs: loop over the E experts, each one `torch._int_mm` (or bf16 F.linear) over all T
  rows, the rows that did not choose the expert fed zeros, each result placed in its pair's slot
  with unique indices (no duplicate writes).
Both give the reference's integers and use the shared float order in `common.py`, so the
output equals the reference bit for bit with W8A8 experts (to bf16 matmul rounding without).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels import registry
from kernels.moe.common import (combine, finish, renormalized, router_probs, shared_expert,
                                silu_and_mul)
from kernels.w8a8_linear.quant import dequantize_output, quantize_per_token
from kernels.w8a8_linear.reference import K_BLOCK
from kernels.w8a8_linear.torch_int_mm import int8_matmul_int_mm

SPARSE_PAIRS_PER_EXPERT = 0.25  # gather weights per pair while P <= E * this


def topk_sorted(probs: torch.Tensor, k: int):
    """Stable descending sort: equal probabilities keep index order, so ties go to the lowest index."""
    values, ids = torch.sort(probs, dim=-1, descending=True, stable=True)
    return values[:, :k], ids[:, :k]


def int8_bmv_exact(a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """a int8 [P, K], w int8 [P, N, K] -> int32 [P, N] (per-pair w @ a), exactly."""
    P, N, K = w.shape
    acc = torch.zeros(P, N, dtype=torch.int32, device=a.device)
    for k0 in range(0, K, K_BLOCK):
        part = torch.bmm(w[:, :, k0:k0 + K_BLOCK].float(), a[:, k0:k0 + K_BLOCK, None].float())
        acc += part.squeeze(-1).to(torch.int32)
    return acc


def _pairs_gathered(a: torch.Tensor, w, w_scale, pair_expert) -> torch.Tensor:
    """a [P, K]: row p through expert pair_expert[p] -> [P, N]."""
    wg = w.index_select(0, pair_expert)                                     # [P, N, K]
    if w_scale is None:
        return torch.bmm(wg, a[:, :, None]).squeeze(-1)
    a_q, a_scale = quantize_per_token(a)
    return dequantize_output(int8_bmv_exact(a_q, wg), a_scale, w_scale.index_select(0, pair_expert),
                             None, a.dtype)


def _pairs_by_expert(a: torch.Tensor, w, w_scale, ids) -> torch.Tensor:
    """a [T, k, K]: pair (t, j) through expert ids[t, j] -> [T*k, N], one dense pass per expert."""
    T, k, K = a.shape
    E, N = w.shape[:2]
    rows = torch.arange(T, device=a.device)
    slot = torch.full((T, E), k, dtype=torch.int64, device=a.device)     # slot k: not chosen
    slot.scatter_(1, ids, torch.arange(k, device=a.device).expand(T, k))  # ids distinct per row
    if w_scale is not None:
        a_q, a_scale = quantize_per_token(a)
        a_q = torch.cat([a_q, a_q.new_zeros(T, 1, K)], dim=1)
        a_scale = torch.cat([a_scale, a_scale.new_ones(T, 1)], dim=1)
    else:
        a = torch.cat([a, a.new_zeros(T, 1, K)], dim=1)
    out = a.new_zeros(T, k + 1, N)
    for e in range(E):
        sel = slot[:, e]
        if w_scale is None:
            y = F.linear(a[rows, sel], w[e])
        else:
            y = dequantize_output(int8_matmul_int_mm(a_q[rows, sel], w[e]), a_scale[rows, sel],
                                  w_scale[e], None, out.dtype)
        out[rows, sel] = y
    return out[:, :k].reshape(T * k, N)


def _experts_linear(a_pairs: torch.Tensor, w, w_scale, ids) -> torch.Tensor:
    T, k, K = a_pairs.shape
    if T * k <= w.shape[0] * SPARSE_PAIRS_PER_EXPERT:
        return _pairs_gathered(a_pairs.reshape(T * k, K), w, w_scale, ids.reshape(-1))
    return _pairs_by_expert(a_pairs, w, w_scale, ids)


def routed_experts(x, weights, ids, w13, w13_scale, w2, w2_scale) -> torch.Tensor:
    """x [T, H], routing weights fp32 [T, k], expert ids int64 [T, k] -> routed sum, fp32 [T, H]."""
    T, H = x.shape
    k = ids.shape[1]
    h = _experts_linear(x[:, None, :].expand(T, k, H), w13, w13_scale, ids)   # [T*k, 2I]
    act = silu_and_mul(h)                                                      # [T*k, I]
    y = _experts_linear(act.view(T, k, -1), w2, w2_scale, ids)                 # [T*k, H]
    return combine(weights, y.view(T, k, H))


def moe_vectorized(x, router_w, w13, w13_scale, w2, w2_scale, shared_w13, shared_w13_scale,
                   shared_w2, shared_w2_scale, shared_gate_w, top_k, renormalize):
    weights, ids = topk_sorted(router_probs(x, router_w), top_k)
    routed = routed_experts(x, renormalized(weights, renormalize), ids, w13, w13_scale, w2, w2_scale)
    shared = shared_expert(x, shared_w13, shared_w13_scale, shared_w2, shared_w2_scale, int8_matmul_int_mm)
    return finish(x, routed, shared, shared_gate_w)


registry.register("moe", "torch", moe_vectorized, group="moe")
