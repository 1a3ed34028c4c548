"""`vllm_xpu` provider of `repro::rms_norm`: vllm-xpu-kernels' `_C.gemma_rms_norm` (`(1 + w)` form).

Contract (schema and checks in `kernels/vllm_xpu_ops.py`, tested on the CPU by
`tests/test_xpu_contract.py`): `gemma_rms_norm(result!, input!, weight!, epsilon)`.
- The wheel requires the weight's dtype to equal the input's, so the weight is cast to x's dtype
  (a checkpoint may keep norm weights in another dtype than the activations).
- Its schema marks input and weight mutable, so they are passed as copies: our op promises not
  to mutate its arguments.
Not batch-invariant: vllm-xpu-kernels sizes the norm's work-group by the number of tokens
(1024 below 256 tokens, 256 from there, in its `csrc/layernorm.cpp` rms_norm), which changes the
reduction order, so a row's bits may depend on the batch it is in.
"""
from __future__ import annotations

import torch

from kernels import registry
from kernels.vllm_xpu_ops import namespace


def rms_norm_vllm_xpu(x, w, eps, *, ns=None):
    """`ns`: the namespace holding `gemma_rms_norm` (default `torch.ops._C`; a test passes its own)."""
    ns = namespace("_C") if ns is None else ns
    flat = x.reshape(-1, x.shape[-1]).contiguous().clone()
    out = torch.zeros_like(flat)  # zeros, not empty: a recorded call's inputs must repeat (`registry.call`)
    registry.call(ns.gemma_rms_norm, out, flat, w.to(flat.dtype).contiguous().clone(), eps)
    return out.view(x.shape)

