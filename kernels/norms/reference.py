"""Reference norms, fp32 compute, one cast at the end."""
from __future__ import annotations

import torch

from kernels._math import silu, tree_sum


def rms_norm_reference(x, w, eps):
    """Gemma style: x * rsqrt(mean(x^2) + eps) * (1 + w)."""
    xf = x.float()
    normed = xf * torch.rsqrt(tree_sum(xf * xf, -1, keepdim=True) / xf.shape[-1] + eps)
    return (normed * (1.0 + w.float())).to(x.dtype)


def add_rms_norm_reference(x, y, w, eps):
    h = x + y
    return h, rms_norm_reference(h, w, eps)


def rms_norm_gated_reference(x, z, w, eps):
    """Per value head: (w * rmsnorm(x)) * silu(z), plain weight."""
    xf = x.float()
    normed = xf * torch.rsqrt(tree_sum(xf * xf, -1, keepdim=True) / xf.shape[-1] + eps)
    return (w.float() * normed * silu(z.float())).to(z.dtype)

