"""An independent token-by-token formulation of the gated delta rule, for tests only.

Written apart from the providers on purpose: float64 by default, key head chosen by an index
table rather than repeat_interleave, normalisation as x / sqrt(.), states never written in
place. Returns (o [T, Hv, dv] in `dtype`, a new state cache in `dtype`); same sentinel,
snapshot and last-wins rules as the ops.
"""
from __future__ import annotations

import torch


def gated_delta_rule_recurrent(q, k, v, g, beta, ssm_state, query_start_loc, state_indices,
                               has_initial_state, sentinel, dtype=torch.float64):
    T, Hk, dk = q.shape
    Hv, dv = v.shape[1:]
    key_head = torch.arange(Hv, device=q.device) // (Hv // Hk)
    before = ssm_state.to(dtype).clone()
    cache = before.clone()
    o = torch.zeros(T, Hv, dv, dtype=dtype, device=v.device)
    n_slots = before.shape[0]
    starts = [int(s) for s in query_start_loc]
    for b, index in enumerate(int(i) for i in state_indices):
        if index == sentinel:
            continue
        S = before[index % n_slots].clone() if bool(has_initial_state[b]) else \
            torch.zeros(Hv, dk, dv, dtype=dtype, device=v.device)
        for t in range(starts[b], starts[b + 1]):
            qt = q[t].to(dtype)[key_head]
            kt = k[t].to(dtype)[key_head]
            qt = qt / torch.sqrt((qt ** 2).sum(-1, keepdim=True) + 1e-6) / dk ** 0.5
            kt = kt / torch.sqrt((kt ** 2).sum(-1, keepdim=True) + 1e-6)
            S = S * torch.exp(g[t].to(dtype))[:, None, None]
            delta = beta[t].to(dtype)[:, None] * (v[t].to(dtype) - torch.einsum("hk,hkv->hv", kt, S))
            S = S + torch.einsum("hk,hv->hkv", kt, delta)
            o[t] = torch.einsum("hk,hkv->hv", qt, S)
        cache[index % n_slots] = S
    return o, cache
