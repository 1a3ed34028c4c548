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
from kernels._state import slot_rows, write_rows_in_order
from kernels.gdn.common import prepare_qk, softplus

CHUNK_SIZE = 64


def gdn_gating_reference(A_log, a, dt_bias, b):
    g = -torch.exp(A_log.float()) * softplus(a.float() + dt_bias.float())
    return g, sigmoid(b.float())


def gated_delta_rule_decode_reference(q, k, v, g, beta, ssm_state, state_indices, sentinel):
    B, Hv, dv = v.shape
    valid, slot = slot_rows(state_indices, sentinel, ssm_state.shape[0])
    qf, kf = prepare_qk(q, k, Hv)
    outs, news = [], []
    for b in range(B):
        S = ssm_state.index_select(0, slot[b:b + 1])[0].float()            # [Hv, dk, dv]
        S = S * torch.exp(g[b].float())[:, None, None]
        kb = kf[b]                                                          # [Hv, dk]
        delta = beta[b].float()[:, None] * (v[b].float() - (kb[:, None, :] @ S)[:, 0])
        S = S + kb[:, :, None] * delta[:, None, :]
        outs.append((qf[b][:, None, :] @ S)[:, 0])
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

