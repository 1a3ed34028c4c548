"""MoE arithmetic both providers share, so that equal integer accumulators give equal bits.

    logits  = sum(x * router_w) in fp32, rounded to x's dtype (bf16 logits)
    probs   = e / sum(e), e = exp(l - max(l)), l = logits.float()                 (fp32 softmax)
    top-k   = the k largest probs, ties to the lowest expert index, in descending order
    weights = probs_k / sum(probs_k) if renormalize else probs_k   (fp32, summed in k order)
    h       = linear(x, w13[e])                  (W8A8 when a scale is given, else bf16 F.linear)
    act     = (silu(h[:, :I].float()) * h[:, I:].float()) -> x's dtype
    y       = linear(act, w2[e])
    routed  = w_0 * y_0.float() + w_1 * y_1.float() + ...        (left to right, k order)
    shared  = the same MLP with the shared expert's weights
    gate    = sum(x * shared_gate_w) in fp32, rounded to x's dtype       (one bf16 logit per token)
    out     = (routed + sigmoid(gate.float()) * shared.float()) -> x's dtype

Every sum above runs in an order fixed by its length alone (`tree_sum`, or left to right in k
order), never a library reduction's or GEMM's: the same bits at any batch size (a graph replayed
at a padded batch then matches eager at the exact one) and in a fused kernel, which does the
router's softmax, top-k and the shared gate in one launch. The products of two bf16 values are
exact in fp32, so each logit depends on the order of its sum only.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels._math import sigmoid, silu, tree_sum
from kernels.w8a8_linear.quant import dequantize_output, quantize_per_token


ROWS_PER_CHUNK = 1 << 24  # products materialised at once by `fixed_order_linear`


def fixed_order_linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [T, H] @ w [N, H].T in x's dtype: exact fp32 products of the bf16 values, summed pairwise
    (`tree_sum`), rounded once. A library GEMM may sum in an order that depends on T."""
    out = torch.empty(x.shape[0], w.shape[0], dtype=x.dtype, device=x.device)
    step = max(1, ROWS_PER_CHUNK // max(1, w.numel()))
    wf = w.float()
    for t0 in range(0, x.shape[0], step):
        out[t0:t0 + step] = tree_sum(x[t0:t0 + step, None, :].float() * wf[None], -1).to(x.dtype)
    return out


def router_probs(x: torch.Tensor, router_w: torch.Tensor) -> torch.Tensor:
    logits = fixed_order_linear(x, router_w).float()
    e = torch.exp(logits - logits.amax(-1, keepdim=True))
    return e / tree_sum(e, -1, keepdim=True)


def gate_logit(x: torch.Tensor, shared_gate_w: torch.Tensor) -> torch.Tensor:
    """[T, 1] in x's dtype."""
    return fixed_order_linear(x, shared_gate_w.reshape(1, -1))


def renormalized(weights: torch.Tensor, renormalize: bool) -> torch.Tensor:
    """weights / their sum, the sum taken left to right in k order: the same bits on every device
    and in a fused kernel (a library reduction picks its own order)."""
    if not renormalize:
        return weights
    total = weights[..., 0:1]
    for j in range(1, weights.shape[-1]):
        total = total + weights[..., j:j + 1]
    return weights / total


def silu_and_mul(h: torch.Tensor) -> torch.Tensor:
    half = h.shape[-1] // 2
    return (silu(h[..., :half].float()) * h[..., half:].float()).to(h.dtype)


def combine(weights: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """weights fp32 [T, k], y [T, k, H] -> fp32 [T, H], summed in k order."""
    routed = weights[:, 0:1] * y[:, 0].float()
    for j in range(1, y.shape[1]):
        routed = routed + weights[:, j:j + 1] * y[:, j].float()
    return routed


def dense_linear(x: torch.Tensor, w: torch.Tensor, w_scale, int_matmul) -> torch.Tensor:
    """x [M, K] @ w[N, K].T: W8A8 through `int_matmul` (int8, int8 -> int32) when w_scale is given."""
    if w_scale is None:
        return F.linear(x, w)
    x_q, x_scale = quantize_per_token(x)
    return dequantize_output(int_matmul(x_q, w), x_scale, w_scale, None, x.dtype)


def shared_expert(x, w13, w13_scale, w2, w2_scale, int_matmul) -> torch.Tensor:
    act = silu_and_mul(dense_linear(x, w13, w13_scale, int_matmul))
    return dense_linear(act, w2, w2_scale, int_matmul)


def finish(x, routed, shared, shared_gate_w) -> torch.Tensor:
    gate = sigmoid(gate_logit(x, shared_gate_w).float())
    return (routed + gate * shared.float()).to(x.dtype)


def check_moe(x, router_w, w13, w13_scale, w2, w2_scale, top_k):
    T, H = x.shape
    E, I2, H2 = w13.shape
    if H2 != H or router_w.shape != (E, H) or w2.shape != (E, H, I2 // 2) or I2 % 2:
        raise ValueError(f"moe: x {tuple(x.shape)}, router_w {tuple(router_w.shape)}, "
                         f"w13 {tuple(w13.shape)}, w2 {tuple(w2.shape)} disagree")
    if not 1 <= top_k <= E:
        raise ValueError(f"moe: top_k={top_k} with {E} experts")
    for name, scale, w in (("w13_scale", w13_scale, w13), ("w2_scale", w2_scale, w2)):
        if scale is not None and scale.shape != w.shape[:2]:
            raise ValueError(f"moe: {name} {tuple(scale.shape)} must be {tuple(w.shape[:2])}")
