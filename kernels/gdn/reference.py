"""Reference GDN: gating, a per-row decode step, and a chunked prefill (WY form, chunks of 64).

Recurrence per value head (row-vector convention, S [dk, dv], a_t = exp(g_t)):
    S_t = a_t S_{t-1} + k_t^T u_t,   u_t = beta_t (v_t - k_t a_t S_{t-1}),   o_t = q_t S_t.
Chunk of n tokens starting from state S0, with G_i = g_1 + ... + g_i (cumulative within the chunk):
    S_i = e^{G_i} S0 + sum_{j<=i} e^{G_i - G_j} k_j^T u_j
so u solves the unit lower-triangular system
    u_i + beta_i sum_{j<i} e^{G_i - G_j} (k_i . k_j) u_j = beta_i (v_i - e^{G_i} k_i S0),
and then
    o_i = e^{G_i} q_i S0 + sum_{j<=i} e^{G_i - G_j} (q_i . k_j) u_j,
    S_n = e^{G_n} S0 + sum_j e^{G_n - G_j} k_j^T u_j.
Exponents are masked to -inf above the diagonal before exp (no inf * 0).
"""
from __future__ import annotations

import torch

from kernels._math import sigmoid
from kernels._state import accepted_column, slot_rows, write_rows_in_order
from kernels.gdn.common import prepare_qk, softplus

CHUNK_SIZE = 64


def gdn_gating_reference(A_log, a, dt_bias, b):
    g = -torch.exp(A_log.float()) * softplus(a.float() + dt_bias.float())
    return g, sigmoid(b.float())


def decode_step(qf, kf, v, g, beta, S):
    """One token, every head, fp32: qf, kf [Hv, dk] prepared, v [Hv, dv], g, beta [Hv], S [Hv, dk, dv]
    -> (o [Hv, dv], the new S)."""
    S = S * torch.exp(g.float())[:, None, None]
    delta = beta.float()[:, None] * (v.float() - (kf[:, None, :] @ S)[:, 0])
    S = S + kf[:, :, None] * delta[:, None, :]
    return (qf[:, None, :] @ S)[:, 0], S


def gated_delta_rule_decode_reference(q, k, v, g, beta, ssm_state, state_indices, sentinel):
    B, Hv, dv = v.shape
    valid, slot = slot_rows(state_indices, sentinel, ssm_state.shape[0])
    qf, kf = prepare_qk(q, k, Hv)
    outs, news = [], []
    for b in range(B):
        S = ssm_state.index_select(0, slot[b:b + 1])[0].float()            # [Hv, dk, dv]
        o, S = decode_step(qf[b], kf[b], v[b], g[b], beta[b], S)
        outs.append(o)
        news.append(S)
    if B == 0:
        return torch.zeros(0, Hv, dv, dtype=v.dtype, device=v.device)
    o = torch.where(valid[:, None, None], torch.stack(outs), 0.0).to(v.dtype)
    write_rows_in_order(ssm_state, slot, valid, torch.stack(news))
    return o


def chunked_gated_delta_rule(q, k, v, g, beta, S, chunk_size=CHUNK_SIZE):
    """One sequence, all heads, fp32. q, k [L, Hv, dk] (prepared), v [L, Hv, dv], g, beta [L, Hv],
    S [Hv, dk, dv] -> (o [L, Hv, dv], final S)."""
    q, k, v = (x.transpose(0, 1) for x in (q, k, v))                      # [Hv, L, d]
    g, beta = g.t(), beta.t()                                               # [Hv, L]
    L = q.shape[1]
    outs = []
    for c0 in range(0, L, chunk_size):
        c1 = min(c0 + chunk_size, L)
        n = c1 - c0
        Q, Kc, V, b = q[:, c0:c1], k[:, c0:c1], v[:, c0:c1], beta[:, c0:c1, None]
        G = torch.cumsum(g[:, c0:c1], dim=-1)                               # [Hv, n]
        i = torch.arange(n, device=q.device)
        diff = G[:, :, None] - G[:, None, :]                                # G_i - G_j
        decay_lower = torch.exp(torch.where(i[:, None] > i[None, :], diff, float("-inf")))
        decay_causal = torch.exp(torch.where(i[:, None] >= i[None, :], diff, float("-inf")))
        eG = torch.exp(G)[..., None]                                        # [Hv, n, 1]
        system = torch.eye(n, device=q.device) + b * decay_lower * (Kc @ Kc.transpose(1, 2))
        rhs = b * (V - eG * (Kc @ S))
        U = torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)
        outs.append(eG * (Q @ S) + (decay_causal * (Q @ Kc.transpose(1, 2))) @ U)
        S = torch.exp(G[:, -1])[:, None, None] * S + Kc.transpose(1, 2) @ (torch.exp(G[:, -1:] - G)[..., None] * U)
    o = torch.cat(outs, dim=1) if outs else v.new_zeros(v.shape)
    return o.transpose(0, 1), S


