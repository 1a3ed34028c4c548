"""Batched GDN decode step (`torch` provider): all rows and heads at once, no host sync."""
from __future__ import annotations

import torch

from kernels._math import tree_sum
from kernels._state import scatter_last_wins, slot_rows
from kernels.gdn.common import prepare_qk


def gated_delta_rule_decode_vectorized(q, k, v, g, beta, ssm_state, state_indices, sentinel):
    B, Hv, dv = v.shape
    valid, slot = slot_rows(state_indices, sentinel, ssm_state.shape[0])
    qf, kf = prepare_qk(q, k, Hv)                                           # [B, Hv, dk]
    old = ssm_state.index_select(0, slot)                                   # [B, Hv, dk, dv]
    S = old.float() * torch.exp(g.float())[..., None, None]
    delta = beta.float()[..., None] * (v.float() - tree_sum(kf[..., :, None] * S, -2))
    S = S + kf[..., :, None] * delta[..., None, :]
    o = torch.where(valid[:, None, None], tree_sum(qf[..., :, None] * S, -2), 0.0).to(v.dtype)
    scatter_last_wins(ssm_state, slot, valid, S, old)
    return o

