"""Fast W8A8 linear on `torch._int_mm` (int8 x int8 -> int32), equal to the reference bit for bit.

CUDA's `_int_mm` (cuBLASLt) needs M > 16 and K, N multiples of 8. M is padded with zero rows to
max(32, M rounded up to 8) (rows are independent, the padding rows are dropped). Shapes with K or
N not a multiple of 8 take the reference's exact blocked path instead: same integers, slower, no
weight copy per call. The same constraints are assumed on XPU. CPU takes any shape but K == 1
(a torch bug, routed to the exact path too).
"""
from __future__ import annotations

import torch

from kernels.w8a8_linear.quant import dequantize_output, quantize_per_token
from kernels.w8a8_linear.reference import int8_matmul_exact


def int_mm_supported(a: torch.Tensor, b: torch.Tensor) -> bool:
    K, N = a.shape[1], b.shape[0]
    if a.device.type == "cpu":
        return K > 1  # K == 1 gives b.t() strides (1, 1), which CPU _int_mm misreads (garbage, torch 2.13)
    return a.device.type in ("cuda", "xpu") and K > 0 and N > 0 and K % 8 == 0 and N % 8 == 0


def padded_rows(M: int, device: torch.device) -> int:
    """Rows `a` must have for `_int_mm` on this device (zero rows appended)."""
    return M if device.type == "cpu" else max(32, -(-M // 8) * 8)


def int8_matmul_int_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a int8 [M, K], b int8 [N, K] -> a @ b.T as int32 [M, N]."""
    if not int_mm_supported(a, b):
        return int8_matmul_exact(a, b)
    M, K = a.shape
    padded = padded_rows(M, a.device)
    if padded != M:
        a = torch.cat([a, a.new_zeros(padded - M, K)])
    return torch._int_mm(a, b.t())[:M]


def w8a8_linear_int_mm(x, w, w_scale, bias):
    x_q, x_scale = quantize_per_token(x)
    return dequantize_output(int8_matmul_int_mm(x_q, w), x_scale, w_scale, bias, x.dtype)

