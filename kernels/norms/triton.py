"""`triton` provider of `repro::rms_norm`, `repro::add_rms_norm` and `repro::rms_norm_gated`: one
kernel each; within one bf16 rounding of the reference (the mean is reduced in another order; the
sum of `add_rms_norm` bit-identical). Declared in its folder's `__init__.py`; imported on first
use (needs triton).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.triton_helpers import (_add, _mul, _np2, _silu)
from kernels.triton_launch import launch


@triton.jit
def _rms_norm_kernel(x_ptr, w_ptr, o_ptr, H, sx, so, eps, BH: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BH)
    m = offs < H
    x = tl.load(x_ptr + row * sx + offs, mask=m, other=0.0).to(tl.float32)
    r = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / H + eps)
    w = tl.load(w_ptr + offs, mask=m, other=0.0).to(tl.float32)
    tl.store(o_ptr + row * so + offs, ((x * r) * (1.0 + w)).to(o_ptr.dtype.element_ty), mask=m)


def _rows(x):
    """`x` as contiguous rows [N, H]: `x` itself when it already is (the wrappers' host time is
    most of a small op's), else a reshaped (and if need be copied) view."""
    return x if x.dim() == 2 and x.is_contiguous() else x.reshape(-1, x.shape[-1]).contiguous()


def rms_norm(x, w, eps):
    H = x.shape[-1]
    x2 = _rows(x)
    out = torch.empty_like(x2)  # contiguous, as x2 is
    if x2.shape[0]:
        launch(_rms_norm_kernel, (x2.shape[0],), x2, w, out, H, x2.stride(0), out.stride(0), float(eps), BH=_np2(H),
               num_warps=4 if H >= 1024 else 1)
    return out if x2 is x else out.reshape(x.shape)


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
    x2, y2 = _rows(x), _rows(y)
    h, out = torch.empty_like(x2), torch.empty_like(x2)
    if x2.shape[0]:
        launch(_add_rms_norm_kernel, (x2.shape[0],), x2, y2, w, h, out, H, x2.stride(0), y2.stride(0), h.stride(0),
               out.stride(0), float(eps), BH=_np2(H), num_warps=4 if H >= 1024 else 1)
    return (h, out) if x2 is x else (h.reshape(x.shape), out.reshape(x.shape))


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
        launch(_rms_norm_gated_kernel, (T * R,), x3, z3, w, out, D, R, x3.stride(0), x3.stride(1), z3.stride(0),
               z3.stride(1), float(eps), BD=_np2(D), num_warps=1)
    return out.reshape(x.shape)
