"""Reference MoE: top-k by repeated argmax, every expert run densely over all rows and masked.

Never syncs with the host (graph-safe), but costs E x the routed work: for tests and small E.
Under `routed_on_host()` the provider runs only the experts in use, with the same bits (the third copy).
"""
from __future__ import annotations

from contextlib import contextmanager

import torch

from kernels import registry
from kernels.moe.common import (combine, dense_linear, finish, renormalized, router_probs,
                                shared_expert, silu_and_mul)
from kernels.w8a8_linear.reference import int8_matmul_exact


def topk_lowest_index(probs: torch.Tensor, k: int):
    """k rounds of argmax (which returns the first maximum): ties go to the lowest index."""
    remaining = probs.clone()
    values, ids = [], []
    for _ in range(k):
        i = remaining.argmax(dim=-1, keepdim=True)
        values.append(probs.gather(-1, i))
        ids.append(i)
        remaining = remaining.scatter(-1, i, float("-inf"))
    return torch.cat(values, dim=-1), torch.cat(ids, dim=-1)


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
    the cost when E is large (the third copy at 256 experts: issue 19). Which experts are used is
    read on the host, so it is for eager use only (the independent third copy,
    `repro.reference_copy`, never captures)."""
    T, H = x.shape
    weights, ids = topk_lowest_index(router_probs(x, router_w), top_k)
    weights = renormalized(weights, renormalize)
    pair_expert = ids.reshape(-1)
    token = torch.arange(T, device=x.device).repeat_interleave(top_k)  # the token of each (token, k) pair
    used = [(e, (pair_expert == e).nonzero().flatten()) for e in pair_expert.unique().tolist()]

    def scale(s, e):
        return None if s is None else s[e]

    h = x.new_zeros(T * top_k, w13.shape[1])
    for e, pairs in used:
        h[pairs] = _on_rows(x, token[pairs], w13[e], scale(w13_scale, e))
    act = silu_and_mul(h)
    y = x.new_zeros(T * top_k, H)
    for e, pairs in used:
        y[pairs] = _on_rows(act, pairs, w2[e], scale(w2_scale, e))
    routed = combine(weights, y.view(T, top_k, H))
    shared = shared_expert(x, shared_w13, shared_w13_scale, shared_w2, shared_w2_scale, int8_matmul_exact)
    return finish(x, routed, shared, shared_gate_w)


def _on_rows(inputs, rows, w, w_scale):
    """`dense_linear(inputs, w, w_scale)[rows]` with the dense loop's bits: a W8A8 expert runs on
    those rows alone (per-token quantisation and exact integer products work row by row); a bf16
    expert over every row, then selected (a library GEMM may round by row count)."""
    if w_scale is None:
        return dense_linear(inputs, w, None, int8_matmul_exact)[rows]
    return dense_linear(inputs[rows], w, w_scale, int8_matmul_exact)


def _provider(*args):
    """The `reference` provider: `moe_reference`, or its routed form under `routed_on_host()`
    (`moe_reference` itself stays a plain function: `repro report` copies it into scripts)."""
    return (moe_reference_routed if _ROUTED["on"] else moe_reference)(*args)


registry.register("moe", "reference", _provider, group="moe")
