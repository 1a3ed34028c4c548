"""`repro::rms_norm` (Gemma, `(1 + w)`), `repro::add_rms_norm` (a residual add, then `rms_norm` of
the sum: both returned, one launch where a provider fuses them) and `repro::rms_norm_gated`
(plain `w`, times silu(z)).

Both compute in fp32 and cast once at the end; `eps` is the caller's (`rms_norm_eps`, 1e-6
for this model). Providers: `reference`; `vllm_xpu` for rms_norm (`_C.gemma_rms_norm`,
`vllm_xpu.py`); `triton` (`triton.py`).
"""
from __future__ import annotations

import torch

from kernels import registry
from kernels._library import define
from kernels.availability import triton, vllm_xpu
from kernels.registry import Source

__all__ = ["rms_norm", "add_rms_norm", "rms_norm_gated"]

registry.declare(__name__, "norms", {
    "rms_norm": {
        "reference": Source(".reference:rms_norm_reference"),
        # its work-group size follows the token count (`vllm_xpu.py`): a row's bits depend on the batch
        "vllm_xpu": Source(".vllm_xpu:rms_norm_vllm_xpu", vllm_xpu, batch_invariant=False),
        "triton": Source(".triton:rms_norm", triton),
    },
    "add_rms_norm": {
        "reference": Source(".reference:add_rms_norm_reference"),
        "triton": Source(".triton:add_rms_norm", triton),
    },
    "rms_norm_gated": {
        "reference": Source(".reference:rms_norm_gated_reference"),
        "triton": Source(".triton:rms_norm_gated", triton),
    },
})


@define("rms_norm", mutates_args=())
def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """x [..., H], w [H] -> x * rsqrt(mean(x^2) + eps) * (1 + w), in x's dtype."""
    if w.numel() != x.shape[-1]:
        raise ValueError(f"rms_norm: weight has {w.numel()} elements, x's last dim is {x.shape[-1]}")
    return registry.impl("rms_norm")(x, w, eps).contiguous()


@rms_norm.register_fake
def _(x, w, eps):
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


@define("add_rms_norm", mutates_args=())
def add_rms_norm(x: torch.Tensor, y: torch.Tensor, w: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """x, y [..., H] of one dtype, w [H] -> (h = x + y in that dtype, rms_norm(h, w, eps))."""
    if x.shape != y.shape or x.dtype != y.dtype or w.numel() != x.shape[-1]:
        raise ValueError(f"add_rms_norm: x {tuple(x.shape)} {x.dtype}, y {tuple(y.shape)} {y.dtype}, "
                         f"w {tuple(w.shape)}")
    h, normed = registry.impl("add_rms_norm")(x, y, w, eps)
    return h.contiguous(), normed.contiguous()


@add_rms_norm.register_fake
def _(x, y, w, eps):
    return (torch.empty(x.shape, dtype=x.dtype, device=x.device),
            torch.empty(x.shape, dtype=x.dtype, device=x.device))


@define("rms_norm_gated", mutates_args=())
def rms_norm_gated(x: torch.Tensor, z: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """x [T, Hv, dv] (any float), z [T, Hv, dv], w [dv] -> w * rmsnorm(x) * silu(z), in z's dtype."""
    if x.shape != z.shape or w.numel() != x.shape[-1]:
        raise ValueError(f"rms_norm_gated: x {tuple(x.shape)}, z {tuple(z.shape)}, w {tuple(w.shape)}")
    return registry.impl("rms_norm_gated")(x, z, w, eps).contiguous()


@rms_norm_gated.register_fake
def _(x, z, w, eps):
    return torch.empty(x.shape, dtype=z.dtype, device=x.device)
