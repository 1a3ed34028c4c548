"""`triton` provider: fused Triton kernels for the decode path (one launch where the `torch`
provider issues ten), for `repro bench`'s replay-vs-floor targets, and for the two prefill ops
(`causal_conv1d_fn`, `gated_delta_rule_prefill`: one launch each where the `torch` / `reference`
providers issue hundreds of small ops and read back to the host in a mixed step).

The kernels live in their op's folder (`kernels/<op>/triton.py`, shared helpers in
`kernels/triton_helpers.py`); this module, which imports no Triton, says when they are available
and registers them. A kernel module is imported on the first call of its op, so `import kernels`
works where Triton is not installed. What each kernel fuses and how it matches the reference is in
its module's docstring; in short:
- `w8a8_linear`, `moe` (W8A8 experts), `causal_conv1d_update`, `causal_conv1d_fn`, `gdn_gating`:
  bit-identical;
- `gated_delta_rule_decode`: within fp32 rounding of the reference (reductions in another order);
  `gated_delta_rule_prefill`: the same step token by token (the recurrent form), within fp32
  rounding of the reference's chunked form;
- `rms_norm`, `add_rms_norm`, `rms_norm_gated`: within one bf16 rounding (the sum of `add_rms_norm`
  bit-identical).
All are batch-invariant: a row's result does not depend on the other rows.

Activation scales: `amax / 127` in `quant.py` is a CUDA tensor divided by a Python float, which
torch computes as `amax * fp32(1/127)`; the kernels do the same (a true division differs for
about one amax in 20).

Block sizes are autotuned per shape on first use (before any capture: the runner's warm-up).
`python3 -m kernels.w8a8_linear.sweep` sweeps the decode GEMV's configs on a GPU.

Available with `triton` importable and a CUDA device (or `TRITON_INTERPRET=1`, Triton's CPU
interpreter, for testing: slow). Select with `REPRO_KERNELS=all=triton` or
`registry.select("all", "triton")`; the default stays `torch`.
"""
from __future__ import annotations

import functools
import importlib
import importlib.util
import os

import torch

from kernels import registry

# op -> (module holding its kernel, function name there, registry group)
KERNELS = {
    "w8a8_linear": ("kernels.w8a8_linear.triton", "w8a8_linear", "w8a8"),
    "moe": ("kernels.moe.triton", "moe", "moe"),
    "rms_norm": ("kernels.norms.triton", "rms_norm", "norms"),
    "add_rms_norm": ("kernels.norms.triton", "add_rms_norm", "norms"),
    "rms_norm_gated": ("kernels.norms.triton", "rms_norm_gated", "norms"),
    "causal_conv1d_update": ("kernels.conv1d.triton", "causal_conv1d_update", "conv1d"),
    "causal_conv1d_fn": ("kernels.conv1d.triton", "causal_conv1d_fn", "conv1d"),
    "gdn_gating": ("kernels.gdn.triton", "gdn_gating", "gdn"),
    "gated_delta_rule_decode": ("kernels.gdn.triton", "gated_delta_rule_decode", "gdn"),
    "gated_delta_rule_prefill": ("kernels.gdn.triton", "gated_delta_rule_prefill", "gdn"),
}


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


@functools.lru_cache(maxsize=None)
def available() -> tuple[bool, str]:
    if importlib.util.find_spec("triton") is None:
        return False, "triton is not installed"
    if interpreting():
        return True, "Triton interpreter (TRITON_INTERPRET=1): CPU, slow, for testing"
    if not torch.cuda.is_available():
        return False, "needs an NVIDIA GPU (CUDA)"
    return True, "triton imports and a CUDA device is present"


def lazy(module: str, name: str):
    """A provider function that imports `module` (and so Triton) on its first call."""
    fn = None

    def call(*args):
        nonlocal fn
        if fn is None:
            fn = getattr(importlib.import_module(module), name)
        return fn(*args)
    call.__name__ = call.__qualname__ = f"{name}_triton"
    call.__doc__ = f"`{module}.{name}`, imported on first use."
    return call


def register_all() -> None:
    """Register the `triton` provider of every op in `KERNELS` (after the op's other providers, so
    the registry lists them in the order they were added)."""
    for op, (module, name, group) in KERNELS.items():
        registry.register(op, "triton", lazy(module, name), available, group=group)
