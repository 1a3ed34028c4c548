"""Float helpers shared by references and fast paths, chosen so a value depends only on its input.

On CPU, `F.silu`, `torch.sigmoid` and `F.softplus` evaluate the vectorised body of a tensor
and its scalar tail with different routines (measured here: about 5% of fp32 elements differ by
one ulp), so the same number computed inside tensors of different shapes (a decode row and a
prefill block, a per-expert block and a per-pair block) can round differently. These helpers
use only `torch.exp` / `torch.rsqrt` (one vector routine for every element) and the exactly
rounded `+ - * /`, so providers that compute the same values in differently shaped tensors stay
bit-identical. On CUDA/XPU every element runs the same code anyway.
"""
from __future__ import annotations

import torch

QK_L2_EPS = 1e-6  # q, k scaled by rsqrt(sum(x^2) + 1e-6), as the model does


def silu(x: torch.Tensor) -> torch.Tensor:
    """x * sigmoid(x), written as x / (1 + exp(-x))."""
    return x / (1.0 + torch.exp(-x))


def sigmoid(x: torch.Tensor) -> torch.Tensor:
    return 1.0 / (1.0 + torch.exp(-x))


def l2_normalize(x: torch.Tensor, eps: float = QK_L2_EPS) -> torch.Tensor:
    """x * rsqrt(sum(x^2, -1) + eps), fp32 in, fp32 out."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)