def gated_delta_rule_prefill_reference(q, k, v, g, beta, ssm_state, query_start_loc, state_indices,
                                       has_initial_state, sentinel, chunk_size=CHUNK_SIZE):
    T, Hv, dv = v.shape
    dk = q.shape[-1]
    n_slots = ssm_state.shape[0]
    o = torch.zeros(T, Hv, dv, dtype=v.dtype, device=v.device)
    qf, kf = prepare_qk(q, k, Hv)
    starts = query_start_loc.tolist()
    indices = state_indices.tolist()
    has_init = has_initial_state.tolist()
    initial = [ssm_state[i % n_slots].float().clone() if h else torch.zeros(Hv, dk, dv, device=v.device)
               for i, h in zip(indices, has_init)]                          # snapshot before writes
    finals = []
    for b, index in enumerate(indices):
        if index == sentinel:
            continue
        s, e = starts[b], starts[b + 1]
        ob, S = chunked_gated_delta_rule(qf[s:e], kf[s:e], v[s:e].float(), g[s:e].float(),
                                         beta[s:e].float(), initial[b], chunk_size)
        o[s:e] = ob.to(v.dtype)
        finals.append((index % n_slots, S))
    for slot, S in finals:                                                  # in order: last wins
        ssm_state[slot] = S.to(ssm_state.dtype)
    return o



def gated_delta_rule_spec_reference(q, k, v, g, beta, ssm_state, state_indices, num_accepted, query_start_loc,
                                    sentinel):
    """Row by row, token by token (`decode_step`), from the state the row's accepted column names
    as it was before the call; the state after token t into the slot of column t. Host values stay
    on the device (a padding row's writes are `torch.where`s that rewrite what is there), so that
    this provider captures in a graph too."""
    T, Hv, dv = v.shape
    B, n = state_indices.shape
    o = torch.zeros(T, Hv, dv, dtype=v.dtype, device=v.device)
    if B == 0 or T == 0:
        return o
    starts = query_start_loc.to(torch.int64)
    lengths = (starts[1:] - starts[:-1]).clamp(0, n)
    src = state_indices.gather(1, accepted_column(num_accepted, n)[:, None])[:, 0]
    valid, src_slot = slot_rows(src, sentinel, ssm_state.shape[0])
    valid = valid & (lengths > 0)
    dst_valid, dst_slot = slot_rows(state_indices, sentinel, ssm_state.shape[0])      # [B, n]
    initial = ssm_state.index_select(0, src_slot)                          # every row reads the cache as before
    qf, kf = prepare_qk(q, k, Hv)
    for b in range(B):
        S = initial[b].float()
        for t in range(n):
            live = valid[b] & (t < lengths[b])
            at = (starts[b] + t).clamp(0, T - 1).view(1)
            out, S = decode_step(*(a.index_select(0, at)[0] for a in (qf, kf, v, g, beta)), S)   # past L: unused
            o.index_copy_(0, at, torch.where(live, out.to(v.dtype), o.index_select(0, at)[0])[None])
            dst = dst_slot[b, t:t + 1]                                     # in (row, token) order: the last wins
            current = ssm_state.index_select(0, dst)[0]
            ssm_state.index_copy_(0, dst, torch.where(live & dst_valid[b, t], S.to(ssm_state.dtype), current)[None])
    return o
