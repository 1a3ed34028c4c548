"""`vllm_xpu` provider of `repro::gdn_attention`: vllm-xpu-kernels' fused `_xpu_C.gdn_attention`, called
as vLLM calls it (`vllm/_xpu_ops.py: _gdn_attention_core_xpu_impl`). Its rules: `xpu_semantics.py`.

Contract (schema in `kernels/vllm_xpu_ops.py`, held on the CPU by `tests/test_xpu_contract.py`
against a body that checks what the kernel checks and runs `xpu_semantics` in the kernel's
layouts), read from `csrc/xpu/gdn_attn/`:
- `projected_states_qkvz` [T, C + Hv*dv] with `reorder_input=True`: [q | k | v | z] head-major
  blocks, the Qwen3.5/3.6 layout of this suite's `qkv` (`causal_conv1d.hpp`: the ReorderInput
  offsets). z is not this op's: the island takes it from submod0, so zeros go in and the kernel's
  copy of them (`z`, a scratch buffer) is dropped. `projected_states_ba` [T, 2Hv]: [b | a].
- `conv_state` per block [K-1+k, C] (`conv_states[cache, width - 1, C]`), the suite's
  [C, K-1+k] transposed; `ssm_state` per block [Hv, dv, dk] (`ssm_state[cache, num_v_heads,
  head_v_dim, head_k_dim]`), the suite's [Hv, dk, dv] transposed: each goes in as a contiguous
  copy (the kernel checks `conv_state[0]` and `ssm_state[0]` contiguous) and comes back whole.
- `conv_weights` [C, K] in the inputs' dtype (read as `scalar_t`), no bias, activation "silu";
  `A_log` fp32, `dt_bias` in `core_attn_out`'s dtype (both checked in `gated_delta_rule`);
  index tensors int32 and contiguous (checked), as vLLM converts the token maps.
- head counts are this rank's, with `tp_size` 1 (the kernel divides every count by it).
Not batch-invariant (`kernels/gdn/__init__.py`).
"""
from __future__ import annotations

import torch

from kernels import registry
from kernels.gdn.core import head_dims
from kernels.vllm_xpu_ops import namespace


def _i32(t):
    return None if t is None else t.to(torch.int32).contiguous()


def gdn_attention_vllm_xpu(core_out, qkv, b, a, conv_weight, A_log, dt_bias, conv_state, ssm_state, num_prefills,
                           num_decodes, num_spec_decodes, num_actual_tokens, num_decode_tokens, num_prefill_tokens,
                           has_initial_state, non_spec_query_start_loc, non_spec_token_indx, non_spec_state_indices,
                           spec_query_start_loc, spec_token_indx, spec_state_indices, num_accepted_tokens, sentinel,
                           *, ns=None) -> None:
    """`ns`: the namespace holding `gdn_attention` (default `torch.ops._xpu_C`; a test passes its own).
    `num_decode_tokens`, `num_prefill_tokens` and `sentinel` are not the kernel's (module docstring)."""
    ns = namespace("_xpu_C") if ns is None else ns
    Hk, dk, Hv, dv = head_dims(qkv, ssm_state)
    T, C = qkv.shape
    # zeros, not empty: a recorded call's inputs must repeat (`registry.call`)
    qkvz = torch.cat([qkv, torch.zeros(T, Hv * dv, dtype=qkv.dtype, device=qkv.device)], dim=1)
    ba = torch.cat([b, a], dim=1).contiguous()
    z = torch.zeros(T, Hv, dv, dtype=core_out.dtype, device=core_out.device)
    out = core_out.contiguous()
    conv = conv_state.transpose(1, 2).contiguous()
    ssm = ssm_state.transpose(-1, -2).contiguous()
    registry.call(ns.gdn_attention, out, z, qkvz, ba, Hk, Hv, dk, dv, conv, ssm,
                  conv_weight.reshape(C, -1).to(qkv.dtype).contiguous(), None, "silu", A_log.float().contiguous(),
                  dt_bias.to(core_out.dtype).contiguous(), num_prefills, num_decodes, num_spec_decodes,
                  None if has_initial_state is None else has_initial_state.to(torch.bool).contiguous(),
                  _i32(non_spec_query_start_loc), _i32(non_spec_token_indx), _i32(non_spec_state_indices),
                  _i32(spec_query_start_loc), _i32(spec_token_indx), _i32(spec_state_indices),
                  _i32(num_accepted_tokens), num_actual_tokens, 1, True)
    conv_state.copy_(conv.transpose(1, 2))
    ssm_state.copy_(ssm.transpose(-1, -2))
    if out is not core_out:
        core_out.copy_(out)
