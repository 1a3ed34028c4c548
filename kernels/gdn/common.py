"""Pieces of the gated delta rule every GDN provider shares."""
from __future__ import annotations

import torch

from kernels._math import l2_normalize


def softplus(x: torch.Tensor, threshold: float = 20.0) -> torch.Tensor:
    """log(1 + exp(x)), and x itself above `threshold` (torch's default), position independent."""
    return torch.where(x > threshold, x, torch.log1p(torch.exp(x)))


def expand_heads(x: torch.Tensor, num_v_heads: int) -> torch.Tensor:
    """[..., Hk, d] -> [..., Hv, d]: value head h reads key head h // (Hv // Hk) (consecutive groups)."""
    return x.repeat_interleave(num_v_heads // x.shape[-2], dim=-2)


def prepare_qk(q: torch.Tensor, k: torch.Tensor, num_v_heads: int):
    """fp32 q * rsqrt(sum q^2 + 1e-6) * dk^-0.5 and k * rsqrt(sum k^2 + 1e-6), expanded to Hv heads."""
    scale = q.shape[-1] ** -0.5
    return (expand_heads(l2_normalize(q.float()) * scale, num_v_heads),
            expand_heads(l2_normalize(k.float()), num_v_heads))


def check_gdn(q, k, v, g, beta, ssm_state):
    N, Hk, dk = q.shape
    Hv, dv = v.shape[1:]
    if k.shape != q.shape or v.shape[0] != N or Hv % Hk:
        raise ValueError(f"gated_delta_rule: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}: "
                         "need q, k [N, Hk, dk], v [N, Hv, dv] with Hk dividing Hv")
    if g.shape != (N, Hv) or beta.shape != (N, Hv):
        raise ValueError(f"gated_delta_rule: g {tuple(g.shape)} and beta {tuple(beta.shape)} must be [{N}, {Hv}]")
    if ssm_state.dim() != 4 or ssm_state.shape[1:] != (Hv, dk, dv) or ssm_state.shape[0] < 1:
        raise ValueError(f"gated_delta_rule: ssm_state {tuple(ssm_state.shape)} must be [S>=1, {Hv}, {dk}, {dv}]")
