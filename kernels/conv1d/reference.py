"""Reference causal depthwise conv1d + SiLU: a Python loop over requests / rows."""
from __future__ import annotations

import torch

from kernels._state import slot_rows, write_rows_in_order
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
    history = [conv_state[i % S].float().clone() if h else torch.zeros(C, K - 1, device=x.device)
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
        conv_state[slot] = final.to(conv_state.dtype)
    return y


def causal_conv1d_update_reference(x, weight, conv_state, state_indices, sentinel):
    B, C = x.shape
    w = weight_2d(weight)
    K = w.shape[1]
    valid, slot = slot_rows(state_indices, sentinel, conv_state.shape[0])
    ys, news = [], []
    for b in range(B):
        hist = conv_state.index_select(0, slot[b:b + 1])[0]               # [C, K-1]
        taps = [hist[:, j].float() for j in range(K - 1)] + [x[b].float()]
        ys.append(conv_taps(taps, w))
        news.append(torch.cat([hist[:, 1:], x[b, :, None].to(conv_state.dtype)], dim=1))
    if B == 0:
        return torch.zeros(0, C, dtype=x.dtype, device=x.device)
    y = torch.where(valid[:, None], torch.stack(ys), 0.0).to(x.dtype)
    write_rows_in_order(conv_state, slot, valid, torch.stack(news))
    return y

