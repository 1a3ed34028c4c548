"""Reference causal depthwise conv1d + SiLU: a Python loop over requests / rows (and tokens)."""
from __future__ import annotations

import torch

from kernels._state import accepted_column, slot_rows, write_rows_in_order
from kernels.conv1d.common import conv_taps, weight_2d


def causal_conv1d_fn_reference(x, weight, conv_state, query_start_loc, state_indices,
                               has_initial_state, sentinel):
    T, C = x.shape
    w = weight_2d(weight)
    K = w.shape[1]
    S = conv_state.shape[0]
    y = torch.zeros(T, C, dtype=x.dtype, device=x.device)
    starts = query_start_loc.tolist()
    indices = state_indices.tolist()
    has_init = has_initial_state.tolist()
    # every request reads the cache as it was before the call (snapshot)
    history = [conv_state[i % S, :, :K - 1].float().clone() if h else torch.zeros(C, K - 1, device=x.device)
               for i, h in zip(indices, has_init)]
    finals = []
    for b, index in enumerate(indices):
        if index == sentinel:
            continue
        s, e = starts[b], starts[b + 1]
        seq = torch.cat([history[b], x[s:e].float().t()], dim=1)          # [C, K-1+L]
        L = e - s
        taps = [seq[:, j:j + L].t() for j in range(K)]                     # [L, C] each
        y[s:e] = conv_taps(taps, w).to(x.dtype)
        finals.append((index % S, seq[:, seq.shape[1] - (K - 1):]))        # last K-1 inputs
    for slot, final in finals:                                             # in order: last wins
        conv_state[slot, :, :K - 1] = final.to(conv_state.dtype)
    return y


def causal_conv1d_update_reference(x, weight, conv_state, state_indices, sentinel):
    B, C = x.shape
    w = weight_2d(weight)
    K = w.shape[1]
    valid, slot = slot_rows(state_indices, sentinel, conv_state.shape[0])
    ys, news = [], []
    for b in range(B):
        hist = conv_state.index_select(0, slot[b:b + 1])[0]               # [C, K-1+k]
        taps = [hist[:, j].float() for j in range(K - 1)] + [x[b].float()]
        ys.append(conv_taps(taps, w))
        news.append(torch.cat([hist[:, 1:K - 1], x[b, :, None].to(conv_state.dtype), hist[:, K - 1:]], dim=1))
    if B == 0:
        return torch.zeros(0, C, dtype=x.dtype, device=x.device)
    y = torch.where(valid[:, None], torch.stack(ys), 0.0).to(x.dtype)
    write_rows_in_order(conv_state, slot, valid, torch.stack(news))
    return y


def causal_conv1d_update_spec_reference(x, weight, conv_state, state_indices, num_accepted, query_start_loc,
                                        sentinel):
    """Row by row, token by token. Host values are kept on the device (a padding row's writes are
    `torch.where`s that rewrite what is there), so that this provider captures in a graph too."""
    T, C = x.shape
    w = weight_2d(weight)
    K = w.shape[1]
    S, _, width = conv_state.shape
    n = width - (K - 1) + 1                                                # 1 + k: a row's most tokens
    B = state_indices.shape[0]
    y = torch.zeros(T, C, dtype=x.dtype, device=x.device)
    if B == 0 or T == 0:
        return y
    valid, slot = slot_rows(state_indices, sentinel, S)
    starts = query_start_loc.to(torch.int64)
    lengths = (starts[1:] - starts[:-1]).clamp(0, n)
    valid = valid & (lengths > 0)
    first = accepted_column(num_accepted, n)
    old = conv_state.index_select(0, slot)                                 # every row reads the cache as before
    column = torch.arange(width, device=x.device)
    news, writes = [], []
    for b in range(B):
        window = old[b].index_select(1, first[b] + torch.arange(K - 1, device=x.device))   # [C, K-1]
        at = (starts[b] + torch.arange(n, device=x.device)).clamp(0, T - 1)               # row b's tokens
        tokens = x.index_select(0, at)                                                     # [n, C]
        seq = torch.cat([window.float(), tokens.float().t()], dim=1)                      # [C, K-1+n]
        for t in range(n):
            live = valid[b] & (t < lengths[b])
            out = conv_taps([seq[:, t + j] for j in range(K)], w).to(x.dtype)
            y.index_copy_(0, at[t:t + 1], torch.where(live, out, y.index_select(0, at[t:t + 1])[0])[None])
        news.append(torch.cat([window[:, 1:], tokens.t().to(conv_state.dtype)], dim=1))  # [C, K-2+n]
        writes.append(valid[b] & (column < K - 2 + lengths[b]))
    for b in range(B):                                                     # in order: a column's last writer wins
        at = slot[b:b + 1]
        conv_state.index_copy_(0, at, torch.where(writes[b], news[b], conv_state.index_select(0, at)[0])[None])
    return y
