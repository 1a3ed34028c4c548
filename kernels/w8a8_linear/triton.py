"""`triton` provider of `repro::w8a8_linear`: per-token activation quantisation + int8 products
(int32 accumulate) + the shared epilogue, one kernel. Up to 8 rows: one program per (row, output
block), the weights read as int32 words and multiplied with `dp4a` (a GEMV); more rows: int8
`tl.dot` tiles of 16 rows. Bit-identical to the reference. Declared in its folder's
`__init__.py`; imported on first use (needs triton).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.triton_helpers import (_act_scale, _add, _cdiv, _configs, _dp4a_acc, _mul, _np2, _quantize,
                                    _quick_bench, _row_scale, _row_words, _words)
from kernels.triton_launch import launch


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
# (`python3 -m kernels.w8a8_linear.sweep`). More rows: `_w8a8_kernel`'s int8 `tl.dot` tiles,
# which read each weight tile once per 16 rows.
ROWS_MAX_M = 8
_ROWS_SPACE = [({"BN": 16, "BK": 1024}, 8, 2), ({"BN": 8, "BK": 1024}, 8, 2), ({"BN": 8, "BK": 2048}, 8, 2),
               ({"BN": 4, "BK": 2048}, 8, 2), ({"BN": 4, "BK": 2048}, 4, 2), ({"BN": 16, "BK": 512}, 4, 2),
               ({"BN": 32, "BK": 512}, 8, 2)]  # the last: best for the stacked in-projection (sweep-gemv-2.log)


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
        launch(_w8a8_rows_kernel, lambda meta: (M, _cdiv(N, meta["BN"])),
            x, words, ws, b, out, N, x.stride(0), words.stride(0), out.stride(0), _np2(M), KD=K,
            HAS_BIAS=bias is not None)
        return out
    BM = 16
    grid = lambda meta: (_cdiv(N, meta["BN"]), _cdiv(M, BM))
    launch(_w8a8_kernel, grid, x, w, ws, b, out, M, N, K, x.stride(0), w.stride(0), out.stride(0), _np2(min(M, 64)),
           HAS_BIAS=bias is not None, BM=BM)
    return out
