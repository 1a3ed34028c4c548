"""`triton` provider of `repro::gdn_gating` (one kernel, bit-identical),
`repro::gated_delta_rule_decode` (q/k L2 norm + decay + delta rule + output, one kernel; within
fp32 rounding of the reference: reductions in another order), `repro::gated_delta_rule_prefill`
(the same step, token after token of each request, the state held in registers between tokens:
the recurrent form, within fp32 rounding of the reference's chunked form) and
`repro::gated_delta_rule_spec` (the same step over each row's 1+k tokens, the state after each
stored to its column's slot). State rows follow `kernels/_state.py` as in `kernels/conv1d/triton.py`;
the speculative kernel reads its rows' initial states from a copy taken before it runs (a row's
slots may be another row's), so it writes every (row, token) in order and the last one wins.
Declared in the folder's `__init__.py`; imported on first use (needs triton).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._state import accepted_column, slot_rows
from kernels.triton_helpers import (_add, _cdiv, _div, _exp, _last_claimant, _log1p, _mul, _np2, _slot)
from kernels.triton_launch import launch


@triton.jit
def _gating_kernel(A_ptr, a_ptr, dt_ptr, b_ptr, g_ptr, beta_ptr, N, HV, sa, sb, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < N
    t = offs // HV
    h = offs % HV
    A = tl.load(A_ptr + h, mask=m, other=0.0).to(tl.float32)
    dt = tl.load(dt_ptr + h, mask=m, other=0.0).to(tl.float32)
    av = tl.load(a_ptr + t * sa + h, mask=m, other=0.0).to(tl.float32)
    bv = tl.load(b_ptr + t * sb + h, mask=m, other=0.0).to(tl.float32)
    x = _add(av, dt)
    sp = tl.where(x > 20.0, x, _log1p(_exp(x)))
    tl.store(g_ptr + offs, _mul(-_exp(A), sp), mask=m)
    tl.store(beta_ptr + offs, _div(1.0, _add(1.0, _exp(-bv))), mask=m)


def gdn_gating(A_log, a, dt_bias, b):
    T, Hv = a.shape
    g = torch.empty(T, Hv, dtype=torch.float32, device=a.device)
    beta = torch.empty(T, Hv, dtype=torch.float32, device=a.device)
    if T == 0:
        return g, beta
    a = a if a.stride(1) == 1 else a.contiguous()
    b = b if b.stride(1) == 1 else b.contiguous()
    BLOCK = 256
    launch(_gating_kernel, (_cdiv(T * Hv, BLOCK),), A_log.contiguous(), a, dt_bias.contiguous(), b, g, beta,
           T * Hv, Hv, a.stride(0), b.stride(0), BLOCK=BLOCK, num_warps=4)
    return g, beta


@triton.jit
def _gdn_step(q, k, v, g, beta, st, scale):
    """One token on a value-column block st [DK, BV] of one head's state: q, k L2-normalised (q
    scaled), decay exp(g), delta rule. Returns (o [BV], the new st)."""
    q = q * (1.0 / tl.sqrt(tl.sum(q * q, axis=0) + 1e-6)) * scale
    k = k * (1.0 / tl.sqrt(tl.sum(k * k, axis=0) + 1e-6))
    st = st * tl.exp(g)
    delta = beta * (v - tl.sum(k[:, None] * st, axis=0))
    st = st + k[:, None] * delta[None, :]
    return tl.sum(q[:, None] * st, axis=0), st


@triton.jit
def _gdn_decode_kernel(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, s_ptr, idx_ptr, o_ptr, B, S, sentinel,
                       sqb, sqh, skb, skh, svb, svh, sgb, sbb, sob, soh, ss_s, ss_h, scale,
                       GROUP: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, BV: tl.constexpr,
                       BB: tl.constexpr):
    """Value head h, value columns rv of every row b in order: one recurrent step on its slot."""
    h = tl.program_id(0)
    rv = tl.program_id(1) * BV + tl.arange(0, BV)
    vm = rv < DV
    rk = tl.arange(0, DK)
    kh = h // GROUP
    for b in range(0, B):
        idx = tl.load(idx_ptr + b).to(tl.int64)
        valid, slot = _slot(idx, sentinel, S)
        write = _last_claimant(b, slot, valid, idx_ptr, B, S, sentinel, BB)
        q = tl.load(q_ptr + b * sqb + kh * sqh + rk).to(tl.float32)
        k = tl.load(k_ptr + b * skb + kh * skh + rk).to(tl.float32)
        sp = s_ptr + slot * ss_s + h * ss_h + rk[:, None] * DV + rv[None, :]
        st = tl.load(sp, mask=vm[None, :], other=0.0)
        v = tl.load(v_ptr + b * svb + h * svh + rv, mask=vm, other=0.0).to(tl.float32)
        o, st = _gdn_step(q, k, v, tl.load(g_ptr + b * sgb + h).to(tl.float32),
                          tl.load(beta_ptr + b * sbb + h).to(tl.float32), st, scale)
        o = tl.where(valid, o, 0.0)
        tl.store(o_ptr + b * sob + h * soh + rv, o.to(o_ptr.dtype.element_ty), mask=vm)
        tl.store(sp, st, mask=vm[None, :] & write)


def gated_delta_rule_decode(q, k, v, g, beta, ssm_state, state_indices, sentinel):
    B, Hk, dk = q.shape
    Hv, dv = v.shape[1:]
    o = torch.empty(B, Hv, dv, dtype=v.dtype, device=v.device)
    if B == 0:
        return o
    if ssm_state.dtype != torch.float32 or not ssm_state.is_contiguous() or dk != _np2(dk) or \
            q.stride(2) != 1 or k.stride(2) != 1 or v.stride(2) != 1:
        from kernels.gdn.vectorized import gated_delta_rule_decode_vectorized
        return gated_delta_rule_decode_vectorized(q, k, v, g, beta, ssm_state, state_indices, sentinel)
    g, beta = g.float().contiguous(), beta.float().contiguous()
    idx = state_indices.contiguous()
    BV = min(32, _np2(dv))
    grid = (Hv, _cdiv(dv, BV))
    launch(_gdn_decode_kernel, grid, q, k, v, g, beta, ssm_state, idx, o, B, ssm_state.shape[0], int(sentinel),
           q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), g.stride(0), beta.stride(0),
           o.stride(0), o.stride(1), ssm_state.stride(0), ssm_state.stride(1), dk ** -0.5, GROUP=Hv // Hk, DK=dk,
           DV=dv, BV=BV, BB=_np2(B), num_warps=4)
    return o


@triton.jit
def _gdn_prefill_kernel(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, s_ptr, qsl_ptr, idx_ptr, init_ptr, o_ptr, B, S,
                        sentinel, sqt, sqh, skt, skh, svt, svh, sgt, sbt, sot, soh, ss_s, ss_h, scale,
                        GROUP: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, BV: tl.constexpr,
                        BB: tl.constexpr):
    """Value head h, value columns rv: each request in order, its tokens in order, one recurrent
    step each (as `_gdn_decode_kernel`), from its state row (or zeros) to its final state."""
    h = tl.program_id(0)
    rv = tl.program_id(1) * BV + tl.arange(0, BV)
    vm = rv < DV
    rk = tl.arange(0, DK)
    kh = h // GROUP
    for b in range(0, B):
        idx = tl.load(idx_ptr + b).to(tl.int64)
        valid, slot = _slot(idx, sentinel, S)
        if valid:
            write = _last_claimant(b, slot, valid, idx_ptr, B, S, sentinel, BB)
            keep = tl.load(init_ptr + b) != 0
            sp = s_ptr + slot * ss_s + h * ss_h + rk[:, None] * DV + rv[None, :]
            st = tl.load(sp, mask=vm[None, :] & keep, other=0.0)
            for t in range(tl.load(qsl_ptr + b), tl.load(qsl_ptr + b + 1)):
                q = tl.load(q_ptr + t * sqt + kh * sqh + rk).to(tl.float32)
                k = tl.load(k_ptr + t * skt + kh * skh + rk).to(tl.float32)
                v = tl.load(v_ptr + t * svt + h * svh + rv, mask=vm, other=0.0).to(tl.float32)
                o, st = _gdn_step(q, k, v, tl.load(g_ptr + t * sgt + h).to(tl.float32),
                                  tl.load(beta_ptr + t * sbt + h).to(tl.float32), st, scale)
                tl.store(o_ptr + t * sot + h * soh + rv, o.to(o_ptr.dtype.element_ty), mask=vm)
            tl.store(sp, st, mask=vm[None, :] & write)


def gated_delta_rule_prefill(q, k, v, g, beta, ssm_state, query_start_loc, state_indices, has_initial_state,
                             sentinel):
    T, Hk, dk = q.shape
    Hv, dv = v.shape[1:]
    B = state_indices.shape[0]
    if ssm_state.dtype != torch.float32 or not ssm_state.is_contiguous() or dk != _np2(dk) or B == 0 or \
            q.stride(2) != 1 or k.stride(2) != 1 or v.stride(2) != 1:
        from kernels.gdn.reference import gated_delta_rule_prefill_reference
        return gated_delta_rule_prefill_reference(q, k, v, g, beta, ssm_state, query_start_loc, state_indices,
                                                  has_initial_state, sentinel)
    o = torch.zeros(T, Hv, dv, dtype=v.dtype, device=v.device)  # tokens outside every request, sentinel ones
    g, beta = g.float().contiguous(), beta.float().contiguous()
    BV = min(32, _np2(dv))
    grid = (Hv, _cdiv(dv, BV))
    launch(_gdn_prefill_kernel, grid, q, k, v, g, beta, ssm_state, query_start_loc.contiguous(),
           state_indices.contiguous(), has_initial_state.contiguous(), o, B, ssm_state.shape[0], int(sentinel),
           q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), g.stride(0), beta.stride(0),
           o.stride(0), o.stride(1), ssm_state.stride(0), ssm_state.stride(1), dk ** -0.5, GROUP=Hv // Hk, DK=dk,
           DV=dv, BV=BV, BB=_np2(B), num_warps=4)
    return o


@triton.jit
def _gdn_spec_kernel(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, s_ptr, init_ptr, src_ptr, idx_ptr, qsl_ptr, o_ptr, B, N, S,
                     sentinel, sqt, sqh, skt, skh, svt, svh, sgt, sbt, sot, soh, ss_s, ss_h, si_b, si_h, sib,
                     scale, GROUP: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, BV: tl.constexpr):
    """Value head h, value columns rv: each valid row in order, from its initial state (`init`, its
    source slot's state before the call), its tokens in order, one step each (`_gdn_step`); the
    state after token t stored to the slot of column t unless that is the sentinel."""
    h = tl.program_id(0)
    rv = tl.program_id(1) * BV + tl.arange(0, BV)
    vm = rv < DV
    rk = tl.arange(0, DK)
    kh = h // GROUP
    for b in range(0, B):
        start = tl.load(qsl_ptr + b)
        length = tl.minimum(tl.maximum(tl.load(qsl_ptr + b + 1) - start, 0), N)
        if (tl.load(src_ptr + b) != sentinel) & (length > 0):
            st = tl.load(init_ptr + b * si_b + h * si_h + rk[:, None] * DV + rv[None, :], mask=vm[None, :], other=0.0)
            for t in range(0, length):
                i = start + t
                q = tl.load(q_ptr + i * sqt + kh * sqh + rk).to(tl.float32)
                k = tl.load(k_ptr + i * skt + kh * skh + rk).to(tl.float32)
                v = tl.load(v_ptr + i * svt + h * svh + rv, mask=vm, other=0.0).to(tl.float32)
                o, st = _gdn_step(q, k, v, tl.load(g_ptr + i * sgt + h).to(tl.float32),
                                  tl.load(beta_ptr + i * sbt + h).to(tl.float32), st, scale)
                tl.store(o_ptr + i * sot + h * soh + rv, o.to(o_ptr.dtype.element_ty), mask=vm)
                ok, slot = _slot(tl.load(idx_ptr + b * sib + t).to(tl.int64), sentinel, S)
                tl.store(s_ptr + slot * ss_s + h * ss_h + rk[:, None] * DV + rv[None, :], st, mask=vm[None, :] & ok)


def gated_delta_rule_spec(q, k, v, g, beta, ssm_state, state_indices, num_accepted, query_start_loc, sentinel):
    T, Hk, dk = q.shape
    Hv, dv = v.shape[1:]
    B, N = state_indices.shape
    if ssm_state.dtype != torch.float32 or not ssm_state.is_contiguous() or dk != _np2(dk) or B == 0 or T == 0 or \
            q.stride(2) != 1 or k.stride(2) != 1 or v.stride(2) != 1:
        from kernels.gdn.vectorized import gated_delta_rule_spec_vectorized
        return gated_delta_rule_spec_vectorized(q, k, v, g, beta, ssm_state, state_indices, num_accepted,
                                                query_start_loc, sentinel)
    o = torch.zeros(T, Hv, dv, dtype=v.dtype, device=v.device)  # padding rows, tokens outside every row
    g, beta = g.float().contiguous(), beta.float().contiguous()
    src = state_indices.gather(1, accepted_column(num_accepted, N)[:, None])[:, 0].to(torch.int64)
    init = ssm_state.index_select(0, slot_rows(src, sentinel, ssm_state.shape[0])[1])   # before any write
    idx = state_indices.contiguous()
    BV = min(32, _np2(dv))
    grid = (Hv, _cdiv(dv, BV))
    launch(_gdn_spec_kernel, grid, q, k, v, g, beta, ssm_state, init, src, idx, query_start_loc.contiguous(), o, B, N,
           ssm_state.shape[0], int(sentinel), q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0),
           v.stride(1), g.stride(0), beta.stride(0), o.stride(0), o.stride(1), ssm_state.stride(0), ssm_state.stride(1),
           init.stride(0), init.stride(1), idx.stride(0), dk ** -0.5, GROUP=Hv // Hk, DK=dk, DV=dv, BV=BV, num_warps=4)
    return o
