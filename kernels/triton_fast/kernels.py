"""The Triton kernels of the `triton` provider and their launchers (imported lazily: needs triton).

See `kernels/triton_fast/__init__.py` for what each fuses and how it matches the reference.
Under `TRITON_INTERPRET=1` the explicitly rounded helpers are plain operators (the interpreter
has no libdevice); results then agree with the reference to rounding, not bit for bit.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
import triton.testing

from kernels.moe.vectorized import moe_vectorized

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"

if INTERPRET:
    @triton.jit
    def _mul(a, b):
        return a * b

    @triton.jit
    def _add(a, b):
        return a + b

    @triton.jit
    def _div(a, b):
        return a / b

    @triton.jit
    def _exp(x):
        return tl.exp(x)

    @triton.jit
    def _log1p(x):
        return tl.log(1.0 + x)

    @triton.jit
    def _rint(x):
        r = tl.floor(x + 0.5)
        tie = (r - x) == 0.5
        odd = (r - 2.0 * tl.floor(r * 0.5)) != 0.0
        return tl.where(tie & odd, r - 1.0, r)
else:
    from triton.language.extra import libdevice

    @triton.jit
    def _mul(a, b):
        return libdevice.mul_rn(a, b)

    @triton.jit
    def _add(a, b):
        return libdevice.add_rn(a, b)

    @triton.jit
    def _div(a, b):
        return libdevice.div_rn(a, b)

    @triton.jit
    def _exp(x):
        return libdevice.exp(x)

    @triton.jit
    def _log1p(x):
        return libdevice.log1p(x)

    @triton.jit
    def _rint(x):
        return libdevice.rint(x)


@triton.jit
def _silu(x):
    """x / (1 + exp(-x)), as kernels/_math.py writes it."""
    return _div(x, _add(1.0, _exp(-x)))


if INTERPRET:
    @triton.jit
    def _over_qmax(amax):
        return amax / 127.0  # torch's CPU kernel divides
else:
    @triton.jit
    def _over_qmax(amax):
        # `amax / QMAX` in quant.py divides a CUDA tensor by a Python float: torch's CUDA kernel then
        # multiplies by the fp32 reciprocal (1.0f / 127.0f), which differs from a true division for
        # about 1 amax in 20. Do the same, so scales (and everything after them) match bit for bit.
        return libdevice.mul_rn(amax, 0.007874015718698502)  # fp32(1 / 127) exactly


@triton.jit
def _act_scale(amax):
    """Per-token activation scale: amax / 127, and 1 where that is 0 (quant.py's rule)."""
    s = _over_qmax(amax)
    return tl.where(s == 0.0, 1.0, s)


@triton.jit
def _quantize(x, scale):
    """clamp(round_half_even(x / scale), -128, 127) as fp32 integers."""
    q = _rint(_div(x, scale))
    return tl.minimum(tl.maximum(q, -128.0), 127.0)


@triton.jit
def _slot(idx, sentinel, S):
    """(valid, slot): the row is real unless idx == sentinel; slot = idx mod S, non-negative."""
    valid = idx != sentinel
    r = tl.where(valid, idx, 0) % S
    return valid, tl.where(r < 0, r + S, r)


if INTERPRET:
    @triton.jit
    def _dp4a(a, b, c):
        """c + the dot product of the 4 signed bytes of a and of b (the interpreter has no PTX)."""
        acc = c
        for i in tl.static_range(4):
            acc += ((a << (24 - 8 * i)) >> 24) * ((b << (24 - 8 * i)) >> 24)
        return acc
else:
    @triton.jit
    def _dp4a(a, b, c):
        """c + the dot product of the 4 signed bytes of a and of b: one `dp4a`, exact in int32."""
        return tl.inline_asm_elementwise("dp4a.s32.s32 $0, $1, $2, $3;", "=r,r,r,r", [a, b, c],
                                         dtype=tl.int32, is_pure=True, pack=1)


@triton.jit
def _pack4(q, BK: tl.constexpr):
    """int32 [BK] of values in [-128, 127] -> int32 [BK // 4] words, byte i of word w = q[4 w + i]
    (the layout of an int8 row read as int32 words on a little-endian GPU). Bits do not overlap,
    so the wrapping sum is an OR."""
    shifts = tl.arange(0, 4) * 8
    return tl.sum((tl.reshape(q, (BK // 4, 4)) & 255) << shifts[None, :], axis=1)


@triton.jit
def _dp4a_acc(words, packed, acc):
    """acc [R, W] += per-word byte products of int32 weight words [R, W] and packed activations [W]."""
    return _dp4a(words, tl.broadcast_to(packed[None, :], words.shape), acc)


def _words(w: torch.Tensor) -> torch.Tensor | None:
    """An int8 weight whose rows are whole int32 words, as int32 words (a view); else None."""
    if w.dtype != torch.int8 or w.shape[-1] % 4 or w.stride(-1) != 1 or w.storage_offset() % 4 or \
            any(st % 4 for st in w.stride()[:-1]):
        return None
    return w.view(torch.int32)


def _np2(n: int) -> int:
    return triton.next_power_of_2(max(1, int(n)))


# --------------------------------------------------------------------------- w8a8_linear


def _quick_bench(kernel_call, quantiles):
    """Autotuning timer: shorter than Triton's default (25 ms warm-up, 100 ms of runs per config)."""
    return triton.testing.do_bench(kernel_call, warmup=5, rep=20, quantiles=quantiles)


def _configs(space, interpret_pick):
    """Autotuning configs; under the interpreter only one (autotuning there is pointless)."""
    if INTERPRET:
        space = [interpret_pick]
    return [triton.Config(kw, num_warps=w, num_stages=st) for kw, w, st in space]


# BM is 16 (the smallest int8 `tl.dot`): a decode batch of B rows takes ceil(B / 16) row blocks.
_W8A8_SPACE = [({"BN": 16, "BK": 256}, 4, 3), ({"BN": 32, "BK": 256}, 4, 3), ({"BN": 64, "BK": 256}, 4, 3),
               ({"BN": 16, "BK": 512}, 4, 3), ({"BN": 32, "BK": 512}, 4, 4), ({"BN": 64, "BK": 128}, 4, 4),
               ({"BN": 128, "BK": 128}, 4, 3), ({"BN": 16, "BK": 1024}, 8, 2)]


@triton.autotune(configs=_configs(_W8A8_SPACE, ({"BN": 16, "BK": 256}, 4, 3)),
                 key=["N", "K", "MB"], do_bench=_quick_bench)
@triton.jit
def _w8a8_kernel(x_ptr, w_ptr, ws_ptr, b_ptr, o_ptr, M, N, K, sxm, swn, som, MB,
                 HAS_BIAS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    mm = rm < M
    nm = rn < N
    amax = tl.zeros((BM,), tl.float32)
    for k0 in range(0, K, BK):
        km = (k0 + rk) < K
        xv = tl.load(x_ptr + rm[:, None] * sxm + (k0 + rk)[None, :], mask=mm[:, None] & km[None, :], other=0.0)
        amax = tl.maximum(amax, tl.max(tl.abs(xv.to(tl.float32)), axis=1))
    scale = _act_scale(amax)
    acc = tl.zeros((BM, BN), tl.int32)
    for k0 in range(0, K, BK):
        km = (k0 + rk) < K
        xv = tl.load(x_ptr + rm[:, None] * sxm + (k0 + rk)[None, :], mask=mm[:, None] & km[None, :], other=0.0)
        q = _quantize(xv.to(tl.float32), scale[:, None]).to(tl.int8)
        wv = tl.load(w_ptr + rn[:, None] * swn + (k0 + rk)[None, :], mask=nm[:, None] & km[None, :], other=0)
        acc += tl.dot(q, tl.trans(wv), out_dtype=tl.int32)
    ws = tl.load(ws_ptr + rn, mask=nm, other=0.0).to(tl.float32)
    out = _mul(_mul(acc.to(tl.float32), scale[:, None]), ws[None, :])
    if HAS_BIAS:
        out = _add(out, tl.load(b_ptr + rn, mask=nm, other=0.0).to(tl.float32)[None, :])
    tl.store(o_ptr + rm[:, None] * som + rn[None, :], out.to(o_ptr.dtype.element_ty), mask=mm[:, None] & nm[None, :])


# Few rows (decode): one program per (row, block of output channels). The weights are read as int32
# words of 4 int8 and multiplied with `dp4a` (4 exact byte products a word); K is a compile-time
# constant so the K loop unrolls and every weight load of a program is in flight at once. On an
# H200 this streamed a 16 MB weight at 2.5 TB/s where int32 products in registers gave 1.5-1.9
# (`python3 -m kernels.triton_fast.sweep`). More rows: `_w8a8_kernel`'s int8 `tl.dot` tiles,
# which read each weight tile once per 16 rows.
ROWS_MAX_M = 8
_ROWS_SPACE = [({"BN": 16, "BK": 1024}, 8, 2), ({"BN": 8, "BK": 1024}, 8, 2), ({"BN": 8, "BK": 2048}, 8, 2),
               ({"BN": 4, "BK": 2048}, 8, 2), ({"BN": 4, "BK": 2048}, 4, 2), ({"BN": 16, "BK": 512}, 4, 2),
               ({"BN": 32, "BK": 512}, 8, 2)]  # the last: best for the stacked in-projection (sweep-gemv-2.log)


@triton.jit
def _row_scale(row_ptr, KD: tl.constexpr, BK: tl.constexpr):
    """The activation scale of the KD values at row_ptr, read BK at a time (the K loop unrolls)."""
    rk = tl.arange(0, BK)
    amax = tl.zeros((BK,), tl.float32)
    for k0 in tl.static_range(0, KD, BK):
        amax = tl.maximum(amax, tl.abs(tl.load(row_ptr + k0 + rk, mask=(k0 + rk) < KD, other=0.0).to(tl.float32)))
    return _act_scale(tl.max(amax, axis=0))


@triton.jit
def _row_words(row_ptr, k0: tl.constexpr, scale, KD: tl.constexpr, BK: tl.constexpr):
    """Values k0 .. k0 + BK of the row quantised with `scale`, packed into BK / 4 int32 words."""
    rk = tl.arange(0, BK)
    xv = tl.load(row_ptr + k0 + rk, mask=(k0 + rk) < KD, other=0.0).to(tl.float32)
    return _pack4(_quantize(xv, scale).to(tl.int32), BK)


@triton.autotune(configs=_configs(_ROWS_SPACE, ({"BN": 16, "BK": 512}, 4, 2)),
                 key=["N", "KD", "MB"], do_bench=_quick_bench)
@triton.jit
def _w8a8_rows_kernel(x_ptr, w_ptr, ws_ptr, b_ptr, o_ptr, N, sx, swn4, so, MB, KD: tl.constexpr,
                      HAS_BIAS: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    t = tl.program_id(0)
    pid_n = tl.program_id(1)
    r4 = tl.arange(0, BK // 4)
    scale = _row_scale(x_ptr + t * sx, KD, BK)
    rn = pid_n * BN + tl.arange(0, BN)
    nm = rn < N
    acc = tl.zeros((BN, BK // 4), tl.int32)
    for k0 in tl.static_range(0, KD, BK):
        packed = _row_words(x_ptr + t * sx, k0, scale, KD, BK)
        wm = nm[:, None] & ((k0 // 4 + r4) < KD // 4)[None, :]
        words = tl.load(w_ptr + rn[:, None] * swn4 + (k0 // 4 + r4)[None, :], mask=wm, other=0)
        acc = _dp4a_acc(words, packed, acc)
    ws = tl.load(ws_ptr + rn, mask=nm, other=0.0).to(tl.float32)
    out = _mul(_mul(tl.sum(acc, axis=1).to(tl.float32), scale), ws)
    if HAS_BIAS:
        out = _add(out, tl.load(b_ptr + rn, mask=nm, other=0.0).to(tl.float32))
    tl.store(o_ptr + t * so + rn, out.to(o_ptr.dtype.element_ty), mask=nm)


def w8a8_linear(x, w, w_scale, bias):
    M, K = x.shape
    N = w.shape[0]
    out = torch.empty(M, N, dtype=x.dtype, device=x.device)
    if M == 0 or N == 0:
        return out
    x = x.contiguous()
    w = w.contiguous()
    ws = w_scale.reshape(-1).float().contiguous()
    b = bias if bias is not None else ws
    words = _words(w)
    if M <= ROWS_MAX_M and words is not None:
        _w8a8_rows_kernel[lambda meta: (M, triton.cdiv(N, meta["BN"]))](
            x, words, ws, b, out, N, x.stride(0), words.stride(0), out.stride(0), _np2(M), KD=K,
            HAS_BIAS=bias is not None)
        return out
    BM = 16
    grid = lambda meta: (triton.cdiv(N, meta["BN"]), triton.cdiv(M, BM))  # noqa: E731
    _w8a8_kernel[grid](x, w, ws, b, out, M, N, K, x.stride(0), w.stride(0),
                       out.stride(0), _np2(min(M, 64)), HAS_BIAS=bias is not None, BM=BM)
    return out


# --------------------------------------------------------------------------- moe


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
        _logits_kernel[lambda meta: (T, triton.cdiv(N, meta["BE"]))](
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
        _route_kernel[(T,)](logits, x, shared_gate_w.reshape(-1).contiguous(), weights, ids, gate, E, H,
                            logits.stride(0), x.stride(0), RENORM=bool(renormalize), TOPK=top_k, BE=BE,
                            LE=BE.bit_length() - 1, BKK=_np2(top_k), BH=BH, LH=BH.bit_length() - 1)
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
    _moe_up_kernel[lambda meta: (P + T, triton.cdiv(max(I, Is), meta["BN"]))](
        x, ids, w13, w13s, act, sw13, sw13s, acts, I, Is, top_k, P, x.stride(0), w13.stride(0), w13.stride(1),
        w13s.stride(0), act.stride(0), sw13.stride(0), acts.stride(0), _np2(min(P + T, 256)), H=H)
    _moe_down_kernel[lambda meta: (T, triton.cdiv(H, meta["BN"]))](
        act, acts, ids, weights, w2, w2s, sw2, sw2s, gate_logit, out, H, I, Is, act.stride(0),
        acts.stride(0), w2.stride(0), w2.stride(1), w2s.stride(0), sw2.stride(0), gate_logit.stride(0),
        out.stride(0), _np2(min(T, 64)), TOPK=top_k, BKK=_np2(top_k), BI=max(4, _np2(I)), BIS=max(4, _np2(Is)))
    return out


# --------------------------------------------------------------------------- norms


@triton.jit
def _rms_norm_kernel(x_ptr, w_ptr, o_ptr, H, sx, so, eps, BH: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BH)
    m = offs < H
    x = tl.load(x_ptr + row * sx + offs, mask=m, other=0.0).to(tl.float32)
    r = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / H + eps)
    w = tl.load(w_ptr + offs, mask=m, other=0.0).to(tl.float32)
    tl.store(o_ptr + row * so + offs, ((x * r) * (1.0 + w)).to(o_ptr.dtype.element_ty), mask=m)


def rms_norm(x, w, eps):
    H = x.shape[-1]
    x2 = x.reshape(-1, H).contiguous()
    out = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    if x2.shape[0]:
        _rms_norm_kernel[(x2.shape[0],)](x2, w, out, H, x2.stride(0), out.stride(0), float(eps), BH=_np2(H),
                                          num_warps=4 if H >= 1024 else 1)
    return out.reshape(x.shape)


@triton.jit
def _add_rms_norm_kernel(x_ptr, y_ptr, w_ptr, h_ptr, o_ptr, H, sx, sy, sh, so, eps, BH: tl.constexpr):
    """h = x + y (fp32 add, one rounding to the dtype, as torch adds bf16), then `_rms_norm_kernel` of h."""
    row = tl.program_id(0)
    offs = tl.arange(0, BH)
    m = offs < H
    x = tl.load(x_ptr + row * sx + offs, mask=m, other=0.0).to(tl.float32)
    y = tl.load(y_ptr + row * sy + offs, mask=m, other=0.0).to(tl.float32)
    h = _add(x, y).to(h_ptr.dtype.element_ty)
    tl.store(h_ptr + row * sh + offs, h, mask=m)
    hf = h.to(tl.float32)
    r = 1.0 / tl.sqrt(tl.sum(hf * hf, axis=0) / H + eps)
    w = tl.load(w_ptr + offs, mask=m, other=0.0).to(tl.float32)
    tl.store(o_ptr + row * so + offs, ((hf * r) * (1.0 + w)).to(o_ptr.dtype.element_ty), mask=m)


def add_rms_norm(x, y, w, eps):
    H = x.shape[-1]
    x2, y2 = x.reshape(-1, H).contiguous(), y.reshape(-1, H).contiguous()
    h = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    out = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    if x2.shape[0]:
        _add_rms_norm_kernel[(x2.shape[0],)](x2, y2, w, h, out, H, x2.stride(0), y2.stride(0), h.stride(0),
                                              out.stride(0), float(eps), BH=_np2(H), num_warps=4 if H >= 1024 else 1)
    return h.reshape(x.shape), out.reshape(x.shape)


@triton.jit
def _rms_norm_gated_kernel(x_ptr, z_ptr, w_ptr, o_ptr, D, R, sxt, sxr, szt, szr, eps, BD: tl.constexpr):
    """Row (t, r) of [T, R, D] inputs (any row strides: z may be a column slice of a wider GEMM output)."""
    row = tl.program_id(0)
    t = row // R
    r = row % R
    offs = tl.arange(0, BD)
    m = offs < D
    x = tl.load(x_ptr + t * sxt + r * sxr + offs, mask=m, other=0.0).to(tl.float32)
    z = tl.load(z_ptr + t * szt + r * szr + offs, mask=m, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + offs, mask=m, other=0.0).to(tl.float32)
    rs = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / D + eps)
    out = _mul(_mul(w, x * rs), _silu(z))
    tl.store(o_ptr + row * D + offs, out.to(o_ptr.dtype.element_ty), mask=m)


def rms_norm_gated(x, z, w, eps):
    D = x.shape[-1]
    x3, z3 = x.reshape(-1, x.shape[-2], D), z.reshape(-1, z.shape[-2], D)
    x3 = x3 if x3.stride(-1) == 1 else x3.contiguous()
    z3 = z3 if z3.stride(-1) == 1 else z3.contiguous()
    out = torch.empty(z3.shape, dtype=z.dtype, device=x.device)
    T, R = x3.shape[:2]
    if T * R:
        _rms_norm_gated_kernel[(T * R,)](x3, z3, w, out, D, R, x3.stride(0), x3.stride(1), z3.stride(0), z3.stride(1),
                                         float(eps), BD=_np2(D), num_warps=1)
    return out.reshape(x.shape)


# --------------------------------------------------------------------------- GDN


@triton.jit
def _last_claimant(b, slot, valid, idx_ptr, B, S, sentinel, BB: tl.constexpr):
    """Whether row b writes its slot: valid and no later valid row names the same slot."""
    rb = tl.arange(0, BB)
    others = tl.load(idx_ptr + rb, mask=rb < B, other=sentinel).to(tl.int64)
    ov, os_ = _slot(others, sentinel, S)
    later = (rb > b) & (rb < B) & ov & (os_ == slot)
    return valid & (tl.sum(later.to(tl.int32), axis=0) == 0)


@triton.jit
def _conv_update_kernel(x_ptr, w_ptr, st_ptr, idx_ptr, y_ptr, B, C, S, sentinel, sxb, swc, sss, ssc, syb,
                        BC: tl.constexpr, BB: tl.constexpr):
    """Kernel width 4 (3 state columns): y = silu(c0 w0 + c1 w1 + c2 w2 + x w3), state <- (c1, c2, x)."""
    rc = tl.program_id(0) * BC + tl.arange(0, BC)
    cm = rc < C
    w0 = tl.load(w_ptr + rc * swc + 0, mask=cm, other=0.0).to(tl.float32)
    w1 = tl.load(w_ptr + rc * swc + 1, mask=cm, other=0.0).to(tl.float32)
    w2 = tl.load(w_ptr + rc * swc + 2, mask=cm, other=0.0).to(tl.float32)
    w3 = tl.load(w_ptr + rc * swc + 3, mask=cm, other=0.0).to(tl.float32)
    for b in range(0, B):
        idx = tl.load(idx_ptr + b).to(tl.int64)
        valid, slot = _slot(idx, sentinel, S)
        write = _last_claimant(b, slot, valid, idx_ptr, B, S, sentinel, BB)
        base = st_ptr + slot * sss + rc * ssc
        c0 = tl.load(base + 0, mask=cm, other=0.0)
        c1 = tl.load(base + 1, mask=cm, other=0.0)
        c2 = tl.load(base + 2, mask=cm, other=0.0)
        xv = tl.load(x_ptr + b * sxb + rc, mask=cm, other=0.0)
        acc = _mul(c0.to(tl.float32), w0)
        acc = _add(acc, _mul(c1.to(tl.float32), w1))
        acc = _add(acc, _mul(c2.to(tl.float32), w2))
        acc = _add(acc, _mul(xv.to(tl.float32), w3))
        y = tl.where(valid, _silu(acc), 0.0)
        tl.store(y_ptr + b * syb + rc, y.to(y_ptr.dtype.element_ty), mask=cm)
        wm = cm & write
        tl.store(base + 0, c1, mask=wm)
        tl.store(base + 1, c2, mask=wm)
        tl.store(base + 2, xv.to(st_ptr.dtype.element_ty), mask=wm)


def causal_conv1d_update(x, weight, conv_state, state_indices, sentinel):
    B, C = x.shape
    w = weight.reshape(weight.shape[0], weight.shape[-1])
    if w.shape[1] != 4 or not conv_state.is_contiguous():
        from kernels.conv1d.vectorized import causal_conv1d_update_vectorized
        return causal_conv1d_update_vectorized(x, weight, conv_state, state_indices, sentinel)
    y = torch.empty(B, C, dtype=x.dtype, device=x.device)
    if B == 0:
        return y
    x = x if x.stride(1) == 1 else x.contiguous()
    w = w.contiguous()
    idx = state_indices.contiguous()
    BC = 256
    _conv_update_kernel[(triton.cdiv(C, BC),)](x, w, conv_state, idx, y, B, C, conv_state.shape[0], int(sentinel),
                                               x.stride(0), w.stride(0), conv_state.stride(0), conv_state.stride(1),
                                               y.stride(0), BC=BC, BB=_np2(B), num_warps=4)
    return y


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
    _gating_kernel[(triton.cdiv(T * Hv, BLOCK),)](A_log.contiguous(), a, dt_bias.contiguous(), b, g, beta, T * Hv, Hv,
                                                 a.stride(0), b.stride(0), BLOCK=BLOCK, num_warps=4)
    return g, beta


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
        q = q * (1.0 / tl.sqrt(tl.sum(q * q, axis=0) + 1e-6)) * scale
        k = k * (1.0 / tl.sqrt(tl.sum(k * k, axis=0) + 1e-6))
        sp = s_ptr + slot * ss_s + h * ss_h + rk[:, None] * DV + rv[None, :]
        st = tl.load(sp, mask=vm[None, :], other=0.0)
        st = st * tl.exp(tl.load(g_ptr + b * sgb + h).to(tl.float32))
        v = tl.load(v_ptr + b * svb + h * svh + rv, mask=vm, other=0.0).to(tl.float32)
        delta = tl.load(beta_ptr + b * sbb + h).to(tl.float32) * (v - tl.sum(k[:, None] * st, axis=0))
        st = st + k[:, None] * delta[None, :]
        o = tl.where(valid, tl.sum(q[:, None] * st, axis=0), 0.0)
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
    grid = (Hv, triton.cdiv(dv, BV))
    _gdn_decode_kernel[grid](q, k, v, g, beta, ssm_state, idx, o, B, ssm_state.shape[0], int(sentinel),
                             q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
                             g.stride(0), beta.stride(0), o.stride(0), o.stride(1), ssm_state.stride(0),
                             ssm_state.stride(1), dk ** -0.5, GROUP=Hv // Hk, DK=dk, DV=dv, BV=BV, BB=_np2(B),
                             num_warps=4)
    return o
