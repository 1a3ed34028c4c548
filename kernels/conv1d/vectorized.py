"""Vectorised causal conv1d (`torch` provider): gathers instead of Python loops, no host sync.

Prefill: every token's K taps are gathered from one buffer holding the batch's tokens followed
by each request's K-1 history columns; each request's new history is gathered the same way.
Decode: one window per row. Speculative decode: each row's window (at its accepted column)
followed by its 1+k token slots, every tap a slice of that sequence. States are written with the
race-free `scatter_last_wins` (by column for the speculative op: `scatter_columns_last_wins`).
"""
from __future__ import annotations

import torch

from kernels._state import accepted_column, scatter_columns_last_wins, scatter_last_wins, slot_rows
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
    old = conv_state.index_select(0, slot)                                  # [B, C, K-1+k]
    history = torch.where(has_initial_state.view(B, 1, 1), old[..., :K - 1], torch.zeros_like(old[..., :K - 1]))
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
    new = torch.stack(cols, dim=2).to(conv_state.dtype) if K > 1 else old[..., :0]   # [B, C, K-1]
    scatter_last_wins(conv_state, slot, valid, torch.cat([new, old[..., K - 1:]], dim=2), old)
    return y


def causal_conv1d_update_vectorized(x, weight, conv_state, state_indices, sentinel):
    B, C = x.shape
    w = weight_2d(weight)
    K = w.shape[1]
    valid, slot = slot_rows(state_indices, sentinel, conv_state.shape[0])
    old = conv_state.index_select(0, slot)                                  # [B, C, K-1+k]
    taps = [old[:, :, j].float() for j in range(K - 1)] + [x.float()]
    y = torch.where(valid[:, None], conv_taps(taps, w), 0.0).to(x.dtype)
    new = torch.cat([old[:, :, 1:K - 1], x[:, :, None].to(conv_state.dtype), old[:, :, K - 1:]], dim=2)
    scatter_last_wins(conv_state, slot, valid, new, old)
    return y



def causal_conv1d_update_spec_vectorized(x, weight, conv_state, state_indices, num_accepted, query_start_loc,
                                         sentinel):
    T, C = x.shape
    w = weight_2d(weight)
    K = w.shape[1]
    S, _, width = conv_state.shape
    n = width - (K - 1) + 1                                                 # 1 + k: a row's most tokens
    B = state_indices.shape[0]
    if B == 0 or T == 0:
        return torch.zeros(T, C, dtype=x.dtype, device=x.device)
    valid, slot = slot_rows(state_indices, sentinel, S)
    starts = query_start_loc.to(torch.int64)
    lengths = (starts[1:] - starts[:-1]).clamp(0, n)
    valid = valid & (lengths > 0)
    old = conv_state.index_select(0, slot)                                  # [B, C, K-1+k]
    cols = accepted_column(num_accepted, n)[:, None, None] + torch.arange(K - 1, device=x.device)
    window = old.gather(2, cols.expand(B, C, K - 1))                        # [B, C, K-1]
    at = (starts[:-1, None] + torch.arange(n, device=x.device)).clamp(0, T - 1)   # [B, n]: the rows' tokens
    tokens = x.index_select(0, at.reshape(-1)).view(B, n, C)
    seq = torch.cat([window.float().transpose(1, 2), tokens.float()], dim=1)      # [B, K-1+n, C]
    ys = conv_taps([seq[:, j:j + n] for j in range(K)], w).reshape(B * n, C)

    t = torch.arange(T, device=x.device)
    row = torch.bucketize(t, starts[1:], right=True)                        # starts[row] <= t < starts[row+1]
    row_c = row.clamp(max=B - 1)
    pos = t - starts[row_c]
    mine = (row < B) & (pos >= 0) & (pos < lengths[row_c]) & valid[row_c]
    y = torch.where(mine[:, None], ys.index_select(0, row_c * n + pos.clamp(0, n - 1)), 0.0).to(x.dtype)

    new = torch.cat([window[..., 1:], tokens.transpose(1, 2).to(conv_state.dtype)], dim=2)   # [B, C, K-2+n]
    writes = valid[:, None] & (torch.arange(width, device=x.device) < (K - 2 + lengths)[:, None])
    scatter_columns_last_wins(conv_state, slot, writes, new, old)
    return y
