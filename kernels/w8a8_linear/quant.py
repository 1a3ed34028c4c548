"""The W8A8 INT8 arithmetic every provider shares: activation quantisation and the epilogue.

Activation rule (vLLM's dynamic per-token symmetric int8, made explicit):
    xf    = x in fp32
    amax  = max |xf| over the last dim (per token)
    scale = amax / 127            (fp32; a row whose scale is 0, i.e. amax == 0 or an amax so
                                   small that amax/127 underflows, gets scale 1 and quantises
                                   to zeros, so its output is exactly 0 (+ bias))
    q     = clamp(round_half_to_even(xf / scale), -128, 127) -> int8
(The weights' Quark rule is amax/127.5 and uses -128; activations here use amax/127, so -128 only
appears through `quantize_with_scale` with an outside scale. vLLM's CUDA kernel multiplies by
127/amax instead of dividing by the scale; the two can differ by one step at exact .5 ties.)
Non-finite activations are not supported (the int8 of a NaN is undefined).

Epilogue (one float order for every provider, so equal integer accumulators give equal bits):
    out = ((acc.float() * x_scale[:, None]) * w_scale[None, :]) (+ bias.float()) -> out dtype
"""
from __future__ import annotations

import torch

QMAX = 127.0


def quantize_with_scale(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """int8 q = clamp(round_half_to_even(x / scale), -128, 127), `scale` per row of the last dim."""
    return torch.round(x.float() / scale.unsqueeze(-1)).clamp_(-128.0, 127.0).to(torch.int8)


def quantize_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., K] -> (x_q int8 [..., K], x_scale fp32 [...]) by the rule in this module's doc."""
    xf = x.float()
    scale = xf.abs().amax(dim=-1) / QMAX
    scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    return quantize_with_scale(xf, scale), scale


def dequantize_output(acc: torch.Tensor, x_scale: torch.Tensor, w_scale: torch.Tensor,
                      bias: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """acc int32 [..., N] -> ((acc * x_scale) * w_scale + bias) in `dtype`; w_scale broadcasts to acc."""
    out = acc.float() * x_scale.unsqueeze(-1) * w_scale.float()
    if bias is not None:
        out = out + bias.float()
    return out.to(dtype)
