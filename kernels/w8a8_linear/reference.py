"""Reference W8A8 linear: integer products accumulated exactly, on any device.

fp32 cannot hold every int32 sum, and integer matmul is missing on CUDA/XPU (Arc has no fp64
either), so the contraction runs in K-blocks of 1024 as fp32 matmuls: every product is an
integer of magnitude <= 128*128 = 2**14, so every partial sum of one block is an integer of
magnitude <= 1024 * 2**14 = 2**24, which fp32 represents exactly whatever the summation order
(and the int8 values are exact even in the TF32/bf16 inputs of reduced-precision matmul modes).
The blocks are added in int32 (|acc| < 2**31 for K < 2**17).
"""
from __future__ import annotations

import torch

from kernels.w8a8_linear.quant import dequantize_output, quantize_per_token

K_BLOCK = 1024
MAX_K = 1 << 17


def int8_matmul_exact(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a int8 [..., M, K], b int8 [..., N, K] -> a @ b.T as int32 [..., M, N], exactly (leading
    dims batch, as `torch.matmul` broadcasts them: the integers do not depend on the grouping)."""
    K = a.shape[-1]
    if K >= MAX_K:
        raise ValueError(f"K={K} too large for an exact int32 accumulator")
    acc = None
    for k0 in range(0, K, K_BLOCK):
        part = (a[..., k0:k0 + K_BLOCK].float() @ b[..., k0:k0 + K_BLOCK].float().transpose(-1, -2)).to(torch.int32)
        acc = part if acc is None else acc.add_(part)
    return acc if acc is not None else (a.float() @ b.float().transpose(-1, -2)).to(torch.int32)  # K == 0


def w8a8_linear_reference(x, w, w_scale, bias):
    x_q, x_scale = quantize_per_token(x)
    return dequantize_output(int8_matmul_exact(x_q, w), x_scale, w_scale, bias, x.dtype)

