"""Kernels for the islands: `repro::` custom ops with swappable providers.

    import kernels
    kernels.ops.w8a8_linear(x, w, w_scale)       # or torch.ops.repro.w8a8_linear(...)
    kernels.linear(x, lin)                       # repro.weights.Linear, W8A8 or BF16
    kernels.registry.select("moe", "reference")  # or REPRO_KERNELS="moe=reference,gdn=torch"

One folder per op (FLA style), a reference beside the fast paths. Importing this package
registers every op and provider, then applies $REPRO_KERNELS once.
"""
from kernels import registry  # first: the op packages register into it
from kernels import conv1d, gdn, moe, norms, w8a8_linear  # noqa: F401  (define ops, register providers)
from kernels import vllm_xpu  # noqa: F401
from kernels import triton_fast  # noqa: F401  (the `triton` provider; lazy, needs triton + CUDA)
from kernels import ops
from kernels.ops import (causal_conv1d_fn, causal_conv1d_update, gated_delta_rule_decode,
                         gated_delta_rule_prefill, gdn_gating, linear, moe_block, quantize_per_token,
                         quantize_with_scale, rms_norm, rms_norm_gated)

registry.configure_from_env()

__all__ = ["registry", "ops", "linear", "quantize_per_token", "quantize_with_scale", "moe_block",
           "rms_norm", "rms_norm_gated", "causal_conv1d_fn", "causal_conv1d_update", "gdn_gating",
           "gated_delta_rule_decode", "gated_delta_rule_prefill"]
# `w8a8_linear` and `moe` are subpackage names here: call them as kernels.ops.w8a8_linear /
# kernels.ops.moe or torch.ops.repro.w8a8_linear / torch.ops.repro.moe.
