"""`repro::causal_conv1d_fn` (prefill, varlen), `repro::causal_conv1d_update` (decode) and
`repro::causal_conv1d_update_spec` (decode with k draft tokens a row, vLLM's speculative path).

Depthwise causal conv over channels C with kernel K, `weight[:, K-1]` on the current token,
then SiLU; fp32 compute (sum over taps left to right), output in x's dtype. `conv_state`
[S, C, K-1+k] holds each sequence's inputs, oldest first: columns 0..K-2 are its last K-1 (all that
the prefill and plain decode read and write: they leave the k columns after them as they are); the
speculative op reads a window K-1 columns wide starting at column `num_accepted - 1` and writes the
window's last K-2 columns followed by its tokens from column 0 (vLLM's `causal_conv1d_update` with
`num_accepted_tokens`), so that the next step's window, at the column its accepted count names,
is the last K-1 inputs up to the last accepted token. State addressing, sentinel and duplicate
rules: `kernels/_state.py`. Providers: `reference` (loops), `torch` (vectorised), `triton`
(`triton.py`, K = 4); bit-identical. No `vllm_xpu` provider: vllm-xpu-kernels 0.1.16.2's conv
stages (`causal_conv1d_spec`, `causal_conv1d_non_spec`) take [q | k | v | z] and return q, k, v
split, and keep a spec row's windows in one block per draft column rather than at an offset in
column 0's block as this op does (`kernels/gdn/xpu_rules.py`); the whole GDN core has one
(`repro::gdn_attention`).
"""
from __future__ import annotations

import torch

from kernels import registry
from kernels._library import define
from kernels.availability import triton
from kernels.registry import Source

__all__ = ["causal_conv1d_fn", "causal_conv1d_update", "causal_conv1d_update_spec"]

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
    "causal_conv1d_update_spec": {
        "reference": Source(".reference:causal_conv1d_update_spec_reference"),
        "torch": Source(".vectorized:causal_conv1d_update_spec_vectorized"),
        "triton": Source(".triton:causal_conv1d_update_spec", triton),
    },
})


def _check(x, weight, conv_state):
    K = weight.shape[-1]
    if x.dim() != 2 or weight.shape[0] != x.shape[1] or weight.numel() != x.shape[1] * K:
        raise ValueError(f"causal_conv1d: x {tuple(x.shape)} and weight {tuple(weight.shape)} "
                         "must be [T, C] and [C, K] (or [C, 1, K])")
    if conv_state.dim() != 3 or conv_state.shape[1] != x.shape[1] or conv_state.shape[2] < K - 1 or \
            conv_state.shape[0] < 1:
        raise ValueError(f"causal_conv1d: conv_state {tuple(conv_state.shape)} must be [S>=1, C, K-1+k] (k >= 0)")


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


@define("causal_conv1d_update_spec", mutates_args=("conv_state",))
def causal_conv1d_update_spec(x: torch.Tensor, weight: torch.Tensor, conv_state: torch.Tensor,
                              state_indices: torch.Tensor, num_accepted: torch.Tensor,
                              query_start_loc: torch.Tensor, sentinel: int) -> torch.Tensor:
    """Speculative decode: x [T, C] -> y [T, C]; conv_state [S, C, K-1+k]; row b owns tokens
    query_start_loc[b]:query_start_loc[b+1] (at most n = 1+k; zero-length rows are padding) and
    slot state_indices[b]; with a = num_accepted[b], its window is the slot's columns a-1 .. a+K-3
    as they were before the call, token t's output is the conv of the window followed by x_0..x_t
    (as `causal_conv1d_update` computes one token), and afterwards the slot's columns
    0 .. K-3+L hold [window[1:], x_0, ..., x_{L-1}] (the columns after them are untouched; several
    rows on one slot: the last row that writes a column wins). Padding rows, sentinel rows and
    tokens outside every row give zero rows. Graph-safe (no host sync)."""
    _check(x, weight, conv_state)
    B = state_indices.shape[0]
    if state_indices.dim() != 1 or num_accepted.shape != (B,) or query_start_loc.shape != (B + 1,):
        raise ValueError(f"causal_conv1d_update_spec: state_indices {tuple(state_indices.shape)}, num_accepted "
                         f"{tuple(num_accepted.shape)}, query_start_loc {tuple(query_start_loc.shape)}: need [B], [B], [B+1]")
    return registry.impl("causal_conv1d_update_spec")(x, weight, conv_state, state_indices, num_accepted,
                                                      query_start_loc, sentinel)


@causal_conv1d_update_spec.register_fake
def _(x, weight, conv_state, state_indices, num_accepted, query_start_loc, sentinel):
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)
