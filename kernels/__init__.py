"""Kernels for the islands: `repro::` custom ops with swappable providers.

    import kernels
    kernels.ops.w8a8_linear(x, w, w_scale)       # or torch.ops.repro.w8a8_linear(...)
    kernels.linear(x, lin)                       # repro.weights.Linear, W8A8 or BF16
    kernels.registry.select("moe", "reference")  # or REPRO_KERNELS="moe=reference,gdn=torch"

One folder per op (FLA style), a reference beside the fast paths, every provider in its op's
folder named after it (`kernels/gdn/fla.py`, `kernels/moe/vllm_xpu.py`, `kernels/norms/triton.py`).
Importing this package defines every op and declares its providers (each folder's table; a
provider's module is imported on first use), imports the plugin modules of $REPRO_PLUGINS (their
providers), then applies $REPRO_KERNELS once. It imports nothing from `repro`; its errors are in
`kernels.errors`.

The import name `kernels` is also Hugging Face's `kernels` package (transformers' hub kernels).
`PROJECT` marks this one: a caller that needs this package checks it (`repro.env.project_kernels()`
does, naming both paths when the other package shadows this one), and `check_identity()` says
whether the submodules loaded are this folder's.
"""
import os as _os

PROJECT = "repro-graph-replay"  # marker: this is the reproducer suite's `kernels`, not another package

from kernels import registry
from kernels import conv1d, gdn, w8a8_linear, moe, norms  # each declares its providers, in this order
from kernels import availability, ops
from kernels.errors import KernelSelectionError
from kernels.ops import (causal_conv1d_fn, causal_conv1d_update, causal_conv1d_update_spec, gated_delta_rule_decode,
                         gated_delta_rule_prefill, gated_delta_rule_spec, gdn_gating, linear, moe_block,
                         quantize_per_token, quantize_with_scale, rms_norm, rms_norm_gated)

registry.configure_from_env()


def check_identity() -> str:
    """This package's folder, after checking that its submodules were loaded from it (a mix of two
    `kernels` packages on `sys.path` raises ImportError naming the stray module)."""
    here = _os.path.dirname(_os.path.abspath(__file__))
    for mod in (registry, ops, availability):
        path = _os.path.abspath(mod.__file__)
        if _os.path.dirname(path) != here:
            raise ImportError(f"kernels: {mod.__name__} was loaded from {path}, not from {here}")
    return here


__all__ = ["registry", "ops", "linear", "quantize_per_token", "quantize_with_scale", "moe_block",
           "rms_norm", "rms_norm_gated", "causal_conv1d_fn", "causal_conv1d_update", "causal_conv1d_update_spec",
           "gdn_gating", "gated_delta_rule_decode", "gated_delta_rule_prefill", "gated_delta_rule_spec",
           "KernelSelectionError", "PROJECT",
           "check_identity"]
# `w8a8_linear` and `moe` are subpackage names here: call them as kernels.ops.w8a8_linear /
# kernels.ops.moe or torch.ops.repro.w8a8_linear / torch.ops.repro.moe.
