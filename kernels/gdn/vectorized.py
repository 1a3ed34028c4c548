"""Batched GDN steps (`torch` provider): decode, and speculative decode one token position at a
time (1+k steps over all rows), every row and head at once, no host sync."""
from __future__ import annotations

import torch

from kernels._math import tree_sum
from kernels._state import accepted_column, scatter_last_wins, slot_rows
from kernels.gdn.common import prepare_qk


def decode_step(qf, kf, v, g, beta, S):
    """One token of B rows, fp32: qf, kf [B, Hv, dk] prepared, v [B, Hv, dv], g, beta [B, Hv],
    S [B, Hv, dk, dv] -> (o [B, Hv, dv], the new S). Sums by `tree_sum`: a row's bits do not depend on B."""
    S = S.float() * torch.exp(g.float())[..., None, None]
    delta = beta.float()[..., None] * (v.float() - tree_sum(kf[..., :, None] * S, -2))
    S = S + kf[..., :, None] * delta[..., None, :]
    return tree_sum(qf[..., :, None] * S, -2), S


def gated_delta_rule_decode_vectorized(q, k, v, g, beta, ssm_state, state_indices, sentinel):
    B, Hv, dv = v.shape
    valid, slot = slot_rows(state_indices, sentinel, ssm_state.shape[0])
    qf, kf = prepare_qk(q, k, Hv)                                           # [B, Hv, dk]
    old = ssm_state.index_select(0, slot)                                   # [B, Hv, dk, dv]
    o, S = decode_step(qf, kf, v, g, beta, old)
    scatter_last_wins(ssm_state, slot, valid, S, old)
    return torch.where(valid[:, None, None], o, 0.0).to(v.dtype)


def gated_delta_rule_spec_vectorized(q, k, v, g, beta, ssm_state, state_indices, num_accepted, query_start_loc,
                                     sentinel):
    T, Hv, dv = v.shape
    B, n = state_indices.shape
    if B == 0 or T == 0:
        return torch.zeros(T, Hv, dv, dtype=v.dtype, device=v.device)
    starts = query_start_loc.to(torch.int64)
    lengths = (starts[1:] - starts[:-1]).clamp(0, n)
    src = state_indices.gather(1, accepted_column(num_accepted, n)[:, None])[:, 0]
    valid, src_slot = slot_rows(src, sentinel, ssm_state.shape[0])
    valid = valid & (lengths > 0)
    qf, kf = prepare_qk(q, k, Hv)                                           # [T, Hv, dk]
    S = ssm_state.index_select(0, src_slot).float()                         # as before the call
    # token t of every row, all t at once (past a row's length: computed, not used): [n, B, ...]
    at = (starts[:-1][None, :] + torch.arange(n, device=v.device)[:, None]).clamp(0, T - 1).reshape(-1)
    kt, vt, gt, bt = (a.index_select(0, at).float().view(n, B, *a.shape[1:]) for a in (kf, v, g, beta))
    decay = torch.exp(gt)[..., None, None]
    states = []
    for t in range(n):                                                      # the recurrence (`decode_step`)
        S = S * decay[t]
        delta = bt[t][..., None] * (vt[t] - tree_sum(kt[t][..., :, None] * S, -2))
        S = S + kt[t][..., :, None] * delta[..., None, :]
        states.append(S)
    new = torch.stack(states, dim=1)                                        # [B, n, Hv, dk, dv]
    # every token's output from its state at once: elementwise, so the bits are decode_step's
    qt = qf.index_select(0, at).view(n, B, Hv, -1).transpose(0, 1)          # [B, n, Hv, dk]
    outs = tree_sum(qt[..., :, None] * new, -2)                             # [B, n, Hv, dv]

    # token i's output: its row's position i - starts[row]
    i = torch.arange(T, device=v.device)
    row = torch.bucketize(i, starts[1:], right=True).clamp(max=B - 1)
    pos = i - starts[row]
    mine = (i >= starts[0]) & (i < starts[-1]) & (pos < lengths[row]) & valid[row]
    o = outs.reshape(B * n, Hv, dv).index_select(0, row * n + pos.clamp(0, n - 1))
    # the state after token t of row b into the slot of column t, in (row, token) order
    dst_valid, dst_slot = slot_rows(state_indices.reshape(-1), sentinel, ssm_state.shape[0])
    live = (valid[:, None] & (torch.arange(n, device=v.device) < lengths[:, None])).reshape(-1) & dst_valid
    scatter_last_wins(ssm_state, dst_slot, live, new.reshape(B * n, *ssm_state.shape[1:]),
                      ssm_state.index_select(0, dst_slot))
    return torch.where(mine[:, None, None], o, 0.0).to(v.dtype)
