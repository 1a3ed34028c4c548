"""An independent token-by-token formulation of the gated delta rule, for tests only.

Written apart from the providers on purpose: float64 by default, key head chosen by an index
table rather than repeat_interleave, normalisation as x / sqrt(.), states never written in
place. Returns (o [T, Hv, dv] in `dtype`, a new state cache in `dtype`); same sentinel,
snapshot and last-wins rules as the ops.
"""
from __future__ import annotations

import torch


def _token(q, k, v, g, beta, S, key_head, dtype):
    """One token, every head: (o [Hv, dv], the new S)."""
    dk = q.shape[-1]
    qt, kt = q.to(dtype)[key_head], k.to(dtype)[key_head]
    qt = qt / torch.sqrt((qt ** 2).sum(-1, keepdim=True) + 1e-6) / dk ** 0.5
    kt = kt / torch.sqrt((kt ** 2).sum(-1, keepdim=True) + 1e-6)
    S = S * torch.exp(g.to(dtype))[:, None, None]
    delta = beta.to(dtype)[:, None] * (v.to(dtype) - torch.einsum("hk,hkv->hv", kt, S))
    S = S + torch.einsum("hk,hv->hkv", kt, delta)
    return torch.einsum("hk,hkv->hv", qt, S), S


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
            o[t], S = _token(q[t], k[t], v[t], g[t], beta[t], S, key_head, dtype)
        cache[index % n_slots] = S
    return o, cache


def gated_delta_rule_spec_recurrent(q, k, v, g, beta, ssm_state, state_indices, num_accepted, query_start_loc,
                                    sentinel, dtype=torch.float64):
    """The speculative op's rule: row b starts from the slot of column num_accepted[b] - 1 and puts
    the state after its token t into the slot of column t; rows hold at most 1 + k tokens."""
    Hk, Hv = q.shape[1], v.shape[1]
    key_head = torch.arange(Hv, device=q.device) // (Hv // Hk)
    before = ssm_state.to(dtype).clone()
    cache = before.clone()
    o = torch.zeros(v.shape, dtype=dtype, device=v.device)
    n_slots, width = before.shape[0], state_indices.shape[1]
    starts = [int(s) for s in query_start_loc]
    for b, row in enumerate(state_indices.tolist()):
        src = row[min(max(int(num_accepted[b]), 1), width) - 1]
        if src == sentinel:
            continue
        S = before[src % n_slots].clone()
        for t in range(min(max(starts[b + 1] - starts[b], 0), width)):
            o[starts[b] + t], S = _token(*(a[starts[b] + t] for a in (q, k, v, g, beta)), S, key_head, dtype)
            if row[t] != sentinel:
                cache[row[t] % n_slots] = S
    return o, cache
