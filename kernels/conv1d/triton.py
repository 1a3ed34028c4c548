"""`triton` provider of `repro::causal_conv1d_update`, `repro::causal_conv1d_fn` (the varlen
prefill) and `repro::causal_conv1d_update_spec`: one kernel each, bit-identical to the reference.
State rows follow `kernels/_state.py` (sentinel rows skipped, snapshot reads, last valid row wins)
by walking the batch in order inside each program, which owns a disjoint slice of every state row:
a row is written only by the last valid request that names its slot, after that request read it,
so every read sees the row as it was before the call. The speculative kernel, whose rows write
different numbers of columns, reads every row's window first and then writes the rows in order.
Declared in the folder's `__init__.py`; imported on first use (needs triton).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._state import accepted_column
from kernels.triton_helpers import (_add, _cdiv, _last_claimant, _mul, _np2, _silu, _slot)
from kernels.triton_launch import launch


@triton.jit
def _conv_weights(w_ptr, rc, swc, cm):
    """The four taps' weights of channels rc, fp32."""
    w0 = tl.load(w_ptr + rc * swc + 0, mask=cm, other=0.0).to(tl.float32)
    w1 = tl.load(w_ptr + rc * swc + 1, mask=cm, other=0.0).to(tl.float32)
    w2 = tl.load(w_ptr + rc * swc + 2, mask=cm, other=0.0).to(tl.float32)
    w3 = tl.load(w_ptr + rc * swc + 3, mask=cm, other=0.0).to(tl.float32)
    return w0, w1, w2, w3


@triton.jit
def _conv_out(c0, c1, c2, x, w0, w1, w2, w3):
    """silu(c0 w0 + c1 w1 + c2 w2 + x w3) on fp32 inputs, summed left to right (`conv_taps`)."""
    acc = _mul(c0, w0)
    acc = _add(acc, _mul(c1, w1))
    acc = _add(acc, _mul(c2, w2))
    acc = _add(acc, _mul(x, w3))
    return _silu(acc)


@triton.jit
def _conv_update_kernel(x_ptr, w_ptr, st_ptr, idx_ptr, y_ptr, B, C, S, sentinel, sxb, swc, sss, ssc, syb,
                        BC: tl.constexpr, BB: tl.constexpr):
    """Kernel width 4 (3 state columns): y = silu(c0 w0 + c1 w1 + c2 w2 + x w3), state <- (c1, c2, x)."""
    rc = tl.program_id(0) * BC + tl.arange(0, BC)
    cm = rc < C
    w0, w1, w2, w3 = _conv_weights(w_ptr, rc, swc, cm)
    for b in range(0, B):
        idx = tl.load(idx_ptr + b).to(tl.int64)
        valid, slot = _slot(idx, sentinel, S)
        write = _last_claimant(b, slot, valid, idx_ptr, B, S, sentinel, BB)
        base = st_ptr + slot * sss + rc * ssc
        c0 = tl.load(base + 0, mask=cm, other=0.0)
        c1 = tl.load(base + 1, mask=cm, other=0.0)
        c2 = tl.load(base + 2, mask=cm, other=0.0)
        xv = tl.load(x_ptr + b * sxb + rc, mask=cm, other=0.0)
        y = tl.where(valid, _conv_out(c0.to(tl.float32), c1.to(tl.float32), c2.to(tl.float32), xv.to(tl.float32),
                                      w0, w1, w2, w3), 0.0)
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
    launch(_conv_update_kernel, (_cdiv(C, BC),), x, w, conv_state, idx, y, B, C, conv_state.shape[0],
           int(sentinel), x.stride(0), w.stride(0), conv_state.stride(0), conv_state.stride(1), y.stride(0), BC=BC,
           BB=_np2(B), num_warps=4)
    return y


@triton.jit
def _conv_fn_kernel(x_ptr, w_ptr, st_ptr, qsl_ptr, idx_ptr, init_ptr, y_ptr, B, C, S, sentinel, sxt, swc, sss,
                    ssc, syt, BC: tl.constexpr, BB: tl.constexpr):
    """Kernel width 4: each request's tokens in order, the window (c0, c1, c2) starting from its
    history (its state row, or zeros without an initial state) and written back at the end."""
    rc = tl.program_id(0) * BC + tl.arange(0, BC)
    cm = rc < C
    w0, w1, w2, w3 = _conv_weights(w_ptr, rc, swc, cm)
    for b in range(0, B):
        idx = tl.load(idx_ptr + b).to(tl.int64)
        valid, slot = _slot(idx, sentinel, S)
        if valid:
            write = _last_claimant(b, slot, valid, idx_ptr, B, S, sentinel, BB)
            keep = tl.load(init_ptr + b) != 0
            base = st_ptr + slot * sss + rc * ssc
            hm = cm & keep
            c0 = tl.load(base + 0, mask=hm, other=0.0).to(tl.float32)
            c1 = tl.load(base + 1, mask=hm, other=0.0).to(tl.float32)
            c2 = tl.load(base + 2, mask=hm, other=0.0).to(tl.float32)
            for t in range(tl.load(qsl_ptr + b), tl.load(qsl_ptr + b + 1)):
                xv = tl.load(x_ptr + t * sxt + rc, mask=cm, other=0.0).to(tl.float32)
                y = _conv_out(c0, c1, c2, xv, w0, w1, w2, w3)
                tl.store(y_ptr + t * syt + rc, y.to(y_ptr.dtype.element_ty), mask=cm)
                c0, c1, c2 = c1, c2, xv
            wm = cm & write
            tl.store(base + 0, c0.to(st_ptr.dtype.element_ty), mask=wm)
            tl.store(base + 1, c1.to(st_ptr.dtype.element_ty), mask=wm)
            tl.store(base + 2, c2.to(st_ptr.dtype.element_ty), mask=wm)


