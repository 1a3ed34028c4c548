"""`triton` provider: fused Triton kernels for the decode path (one launch where the `torch`
provider issues ten), for `repro bench`'s replay-vs-floor targets.

Ops and what each kernel fuses (arithmetic rules are the ops' own, see each op's docstring):
- `w8a8_linear`: per-token activation quantisation + int8 products (int32 accumulate) + the
  shared epilogue, one kernel: up to 8 rows one program per (row, output block), the weights
  read as int32 words and multiplied with `dp4a` (a GEMV), more rows int8 `tl.dot` tiles of 16
  rows. Bit-identical to the reference.
- `moe`: one kernel computes the router logits (exact products, the reference's fixed-order
  sums); one the softmax, the top-k (repeated argmax, ties to the lowest expert: no sort), the
  renormalisation and the shared expert's gate logit; one quantises x and
  runs each (token, choice) pair's gate/up rows + SiLU-and-mul, and the shared expert's, in one
  grid; one quantises the activations and runs the down rows of every choice (one tile of all
  choices' weights), the k-ordered combine, the shared expert's down rows and its sigmoid gate.
  Bit-identical to the reference with W8A8 experts (BF16 experts fall back to `torch`).
- `causal_conv1d_update`, `gdn_gating`: one kernel each; bit-identical.
- `gated_delta_rule_decode`: q/k L2 norm + decay + delta rule + output, one kernel; within fp32
  rounding of the reference (reductions in another order).
- `rms_norm`, `add_rms_norm`, `rms_norm_gated`: one kernel each; within one bf16 rounding of the
  reference (the sum of `add_rms_norm` bit-identical).

Activation scales: `amax / 127` in `quant.py` is a CUDA tensor divided by a Python float, which
torch computes as `amax * fp32(1/127)`; the kernels do the same (a true division differs for
about one amax in 20).

Float order: every multiply / add / divide that the reference does as a separate torch op is
done with an explicitly rounded instruction (`mul_rn`, `add_rn`, `div_rn`), so the compiler
cannot contract it into an FMA; exp / log1p are the CUDA math library's (`libdevice`), as torch's
CUDA kernels use. State rows follow `kernels/_state.py` (sentinel rows skipped, snapshot reads,
last valid row wins) by walking the batch in order inside each program, which owns a disjoint
slice of every state row.

Block sizes are autotuned per shape on first use (before any capture: the runner's warm-up).

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


def _k():
    return importlib.import_module("kernels.triton_fast.kernels")


def w8a8_linear_triton(x, w, w_scale, bias):
    return _k().w8a8_linear(x, w, w_scale, bias)


def moe_triton(*args):
    return _k().moe(*args)


def rms_norm_triton(x, w, eps):
    return _k().rms_norm(x, w, eps)


def add_rms_norm_triton(x, y, w, eps):
    return _k().add_rms_norm(x, y, w, eps)


def rms_norm_gated_triton(x, z, w, eps):
    return _k().rms_norm_gated(x, z, w, eps)


def causal_conv1d_update_triton(x, weight, conv_state, state_indices, sentinel):
    return _k().causal_conv1d_update(x, weight, conv_state, state_indices, sentinel)


def gdn_gating_triton(A_log, a, dt_bias, b):
    return _k().gdn_gating(A_log, a, dt_bias, b)


def gated_delta_rule_decode_triton(q, k, v, g, beta, ssm_state, state_indices, sentinel):
    return _k().gated_delta_rule_decode(q, k, v, g, beta, ssm_state, state_indices, sentinel)


registry.register("w8a8_linear", "triton", w8a8_linear_triton, available, group="w8a8")
registry.register("moe", "triton", moe_triton, available, group="moe")
registry.register("rms_norm", "triton", rms_norm_triton, available, group="norms")
registry.register("add_rms_norm", "triton", add_rms_norm_triton, available, group="norms")
registry.register("rms_norm_gated", "triton", rms_norm_gated_triton, available, group="norms")
registry.register("causal_conv1d_update", "triton", causal_conv1d_update_triton, available, group="conv1d")
registry.register("gdn_gating", "triton", gdn_gating_triton, available, group="gdn")
registry.register("gated_delta_rule_decode", "triton", gated_delta_rule_decode_triton, available, group="gdn")
