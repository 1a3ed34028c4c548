"""`repro::causal_conv1d_fn` (prefill, varlen) and `repro::causal_conv1d_update` (decode).

Depthwise causal conv over channels C with kernel K, `weight[:, K-1]` on the current token,
then SiLU; fp32 compute (sum over taps left to right), output in x's dtype. `conv_state`
[S, C, K-1] holds each sequence's last K-1 inputs (oldest first). State addressing, sentinel
and duplicate-index rules: `kernels/_state.py`. Providers: `reference` (loops), `torch`
(vectorised), `triton` (`triton.py`, K = 4); bit-identical.
"""
from __future__ import annotations

import torch

from kernels import registry
from kernels._library import define
from kernels.availability import triton
from kernels.registry import Source

__all__ = ["causal_conv1d_fn", "causal_conv1d_update"]

registry.declare(__name__, "conv1d", {
    "causal_conv1d_fn": {
        "reference": Source(".reference:causal_conv1d_fn_reference"),
        "torch": Source(".vectorized:causal_conv1d_fn_vectorized"),
        "triton": Source(".triton:causal_conv1d_fn", triton),
    },
    "causal_conv1d_update": {
        "reference": Source(".reference:causal_conv1d_update_reference"),
        "torch": Source(".vectorized:causal_conv1d_update_vectorized"),
        "triton": Source(".triton:causal_conv1d_update", triton),
    },
})


def _check(x, weight, conv_state):
    K = weight.shape[-1]
    if x.dim() != 2 or weight.shape[0] != x.shape[1] or weight.numel() != x.shape[1] * K:
        raise ValueError(f"causal_conv1d: x {tuple(x.shape)} and weight {tuple(weight.shape)} "
                         "must be [T, C] and [C, K] (or [C, 1, K])")
    if conv_state.dim() != 3 or conv_state.shape[1:] != (x.shape[1], K - 1) or conv_state.shape[0] < 1:
        raise ValueError(f"causal_conv1d: conv_state {tuple(conv_state.shape)} must be [S>=1, C, K-1]")


@define("causal_conv1d_fn", mutates_args=("conv_state",))
def causal_conv1d_fn(x: torch.Tensor, weight: torch.Tensor, conv_state: torch.Tensor,
                     query_start_loc: torch.Tensor, state_indices: torch.Tensor,
                     has_initial_state: torch.Tensor, sentinel: int) -> torch.Tensor:
    """Prefill. x [T, C]; request b owns tokens query_start_loc[b]:query_start_loc[b+1] and
    conv_state row state_indices[b] (history used only where has_initial_state[b], else zeros;
    its last K-1 inputs are written back). Sentinel requests and tokens outside every request
    give zero rows. The `reference` provider syncs with the host."""
    _check(x, weight, conv_state)
    return registry.impl("causal_conv1d_fn")(x, weight, conv_state, query_start_loc, state_indices,
                                             has_initial_state, sentinel)


@causal_conv1d_fn.register_fake
def _(x, weight, conv_state, query_start_loc, state_indices, has_initial_state, sentinel):
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


@define("causal_conv1d_update", mutates_args=("conv_state",))
def causal_conv1d_update(x: torch.Tensor, weight: torch.Tensor, conv_state: torch.Tensor,
                         state_indices: torch.Tensor, sentinel: int) -> torch.Tensor:
    """Decode, one token per row. x [B, C] -> y [B, C]; graph-safe (no host sync)."""
    _check(x, weight, conv_state)
    return registry.impl("causal_conv1d_update")(x, weight, conv_state, state_indices, sentinel)


@causal_conv1d_update.register_fake
def _(x, weight, conv_state, state_indices, sentinel):
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)