def causal_conv1d_fn(x, weight, conv_state, query_start_loc, state_indices, has_initial_state, sentinel):
    T, C = x.shape
    w = weight.reshape(weight.shape[0], weight.shape[-1])
    B = state_indices.shape[0]
    if w.shape[1] != 4 or not conv_state.is_contiguous() or B == 0:
        from kernels.conv1d.vectorized import causal_conv1d_fn_vectorized
        return causal_conv1d_fn_vectorized(x, weight, conv_state, query_start_loc, state_indices,
                                           has_initial_state, sentinel)
    y = torch.zeros(T, C, dtype=x.dtype, device=x.device)  # tokens outside every request, sentinel requests
    x = x if x.stride(1) == 1 else x.contiguous()
    w = w.contiguous()
    BC = 256
    launch(_conv_fn_kernel, (_cdiv(C, BC),), x, w, conv_state, query_start_loc.contiguous(),
           state_indices.contiguous(), has_initial_state.contiguous(), y, B, C, conv_state.shape[0], int(sentinel),
           x.stride(0), w.stride(0), conv_state.stride(0), conv_state.stride(1), y.stride(0), BC=BC, BB=_np2(B),
           num_warps=4)
    return y


@triton.jit
def _conv_spec_kernel(x_ptr, w_ptr, st_ptr, idx_ptr, first_ptr, qsl_ptr, y_ptr, keep_ptr, B, C, S, N, sentinel,
                      sxt, swc, sss, ssc, syt, BC: tl.constexpr):
    """Kernel width 4, at most N tokens a row. First pass: each valid row's outputs from its window
    (columns first .. first+2 of its slot, none written yet) and the window's last two columns put
    aside in `keep` [B, 2, C]; second pass, rows in order: columns 0, 1 <- the kept two, column 2 + t
    <- token t, so that the last row to write a column wins."""
    rc = tl.program_id(0) * BC + tl.arange(0, BC)
    cm = rc < C
    w0, w1, w2, w3 = _conv_weights(w_ptr, rc, swc, cm)
    for b in range(0, B):
        valid, slot = _slot(tl.load(idx_ptr + b).to(tl.int64), sentinel, S)
        start = tl.load(qsl_ptr + b)
        length = tl.minimum(tl.maximum(tl.load(qsl_ptr + b + 1) - start, 0), N)
        if valid & (length > 0):
            base = st_ptr + slot * sss + rc * ssc + tl.load(first_ptr + b)
            c0 = tl.load(base + 0, mask=cm, other=0.0)
            c1 = tl.load(base + 1, mask=cm, other=0.0)
            c2 = tl.load(base + 2, mask=cm, other=0.0)
            tl.store(keep_ptr + (2 * b) * C + rc, c1, mask=cm)
            tl.store(keep_ptr + (2 * b + 1) * C + rc, c2, mask=cm)
            c0, c1, c2 = c0.to(tl.float32), c1.to(tl.float32), c2.to(tl.float32)
            for t in range(start, start + length):
                xv = tl.load(x_ptr + t * sxt + rc, mask=cm, other=0.0).to(tl.float32)
                y = _conv_out(c0, c1, c2, xv, w0, w1, w2, w3)
                tl.store(y_ptr + t * syt + rc, y.to(y_ptr.dtype.element_ty), mask=cm)
                c0, c1, c2 = c1, c2, xv
    for b in range(0, B):
        valid, slot = _slot(tl.load(idx_ptr + b).to(tl.int64), sentinel, S)
        start = tl.load(qsl_ptr + b)
        length = tl.minimum(tl.maximum(tl.load(qsl_ptr + b + 1) - start, 0), N)
        if valid & (length > 0):
            base = st_ptr + slot * sss + rc * ssc
            tl.store(base + 0, tl.load(keep_ptr + (2 * b) * C + rc, mask=cm), mask=cm)
            tl.store(base + 1, tl.load(keep_ptr + (2 * b + 1) * C + rc, mask=cm), mask=cm)
            for t in range(0, length):
                xv = tl.load(x_ptr + (start + t) * sxt + rc, mask=cm, other=0.0)
                tl.store(base + 2 + t, xv.to(st_ptr.dtype.element_ty), mask=cm)


def causal_conv1d_update_spec(x, weight, conv_state, state_indices, num_accepted, query_start_loc, sentinel):
    T, C = x.shape
    w = weight.reshape(weight.shape[0], weight.shape[-1])
    B = state_indices.shape[0]
    if w.shape[1] != 4 or not conv_state.is_contiguous() or B == 0 or T == 0:
        from kernels.conv1d.vectorized import causal_conv1d_update_spec_vectorized
        return causal_conv1d_update_spec_vectorized(x, weight, conv_state, state_indices, num_accepted,
                                                    query_start_loc, sentinel)
    N = conv_state.shape[2] - 2                                         # 1 + k
    y = torch.zeros(T, C, dtype=x.dtype, device=x.device)  # padding rows, tokens outside every row
    x = x if x.stride(1) == 1 else x.contiguous()
    w = w.contiguous()
    keep = torch.empty(B, 2, C, dtype=conv_state.dtype, device=x.device)
    BC = 256
    launch(_conv_spec_kernel, (_cdiv(C, BC),), x, w, conv_state, state_indices.contiguous(),
           accepted_column(num_accepted, N), query_start_loc.contiguous(), y, keep, B, C, conv_state.shape[0], N,
           int(sentinel), x.stride(0), w.stride(0), conv_state.stride(0), conv_state.stride(1), y.stride(0), BC=BC,
           num_warps=4)
    return y
