"""`triton` provider of `repro::moe`: one kernel computes the router logits (exact products, the
reference's fixed-order sums); one the softmax, the top-k (repeated argmax, ties to the lowest
expert: no sort), the renormalisation and the shared expert's gate logit; one quantises x and runs
each (token, choice) pair's gate/up rows + SiLU-and-mul, and the shared expert's, in one grid; one
quantises the activations and runs the down rows of every choice (one tile of all choices'
weights), the k-ordered combine, the shared expert's down rows and its sigmoid gate.
Bit-identical to the reference with W8A8 experts (BF16 experts fall back to `torch`).
Declared in its folder's `__init__.py`; imported on first use (needs triton).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.moe.vectorized import moe_vectorized
from kernels.triton_helpers import (_act_scale, _add, _cdiv, _configs, _div, _dp4a, _dp4a_acc, _exp, _mul, _np2,
                                    _pack4, _quantize, _quick_bench, _row_scale, _row_words, _silu, _words)
from kernels.triton_launch import launch


_UP_SPACE = [({"BN": 8, "BK": 1024}, 8, 2), ({"BN": 16, "BK": 1024}, 8, 2), ({"BN": 8, "BK": 2048}, 8, 2),
             ({"BN": 4, "BK": 2048}, 8, 2), ({"BN": 16, "BK": 512}, 4, 2), ({"BN": 4, "BK": 2048}, 4, 2)]
_DOWN_SPACE = [({"BN": 4}, 4, 2), ({"BN": 8}, 4, 2), ({"BN": 16}, 4, 2), ({"BN": 4}, 8, 2), ({"BN": 8}, 8, 2),
               ({"BN": 16}, 8, 2)]


@triton.jit
def _tree_sum(x, LEVELS: tl.constexpr):
    """`kernels._math.tree_sum` of a 1-D block of 2**LEVELS values: x[:n/2] + x[n/2:], repeated (a
    sum over an axis of two is one add, so the order is exactly the reference's)."""
    for _ in tl.static_range(LEVELS):
        x = tl.sum(tl.reshape(x, (2, x.shape[0] // 2)), axis=0)
    return tl.sum(x, axis=0)


_LOGITS_SPACE = [({"BE": 1}, 2, 1), ({"BE": 1}, 4, 1), ({"BE": 2}, 2, 1), ({"BE": 2}, 4, 1), ({"BE": 4}, 4, 1),
                 ({"BE": 4}, 8, 1), ({"BE": 8}, 8, 1)]
_ROUTE_SPACE = [({}, 1, 1), ({}, 2, 1), ({}, 4, 1), ({}, 8, 1)]


@triton.autotune(configs=_configs(_LOGITS_SPACE, ({"BE": 2}, 4, 1)), key=["N", "H"], do_bench=_quick_bench)
@triton.jit
def _logits_kernel(x_ptr, w_ptr, o_ptr, N, H, sx, sw, so, BE: tl.constexpr, BH: tl.constexpr, LH: tl.constexpr):
    """Token t, rows re of w: `fixed_order_linear` (exact fp32 products, pairwise sums in the
    reference's order, one rounding)."""
    t = tl.program_id(0)
    re = tl.program_id(1) * BE + tl.arange(0, BE)
    em = re < N
    rh = tl.arange(0, BH)
    hm = rh < H
    xv = tl.load(x_ptr + t * sx + rh, mask=hm, other=0.0).to(tl.float32)
    wv = tl.load(w_ptr + re[:, None] * sw + rh[None, :], mask=em[:, None] & hm[None, :], other=0.0).to(tl.float32)
    prod = _mul(wv, xv[None, :])
    for _ in tl.static_range(LH):
        prod = tl.sum(tl.reshape(prod, (BE, 2, prod.shape[1] // 2)), axis=1)
    tl.store(o_ptr + t * so + re, tl.sum(prod, axis=1).to(o_ptr.dtype.element_ty), mask=em)


def fixed_order_linear(x, w):
    """`kernels.moe.common.fixed_order_linear` in one launch."""
    T, H = x.shape
    N = w.shape[0]
    out = torch.empty(T, N, dtype=x.dtype, device=x.device)
    if T and N:
        w = w.contiguous()
        BH = _np2(H)
        launch(_logits_kernel, lambda meta: (T, _cdiv(N, meta["BE"])),
            x, w, out, N, H, x.stride(0), w.stride(0), out.stride(0), BH=BH, LH=BH.bit_length() - 1)
    return out


@triton.autotune(configs=_configs(_ROUTE_SPACE, ({}, 4, 1)), key=["E", "H", "TOPK"], do_bench=_quick_bench)
@triton.jit
def _route_kernel(l_ptr, x_ptr, gw_ptr, w_ptr, id_ptr, gl_ptr, E, H, sl, sx, RENORM: tl.constexpr,
                  TOPK: tl.constexpr, BE: tl.constexpr, LE: tl.constexpr, BKK: tl.constexpr, BH: tl.constexpr,
                  LH: tl.constexpr):
    """Token t, from its bf16 router logits: the softmax (fp32, `router_probs`), the TOPK largest
    probabilities (ties to the lowest expert, descending: repeated argmax, no sort) and their
    weights (`renormalized`, summed in k order, when RENORM); and the shared expert's gate logit
    (`gate_logit`). One program per token; every sum in the reference's order."""
    t = tl.program_id(0)
    re = tl.arange(0, BE)
    em = re < E
    logit = tl.load(l_ptr + t * sl + re, mask=em, other=float("-inf")).to(tl.float32)
    ex = tl.where(em, _exp(logit - tl.max(logit, axis=0)), 0.0)
    p = tl.where(em, _div(ex, _tree_sum(ex, LE)), float("-inf"))
    rk = tl.arange(0, BKK)
    vals = tl.zeros((BKK,), tl.float32)
    ids = tl.zeros((BKK,), tl.int64)
    total = tl.max(p, axis=0)
    for j in tl.static_range(TOPK):
        m = tl.max(p, axis=0)
        i = tl.argmax(p, axis=0, tie_break_left=True)
        vals = tl.where(rk == j, m, vals)
        ids = tl.where(rk == j, i.to(tl.int64), ids)
        if j > 0:
            total = _add(total, m)
        p = tl.where(re == i, float("-inf"), p)
    if RENORM:
        vals = _div(vals, total)
    km = rk < TOPK
    tl.store(w_ptr + t * TOPK + rk, vals, mask=km)
    tl.store(id_ptr + t * TOPK + rk, ids, mask=km)
    rh = tl.arange(0, BH)
    hm = rh < H
    xv = tl.load(x_ptr + t * sx + rh, mask=hm, other=0.0).to(tl.float32)
    gv = tl.load(gw_ptr + rh, mask=hm, other=0.0).to(tl.float32)
    tl.store(gl_ptr + t, _tree_sum(_mul(xv, gv), LH).to(gl_ptr.dtype.element_ty))


@triton.autotune(configs=_configs(_UP_SPACE, ({"BN": 16, "BK": 512}, 4, 2)),
                 key=["I", "Is", "H", "PB"], do_bench=_quick_bench)
@triton.jit
def _moe_up_kernel(x_ptr, ids_ptr, w_ptr, ws_ptr, act_ptr, sw_ptr, sws_ptr, acts_ptr, I, Is, top_k, P,
                   sx, swe4, swn4, swse, sact, ssw4, sacts, PB,
                   H: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """Program p < P: pair p = t * top_k + j, gate/up rows of its expert -> act[p]; p >= P: token
    p - P, the shared expert's gate/up rows -> acts[t]. Each: quantise x[t], int32 weight words
    times packed activations (`dp4a`), SiLU-and-mul. H is a compile-time constant: the H loop
    unrolls, so a program's weight loads are all in flight together."""
    p = tl.program_id(0)
    pid_n = tl.program_id(1)
    routed = p < P
    t = tl.where(routed, p // top_k, p - P)
    e = tl.load(ids_ptr + tl.where(routed, p, 0)).to(tl.int64)
    wbase = tl.where(routed, w_ptr + e * swe4, sw_ptr)
    sbase = tl.where(routed, ws_ptr + e * swse, sws_ptr)
    obase = tl.where(routed, act_ptr + p * sact, acts_ptr + t * sacts)
    n_out = tl.where(routed, I, Is)
    rstride = tl.where(routed, swn4, ssw4)
    r4 = tl.arange(0, BK // 4)
    scale = _row_scale(x_ptr + t * sx, H, BK)
    rn = pid_n * BN + tl.arange(0, BN)
    nm = rn < n_out
    acc_g = tl.zeros((BN, BK // 4), tl.int32)
    acc_u = tl.zeros((BN, BK // 4), tl.int32)
    for k0 in tl.static_range(0, H, BK):
        packed = _row_words(x_ptr + t * sx, k0, scale, H, BK)
        wm = nm[:, None] & ((k0 // 4 + r4) < H // 4)[None, :]
        cols = (k0 // 4 + r4)[None, :]
        acc_g = _dp4a_acc(tl.load(wbase + rn[:, None] * rstride + cols, mask=wm, other=0), packed, acc_g)
        acc_u = _dp4a_acc(tl.load(wbase + (rn + n_out)[:, None] * rstride + cols, mask=wm, other=0), packed, acc_u)
    sg = tl.load(sbase + rn, mask=nm, other=0.0).to(tl.float32)
    su = tl.load(sbase + n_out + rn, mask=nm, other=0.0).to(tl.float32)
    dt = act_ptr.dtype.element_ty
    hg = _mul(_mul(tl.sum(acc_g, axis=1).to(tl.float32), scale), sg).to(dt).to(tl.float32)
    hu = _mul(_mul(tl.sum(acc_u, axis=1).to(tl.float32), scale), su).to(dt).to(tl.float32)
    tl.store(obase + rn, _mul(_silu(hg), hu).to(dt), mask=nm)


@triton.jit
def _quantized_words(a, BI: tl.constexpr):
    """Activation rows a (fp32 [R, BI]) -> (their scales [R], their int8 quantisation packed as
    int32 words [R, BI // 4])."""
    sc = _act_scale(tl.max(tl.abs(a), axis=1))
    q = _quantize(a, sc[:, None]).to(tl.int32)
    shifts = tl.arange(0, 4) * 8
    words = tl.sum((tl.reshape(q, (a.shape[0], BI // 4, 4)) & 255) << shifts[None, None, :], axis=2)
    return sc, words


@triton.autotune(configs=_configs(_DOWN_SPACE, ({"BN": 16}, 4, 2)),
                 key=["H", "I", "TB"], do_bench=_quick_bench)
@triton.jit
def _moe_down_kernel(act_ptr, acts_ptr, ids_ptr, wt_ptr, w2_ptr, w2s_ptr, sw2_ptr, sw2s_ptr, gl_ptr, o_ptr,
                     H, I, Is, s_act, s_acts, s_w2e4, s_w2n4, s_w2se, s_sw2n4, s_gl, s_o, TB,
                     TOPK: tl.constexpr, BKK: tl.constexpr, BN: tl.constexpr, BI: tl.constexpr,
                     BIS: tl.constexpr):
    """Token t, output columns rn: sum_j w_j * down_e(act[t, j]) in j order, + sigmoid(gate) * shared.
    All choices at once: their activation rows quantised together, their down rows loaded as one
    [TOPK, BN, I / 4] tile of int32 words (every weight load in flight together), then the
    products summed in j order."""
    t = tl.program_id(0)
    pid_n = tl.program_id(1)
    rn = pid_n * BN + tl.arange(0, BN)
    nm = rn < H
    dt = o_ptr.dtype.element_ty
    rj = tl.arange(0, BKK)
    jm = rj < TOPK
    e = tl.load(ids_ptr + t * TOPK + rj, mask=jm, other=0).to(tl.int64)
    ri = tl.arange(0, BI)
    r4 = tl.arange(0, BI // 4)
    wmask = jm[:, None, None] & nm[None, :, None] & (r4 < I // 4)[None, None, :]
    words = tl.load(w2_ptr + e[:, None, None] * s_w2e4 + rn[None, :, None] * s_w2n4 + r4[None, None, :],
                    mask=wmask, other=0)
    ris = tl.arange(0, BIS)
    r4s = tl.arange(0, BIS // 4)
    swords = tl.load(sw2_ptr + rn[:, None] * s_sw2n4 + r4s[None, :], mask=nm[:, None] & (r4s < Is // 4)[None, :],
                     other=0)
    a = tl.load(act_ptr + (t * TOPK + rj)[:, None] * s_act + ri[None, :], mask=jm[:, None] & (ri < I)[None, :],
                other=0.0).to(tl.float32)
    sc, packed = _quantized_words(a, BI)
    acc = tl.sum(_dp4a(words, tl.broadcast_to(packed[:, None, :], words.shape),
                       tl.zeros(words.shape, tl.int32)), axis=2)  # [BKK, BN]
    ws = tl.load(w2s_ptr + e[:, None] * s_w2se + rn[None, :], mask=jm[:, None] & nm[None, :], other=0.0)
    y = _mul(_mul(acc.to(tl.float32), sc[:, None]), ws.to(tl.float32)).to(dt).to(tl.float32)
    wt = tl.load(wt_ptr + t * TOPK + rj, mask=jm, other=0.0)
    terms = _mul(wt[:, None], y)
    routed = tl.full((BN,), -0.0, tl.float32)  # -0 + x == x for every x, as the reference's first term
    for j in tl.static_range(TOPK):
        # row j alone (-0 + v == v for every v, so the masked sum is exactly row j)
        routed = _add(routed, tl.sum(tl.where(rj[:, None] == j, terms, -0.0), axis=0))
    a_s = tl.load(acts_ptr + t * s_acts + ris, mask=ris < Is, other=0.0).to(tl.float32)
    sc_s = _act_scale(tl.max(tl.abs(a_s), axis=0))
    packed_s = _pack4(_quantize(a_s, sc_s).to(tl.int32), BIS)
    acc_s = tl.sum(_dp4a_acc(swords, packed_s, tl.zeros(swords.shape, tl.int32)), axis=1)
    ws_s = tl.load(sw2s_ptr + rn, mask=nm, other=0.0).to(tl.float32)
    ys = _mul(_mul(acc_s.to(tl.float32), sc_s), ws_s)
    gl = tl.load(gl_ptr + t * s_gl).to(tl.float32)
    gate = _div(1.0, _add(1.0, _exp(-gl)))
    out = _add(routed, _mul(gate, ys.to(dt).to(tl.float32)))
    tl.store(o_ptr + t * s_o + rn, out.to(dt), mask=nm)


def route(x, router_w, shared_gate_w, top_k, renormalize):
    """(weights fp32 [T, k], ids int64 [T, k], gate logit [T, 1] in x's dtype): the router's
    logits in one launch, the rest in another."""
    T, H = x.shape
    E = router_w.shape[0]
    logits = fixed_order_linear(x, router_w)
    weights = torch.empty(T, top_k, dtype=torch.float32, device=x.device)
    ids = torch.empty(T, top_k, dtype=torch.long, device=x.device)
    gate = torch.empty(T, 1, dtype=x.dtype, device=x.device)
    if T:
        BE, BH = _np2(E), _np2(H)
        launch(_route_kernel, (T,), logits, x, shared_gate_w.reshape(-1).contiguous(), weights, ids, gate, E, H,
               logits.stride(0), x.stride(0), RENORM=bool(renormalize), TOPK=top_k, BE=BE, LE=BE.bit_length() - 1,
               BKK=_np2(top_k), BH=BH, LH=BH.bit_length() - 1)
    return weights, ids, gate


def moe(x, router_w, w13, w13_scale, w2, w2_scale, shared_w13, shared_w13_scale, shared_w2, shared_w2_scale,
        shared_gate_w, top_k, renormalize):
    words = [None if w is None else _words(w.contiguous()) for w in (w13, w2, shared_w13, shared_w2)]
    if w13_scale is None or shared_w13_scale is None or shared_w2_scale is None or w2_scale is None or \
            any(w is None for w in words):
        return moe_vectorized(x, router_w, w13, w13_scale, w2, w2_scale, shared_w13, shared_w13_scale,
                              shared_w2, shared_w2_scale, shared_gate_w, top_k, renormalize)
    w13, w2, sw13, sw2 = words
    T, H = x.shape
    out = torch.empty_like(x)
    if T == 0:
        return out
    x = x.contiguous()
    weights, ids, gate_logit = route(x, router_w, shared_gate_w, top_k, renormalize)
    I = w13.shape[1] // 2
    Is = sw13.shape[0] // 2
    w13s, w2s = w13_scale.float().contiguous(), w2_scale.float().contiguous()
    sw13s, sw2s = shared_w13_scale.reshape(-1).float().contiguous(), shared_w2_scale.reshape(-1).float().contiguous()
    P = T * top_k
    act = torch.empty(P, I, dtype=x.dtype, device=x.device)
    acts = torch.empty(T, Is, dtype=x.dtype, device=x.device)
    launch(_moe_up_kernel, lambda meta: (P + T, _cdiv(max(I, Is), meta["BN"])),
        x, ids, w13, w13s, act, sw13, sw13s, acts, I, Is, top_k, P, x.stride(0), w13.stride(0), w13.stride(1),
        w13s.stride(0), act.stride(0), sw13.stride(0), acts.stride(0), _np2(min(P + T, 256)), H=H)
    launch(_moe_down_kernel, lambda meta: (T, _cdiv(H, meta["BN"])),
        act, acts, ids, weights, w2, w2s, sw2, sw2s, gate_logit, out, H, I, Is, act.stride(0),
        acts.stride(0), w2.stride(0), w2.stride(1), w2s.stride(0), sw2.stride(0), gate_logit.stride(0),
        out.stride(0), _np2(min(T, 64)), TOPK=top_k, BKK=_np2(top_k), BI=max(4, _np2(I)), BIS=max(4, _np2(Is)))
    return out
