"""Reference MoE: top-k by repeated argmax, every expert run densely over all rows and masked.

Never syncs with the host (graph-safe), but costs E x the routed work: for tests and small E.
Under `routed_on_host()` the provider runs only the experts in use, with the same bits (the third copy).
"""
from __future__ import annotations

from contextlib import contextmanager

import torch

from kernels.moe.common import (combine, dense_linear, finish, renormalized, router_probs,
                                shared_expert, silu_and_mul)
from kernels.w8a8_linear.quant import dequantize_output, quantize_per_token
from kernels.w8a8_linear.reference import K_BLOCK, int8_matmul_exact


def topk_lowest_index(probs: torch.Tensor, k: int):
    """The k largest, largest first, ties to the lowest index: a stable descending sort keeps equal
    values in index order (NaN counts as largest, as argmax takes it). The same picks as k rounds of
    argmax (the test holds them together), in one sort instead of 3k small ops."""
    ids = torch.sort(probs, dim=-1, descending=True, stable=True).indices[..., :k]
    return probs.gather(-1, ids), ids


_ROUTED = {"on": False}


@contextmanager
def routed_on_host():
    """Inside: the `reference` provider runs `moe_reference_routed` (the same bits, only the
    experts in use, read on the host). For callers that never capture: the independent third copy."""
    was, _ROUTED["on"] = _ROUTED["on"], True
    try:
        yield
    finally:
        _ROUTED["on"] = was


def moe_reference(x, router_w, w13, w13_scale, w2, w2_scale, shared_w13, shared_w13_scale,
                  shared_w2, shared_w2_scale, shared_gate_w, top_k, renormalize):
    T, H = x.shape
    E, I2, _ = w13.shape
    weights, ids = topk_lowest_index(router_probs(x, router_w), top_k)
    weights = renormalized(weights, renormalize)

    def scale(s, e):
        return None if s is None else s[e]

    h = x.new_zeros(T, top_k, I2)
    for e in range(E):
        h_e = dense_linear(x, w13[e], scale(w13_scale, e), int8_matmul_exact)
        h = torch.where((ids == e)[..., None], h_e[:, None, :], h)
    act = silu_and_mul(h.reshape(T * top_k, I2))
    pair_expert = ids.reshape(-1)
    y = x.new_zeros(T * top_k, H)
    for e in range(E):
        y_e = dense_linear(act, w2[e], scale(w2_scale, e), int8_matmul_exact)
        y = torch.where((pair_expert == e)[:, None], y_e, y)
    routed = combine(weights, y.view(T, top_k, H))
    shared = shared_expert(x, shared_w13, shared_w13_scale, shared_w2, shared_w2_scale, int8_matmul_exact)
    return finish(x, routed, shared, shared_gate_w)


def moe_reference_routed(x, router_w, w13, w13_scale, w2, w2_scale, shared_w13, shared_w13_scale,
                         shared_w2, shared_w2_scale, shared_gate_w, top_k, renormalize):
    """`moe_reference` for the experts the batch routes to only: the same bits at a fraction of
    the cost when E is large (the third copy runs it at 256 experts). W8A8 experts run grouped,
    a few batched exact products for all of them (`_Groups`). Which experts are used is read on
    the host, so it is for eager use only (the independent third copy, `repro.reference_copy`,
    never captures)."""
    T, H = x.shape
    weights, ids = topk_lowest_index(router_probs(x, router_w), top_k)
    weights = renormalized(weights, renormalize)
    groups = _Groups(ids.reshape(-1))
    token = torch.arange(T, device=x.device).repeat_interleave(top_k)  # the token of each (token, k) pair
    act = silu_and_mul(groups.linear(x, token, w13, w13_scale))
    y = groups.linear(act, None, w2, w2_scale)
    routed = combine(weights, y.view(T, top_k, H))
    shared = shared_expert(x, shared_w13, shared_w13_scale, shared_w2, shared_w2_scale, int8_matmul_exact)
    return finish(x, routed, shared, shared_gate_w)


# The float copy of one K-block of a group's operands (`int8_matmul_exact`) is kept under this:
# 256 MiB, 64 experts of a 1024-row projection with room for their tokens at real dimensions.
GROUP_BYTES = 1 << 28


class _Groups:
    """The (token, k) pairs of a batch grouped by expert, each group padded to the largest:
    `pair_at[g * width + i]` is the i-th pair of the g-th expert used (P, a zero row, past its
    count), `slot` the inverse. Two host reads: the experts used (`torch.unique` waits for them on
    a GPU) and the largest count."""

    def __init__(self, pair_expert: torch.Tensor):
        P = pair_expert.numel()
        self.experts, group, counts = torch.unique(pair_expert, return_inverse=True, return_counts=True)
        self.width = int(counts.max())
        order = torch.argsort(group, stable=True)
        starts = torch.cumsum(counts, 0) - counts
        by_group = group[order]
        slot = by_group * self.width + torch.arange(P, device=group.device) - starts[by_group]
        self.slot = torch.empty_like(slot).index_copy_(0, order, slot)
        self.pair_at = torch.full((self.experts.numel() * self.width,), P, dtype=slot.dtype, device=slot.device)
        self.pair_at.index_copy_(0, slot, order)
        self.pair_expert = pair_expert

    def linear(self, inputs, rows, w, w_scale) -> torch.Tensor:
        """[P, N]: pair p's row of `inputs` (`rows[p]`, or p) through its expert's `w` (`dense_linear`'s bits)."""
        if w_scale is None:  # bf16 experts: a library GEMM may round by row count, so every row, then selected
            out = inputs.new_zeros(self.pair_expert.numel(), w.shape[1])
            for e in self.experts.tolist():
                pairs = (self.pair_expert == e).nonzero().flatten()
                out[pairs] = dense_linear(inputs, w[e], None, int8_matmul_exact)[pairs if rows is None else rows[pairs]]
            return out
        x_q, x_scale = quantize_per_token(inputs if rows is None else inputs[rows])  # per row: as per expert
        x_q = torch.cat([x_q, x_q.new_zeros(1, x_q.shape[1])])
        x_scale = torch.cat([x_scale, x_scale.new_ones(1)])
        U, K, N = self.experts.numel(), x_q.shape[1], w.shape[1]
        x_q, x_scale = x_q[self.pair_at].view(U, self.width, K), x_scale[self.pair_at].view(U, self.width)
        step = max(1, GROUP_BYTES // (4 * min(K, K_BLOCK) * (N + self.width)))
        out = []
        for g in range(0, U, step):
            e = self.experts[g:g + step]
            acc = int8_matmul_exact(x_q[g:g + step], w[e])
            out.append(dequantize_output(acc, x_scale[g:g + step], w_scale[e][:, None, :], None, inputs.dtype))
        return torch.cat(out).view(U * self.width, N)[self.slot]


def _provider(*args):
    """The `reference` provider: `moe_reference`, or its routed form under `routed_on_host()`
    (`moe_reference` itself stays a plain function: `repro report` copies it into scripts)."""
    return (moe_reference_routed if _ROUTED["on"] else moe_reference)(*args)

