"""`repro::w8a8_linear`: dynamic per-token int8 activations x per-channel int8 weights -> bf16.

    y[M, N] = dequantize(quantize_per_token(x) @ w.T)      (rule and float order: `quant.py`)

Providers: `reference` (exact blocked matmul), `torch` (`torch._int_mm`), `triton`; bit-identical.
`linear(x, lin)` runs a `repro.weights.Linear`, W8A8 or BF16.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

from kernels import registry
from kernels._library import define
from kernels.availability import triton
from kernels.registry import Source
from kernels.w8a8_linear.quant import dequantize_output, quantize_per_token, quantize_with_scale

__all__ = ["w8a8_linear", "linear", "quantize_per_token", "quantize_with_scale", "dequantize_output"]

registry.declare(__name__, "w8a8", {
    "w8a8_linear": {
        "reference": Source(".reference:w8a8_linear_reference"),
        "torch": Source(".torch_int_mm:w8a8_linear_int_mm"),
        "triton": Source(".triton:w8a8_linear", triton),
    },
})


def _check(x, w, w_scale, bias):
    if x.dim() != 2 or w.dim() != 2 or x.shape[1] != w.shape[1]:
        raise ValueError(f"w8a8_linear: x {tuple(x.shape)} and w {tuple(w.shape)} must be [M, K] and [N, K]")
    if w.dtype != torch.int8:
        raise ValueError(f"w8a8_linear: w must be int8, got {w.dtype}")
    if w_scale.numel() != w.shape[0] or (bias is not None and bias.numel() != w.shape[0]):
        raise ValueError("w8a8_linear: w_scale and bias must have N elements")


@define("w8a8_linear", mutates_args=())
def w8a8_linear(x: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor,
                bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """x [M, K] (bf16), w int8 [N, K], w_scale fp32 [N], bias [N] or None -> [M, N] in x's dtype."""
    _check(x, w, w_scale, bias)
    return registry.impl("w8a8_linear")(x, w, w_scale.reshape(-1), bias)


@w8a8_linear.register_fake
def _(x, w, w_scale, bias=None):
    _check(x, w, w_scale, bias)
    return x.new_empty(x.shape[0], w.shape[0])


def linear(x: torch.Tensor, lin) -> torch.Tensor:
    """`lin`: repro.weights.Linear. W8A8 -> w8a8_linear, BF16 -> F.linear. x may be [..., K]."""
    if not lin.quantized:
        return F.linear(x, lin.weight)
    y = w8a8_linear(x.reshape(-1, x.shape[-1]), lin.weight, lin.scale)
    return y.reshape(*x.shape[:-1], y.shape[-1])
