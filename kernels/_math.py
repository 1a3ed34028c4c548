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


def tree_sum(x: torch.Tensor, dim: int = -1, keepdim: bool = False) -> torch.Tensor:
    """Sum along `dim` by pairwise halving with elementwise adds: the order of additions is
    fixed by the length of `dim` alone. A library reduction (or a batched matmul) may pick
    another order for another number of rows (split reductions, split-K), so a graph replayed
    at a padded batch would not match eager at the exact batch bit for bit; seen on an H200 at
    real dimensions in the GDN decode step."""
    x = x.movedim(dim, -1)
    n = x.shape[-1]
    p = 1 << max(n - 1, 0).bit_length()
    if p != n:
        x = torch.nn.functional.pad(x, (0, p - n))  # adding zeros is exact
    while x.shape[-1] > 1:
        low, high = x.chunk(2, -1)  # x[..., :h] and x[..., h:] in one call (half the host time of split)
        x = low + high
    out = x[..., 0]
    if keepdim:
        out = out.unsqueeze(-1).movedim(-1, dim)
    return out


def l2_normalize(x: torch.Tensor, eps: float = QK_L2_EPS) -> torch.Tensor:
    """x * rsqrt(sum(x^2, -1) + eps), fp32 in, fp32 out (batch-invariant sum)."""
    return x * torch.rsqrt(tree_sum(x * x, -1, keepdim=True) + eps)
