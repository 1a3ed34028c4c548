"""Fast MoE (`torch` provider): static shapes, no host sync, W8A8 bit-identical to the reference.

Work is per (token, choice) pair, P = T * top_k of them, in one of two regimes (static choice):
- few pairs (P <= E / 4, decode): gather each pair's expert weights (index_select) and contract
  with a batched matvec; only the chosen experts' weights are read. W8A8 integers are exact in
  fp32 bmm over K-blocks of 1024 (the argument in `kernels/w8a8_linear/reference.py`).
- many pairs: gate/up is one `torch._int_mm` of the tokens against all experts' stacked rows
  (every expert's weights read once), from which each pair picks its expert's columns; down, on a
  CPU, runs one `_int_mm` per expert over all tokens (a token that did not choose the expert feeds
  zeros) and each pair picks its row; on an accelerator, one `_int_mm` of every pair against all
  experts' stacked rows (`_down_stacked`: E times the products, one launch instead of E). Tokens
  go in chunks so the int32 scratch stays <= 512 MiB.
Integer accumulators equal the reference's and the float epilogue is the shared one
(`common.py`), so W8A8 outputs are bit-identical; bf16 experts agree to bf16 matmul rounding.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels.moe.common import (combine, finish, renormalized, router_probs, shared_expert,
                                silu_and_mul)
from kernels.w8a8_linear.quant import dequantize_output, quantize_per_token
from kernels.w8a8_linear.reference import K_BLOCK
from kernels.w8a8_linear.torch_int_mm import int8_matmul_int_mm, int_mm_supported, padded_rows

SPARSE_PAIRS_PER_EXPERT = 0.25  # gather weights per pair while P <= E * this
SCRATCH_ELEMENTS = 1 << 27      # int32 scratch per token chunk (512 MiB)


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


def _chunks(T: int, per_token: int):
    step = max(1, SCRATCH_ELEMENTS // max(1, per_token))
    return [slice(t0, min(t0 + step, T)) for t0 in range(0, T, step)]


def _up_all_experts(x: torch.Tensor, w13, w13_scale, ids) -> torch.Tensor:
    """x [T, H] against every expert's rows at once; pair (t, j) keeps expert ids[t, j]'s -> [T*k, N]."""
    T, H = x.shape
    E, N, _ = w13.shape
    k = ids.shape[1]
    stacked = w13.reshape(E * N, H)
    if w13_scale is not None:
        x_q, x_scale = quantize_per_token(x)
    out = []
    for sl in _chunks(T, E * N):
        pick = ids[sl, :, None].expand(-1, k, N)
        if w13_scale is None:
            out.append(F.linear(x[sl], stacked).view(-1, E, N).gather(1, pick))
        else:
            acc = int8_matmul_int_mm(x_q[sl], stacked).view(-1, E, N).gather(1, pick)
            out.append(dequantize_output(acc, x_scale[sl, None], w13_scale[ids[sl]], None, x.dtype))
    return torch.cat(out).reshape(T * k, N)


def _int_mm_per_expert(a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """a int8 [E, T, K], w int8 [E, N, K] -> int32 [E, T, N], one `_int_mm` per expert."""
    E, T, K = a.shape
    if not int_mm_supported(a[0], w[0]):
        return torch.stack([int8_matmul_int_mm(a[e], w[e]) for e in range(E)])
    rows = padded_rows(T, a.device)
    if rows != T:
        a = torch.cat([a, a.new_zeros(E, rows - T, K)], dim=1)
    acc = torch.empty(E, rows, w.shape[1], dtype=torch.int32, device=a.device)
    for e in range(E):
        torch._int_mm(a[e], w[e].t(), out=acc[e])
    return acc[:, :T]


def _down_per_expert(act: torch.Tensor, w2, w2_scale, ids) -> torch.Tensor:
    """act [T, k, I]: pair (t, j) through expert ids[t, j] -> [T*k, H], one pass per expert."""
    T, k, I = act.shape
    E, H, _ = w2.shape
    out = []
    for sl in _chunks(T, E * H):
        a, chosen = act[sl], ids[sl]
        t = a.shape[0]
        rows = torch.arange(t, device=a.device)
        slot = torch.full((t, E), k, dtype=torch.int64, device=a.device)     # slot k: not chosen
        slot.scatter_(1, chosen, torch.arange(k, device=a.device).expand(t, k))  # distinct per row
        pick = (rows[None, :], slot.t())                                      # [E, t]: expert e's input rows
        if w2_scale is None:
            per_expert = torch.cat([a, a.new_zeros(t, 1, I)], dim=1)[pick]   # [E, t, I]
            out.append(torch.bmm(per_expert, w2.transpose(1, 2))[chosen, rows[:, None]])
        else:
            a_q, a_scale = quantize_per_token(a)                             # [t, k, I], [t, k]
            per_expert = torch.cat([a_q, a_q.new_zeros(t, 1, I)], dim=1)[pick]
            acc = _int_mm_per_expert(per_expert, w2)[chosen, rows[:, None]]  # [t, k, H]
            out.append(dequantize_output(acc, a_scale, w2_scale[chosen], None, a.dtype))
    return torch.cat(out).reshape(T * k, H)


def _down_stacked(act: torch.Tensor, w2, w2_scale, ids) -> torch.Tensor:
    """W8A8 `_down_per_expert` in one `_int_mm` a chunk: every pair against every expert's stacked
    rows, each pair keeping its own expert's -> [T*k, H]. E times the products, in one launch
    instead of E: the form for an accelerator driven by a host that spends microseconds on each
    launch (E = 256 launches cost more there than the products). Same integers, same epilogue."""
    T, k, I = act.shape
    E, H, _ = w2.shape
    a_q, a_scale = quantize_per_token(act.reshape(T * k, I))
    chosen = ids.reshape(-1)
    stacked = w2.reshape(E * H, I)
    out = []
    for sl in _chunks(T * k, E * H):
        acc = int8_matmul_int_mm(a_q[sl], stacked).view(-1, E, H)
        acc = acc.gather(1, chosen[sl, None, None].expand(-1, 1, H))[:, 0]   # [p, H]: its expert's row
        out.append(dequantize_output(acc, a_scale[sl], w2_scale[chosen[sl]], None, act.dtype))
    return torch.cat(out)


def routed_experts(x, weights, ids, w13, w13_scale, w2, w2_scale) -> torch.Tensor:
    """x [T, H], routing weights fp32 [T, k], expert ids int64 [T, k] -> routed sum, fp32 [T, H]."""
    T, H = x.shape
    k = ids.shape[1]
    if T * k <= w13.shape[0] * SPARSE_PAIRS_PER_EXPERT:
        pair_expert = ids.reshape(-1)
        h = _pairs_gathered(x.repeat_interleave(k, dim=0), w13, w13_scale, pair_expert)
        y = _pairs_gathered(silu_and_mul(h), w2, w2_scale, pair_expert)
    else:
        h = _up_all_experts(x, w13, w13_scale, ids)
        act = silu_and_mul(h).view(T, k, -1)
        stacked = w2_scale is not None and x.device.type != "cpu"  # a CPU computes more than it launches
        y = (_down_stacked if stacked else _down_per_expert)(act, w2, w2_scale, ids)
    return combine(weights, y.view(T, k, H))


def moe_vectorized(x, router_w, w13, w13_scale, w2, w2_scale, shared_w13, shared_w13_scale,
                   shared_w2, shared_w2_scale, shared_gate_w, top_k, renormalize):
    weights, ids = topk_sorted(router_probs(x, router_w), top_k)
    routed = routed_experts(x, renormalized(weights, renormalize), ids, w13, w13_scale, w2, w2_scale)
    shared = shared_expert(x, shared_w13, shared_w13_scale, shared_w2, shared_w2_scale, int8_matmul_int_mm)
    return finish(x, routed, shared, shared_gate_w)

