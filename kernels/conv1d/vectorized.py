"""Vectorised causal conv1d (`torch` provider): gathers instead of Python loops, no host sync.

Prefill: every token's K taps are gathered from one buffer holding the batch's tokens followed
by each request's K-1 history columns; each request's new history is gathered the same way.
Decode: one window per row. Both write states with the race-free `scatter_last_wins`.
"""
from __future__ import annotations

import torch

from kernels._state import scatter_last_wins, slot_rows
from kernels.conv1d.common import conv_taps, weight_2d


def causal_conv1d_fn_vectorized(x, weight, conv_state, query_start_loc, state_indices,
                                has_initial_state, sentinel):
    T, C = x.shape
    w = weight_2d(weight)
    K = w.shape[1]
    B = state_indices.shape[0]
    if B == 0:
        return torch.zeros(T, C, dtype=x.dtype, device=x.device)
    valid, slot = slot_rows(state_indices, sentinel, conv_state.shape[0])
    old = conv_state.index_select(0, slot)                                  # [B, C, K-1]
    history = torch.where(has_initial_state.view(B, 1, 1), old, torch.zeros_like(old))
    # rows 0..T-1: the tokens; row T + b*(K-1) + i: request b's history column i
    buf = torch.cat([x.float(), history.float().transpose(1, 2).reshape(B * (K - 1), C)])

    starts = query_start_loc.to(torch.int64)
    t = torch.arange(T, device=x.device)
    req = torch.bucketize(t, starts[1:], right=True)                      # starts[b] <= t < starts[b+1]
    req_c = req.clamp(max=B - 1)
    in_req = (req < B) & (t >= starts[req_c])
    pos = t - starts[req_c]                                                 # position within the request

    def source(pos, j, first_row, req):
        """Row of `buf` holding the input j - (K-1) steps before position `pos` of request `req`."""
        back = pos - (K - 1) + j
        return torch.where(back >= 0, first_row + back, T + req * (K - 1) + pos + j)

    taps = [buf.index_select(0, torch.where(in_req, source(pos, j, starts[req_c], req_c), 0))
            for j in range(K)]
    y = torch.where((in_req & valid[req_c])[:, None], conv_taps(taps, w), 0.0).to(x.dtype)

    lengths = starts[1:] - starts[:-1]
    b = torch.arange(B, device=x.device)
    cols = [buf.index_select(0, source(lengths - 1, m + 1, starts[:-1], b)) for m in range(K - 1)]
    new = torch.stack(cols, dim=2).to(conv_state.dtype) if K > 1 else old   # [B, C, K-1]
    scatter_last_wins(conv_state, slot, valid, new, old)
    return y


def causal_conv1d_update_vectorized(x, weight, conv_state, state_indices, sentinel):
    B, C = x.shape
    w = weight_2d(weight)
    K = w.shape[1]
    valid, slot = slot_rows(state_indices, sentinel, conv_state.shape[0])
    old = conv_state.index_select(0, slot)                                  # [B, C, K-1]
    taps = [old[:, :, j].float() for j in range(K - 1)] + [x.float()]
    y = torch.where(valid[:, None], conv_taps(taps, w), 0.0).to(x.dtype)
    new = torch.cat([old[:, :, 1:], x[:, :, None].to(conv_state.dtype)], dim=2)
    scatter_last_wins(conv_state, slot, valid, new, old)
    return y

