"""`fla` provider: flash-linear-attention's Triton kernels behind the GDN ops (lazy import).

Present only when `fla` imports and a CUDA or XPU device exists; registered either way so it
is reported with a reason. q and k are passed raw (expanded to the value heads) with
`use_qk_l2norm_in_kernel=True` and scale dk^-0.5, as vLLM calls them, every argument after v by
keyword (fla's entry points differ in positional order); states are gathered and
written back with the same snapshot / sentinel / last-wins rules as the other providers
(FLA's state layout [N, H, dk, dv] is ours). Decode agrees with the reference to fp32 rounding
(bf16 output rounding), and is deterministic and batch-invariant bit for bit on an H200; prefill
(fla's chunked kernel, bf16 intermediates) within about 5e-3 on the state (docs/fla/REPORT.md).
The CPU tests check only how fla is called (tests/test_kernels_fla.py).
"""
from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect

import torch

from kernels import registry
from kernels._state import scatter_last_wins, slot_rows
from kernels.gdn.common import expand_heads


# What _call passes by keyword (after q, k, v).
_KEYWORDS = ("g", "beta", "scale", "initial_state", "output_final_state", "cu_seqlens",
             "use_qk_l2norm_in_kernel")


@functools.lru_cache(maxsize=None)
def available() -> tuple[bool, str]:
    if importlib.util.find_spec("fla") is None:
        return False, "fla (flash-linear-attention) is not installed"
    if not (torch.cuda.is_available() or (hasattr(torch, "xpu") and torch.xpu.is_available())):
        return False, "needs a CUDA or XPU device"
    try:
        mod = importlib.import_module("fla.ops.gated_delta_rule")
    except Exception as e:  # ImportError, or Triton failing to initialise
        return False, f"fla does not import: {type(e).__name__}: {e}"
    problem = api_problem(mod)
    if problem:
        return False, problem
    return True, "fla imports"


def api_problem(mod) -> str | None:
    """Why `mod` (fla.ops.gated_delta_rule) cannot take our call, or None. Both entry points take
    **kwargs, so a renamed parameter would be swallowed silently rather than refused."""
    for name in ("fused_recurrent_gated_delta_rule", "chunk_gated_delta_rule"):
        params = inspect.signature(getattr(mod, name)).parameters
        missing = [p for p in _KEYWORDS if p not in params]
        if missing:
            return f"fla's {name} has no parameter {', '.join(missing)} (its API changed)"
    return None


def _fla():
    return importlib.import_module("fla.ops.gated_delta_rule")


def _call(fn, q, k, v, g, beta, initial, cu_seqlens):
    # Every argument after v by keyword: fla's two entry points do not share a positional order.
    # fused_recurrent_gated_delta_rule is (q, k, v, g, gk, gv, beta, ...) (fla-core 0.3.2 to 0.6.0 at
    # least), chunk_gated_delta_rule is (q, k, v, g, beta, ...). Passing beta fifth made the decode
    # kernel take it as the per-key decay gk [B, T, HV, K], read 128x past its end, and run with
    # beta = 1 (docs/fla/REPORT.md).
    Hv = v.shape[1]
    o, final = registry.call(fn, expand_heads(q, Hv)[None].to(v.dtype), expand_heads(k, Hv)[None].to(v.dtype),
                  v[None], g=g[None].float(), beta=beta[None].float(), scale=q.shape[-1] ** -0.5,
                  initial_state=initial, output_final_state=True, cu_seqlens=cu_seqlens,
                  use_qk_l2norm_in_kernel=True)
    return o[0], final


def gated_delta_rule_decode_fla(q, k, v, g, beta, ssm_state, state_indices, sentinel):
    B = v.shape[0]
    valid, slot = slot_rows(state_indices, sentinel, ssm_state.shape[0])
    old = ssm_state.index_select(0, slot)
    cu = torch.arange(B + 1, device=v.device, dtype=torch.int64)
    o, final = _call(_fla().fused_recurrent_gated_delta_rule, q, k, v, g, beta, old.float(), cu)
    scatter_last_wins(ssm_state, slot, valid, final, old)
    return torch.where(valid[:, None, None], o, 0).to(v.dtype).contiguous()


def gated_delta_rule_prefill_fla(q, k, v, g, beta, ssm_state, query_start_loc, state_indices,
                                 has_initial_state, sentinel):
    T, Hv, dv = v.shape
    B = state_indices.shape[0]
    out = torch.zeros(T, Hv, dv, dtype=v.dtype, device=v.device)
    if B == 0:
        return out
    valid, slot = slot_rows(state_indices, sentinel, ssm_state.shape[0])
    old = ssm_state.index_select(0, slot)
    initial = torch.where(has_initial_state.view(B, 1, 1, 1), old.float(), 0.0)
    starts = query_start_loc.to(torch.int64)
    s0, end = int(starts[0]), int(starts[-1])                               # host sync: prefill only
    span = slice(s0, end)
    o, final = _call(_fla().chunk_gated_delta_rule, q[span], k[span], v[span], g[span], beta[span],
                     initial, starts - s0)
    scatter_last_wins(ssm_state, slot, valid, final, old)
    t = torch.arange(s0, end, device=v.device)
    req = torch.bucketize(t, starts[1:], right=True).clamp(max=B - 1)
    out[span] = torch.where(valid[req][:, None, None], o, 0).to(v.dtype)
    return out

