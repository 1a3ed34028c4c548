"""Op variants that plant a hazard at the op level (registered next to the real ones)."""
from __future__ import annotations

from typing import Optional

import torch

from kernels._library import define


@define("gated_delta_rule_decode_undeclared", mutates_args=())
def gated_delta_rule_decode_undeclared(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                                       beta: torch.Tensor, ssm_state: torch.Tensor, state_indices: torch.Tensor,
                                       sentinel: int) -> torch.Tensor:
    """The decode rule with a schema that hides its write to `ssm_state` (hazard
    `undeclared-mutation`): anything trusting the schema, a compiler's functionalisation or a
    runtime's snapshot of mutated inputs, gets the data flow wrong. opcheck reports it."""
    return torch.ops.repro.gated_delta_rule_decode(q, k, v, g, beta, ssm_state, state_indices, sentinel)


@gated_delta_rule_decode_undeclared.register_fake
def _(q, k, v, g, beta, ssm_state, state_indices, sentinel):
    return torch.empty_like(v)


@define("gdn_attention_undeclared", mutates_args=("core_out",))
def gdn_attention_undeclared(core_out: torch.Tensor, qkv: torch.Tensor, b: torch.Tensor, a: torch.Tensor,
                             conv_weight: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor,
                             conv_state: torch.Tensor, ssm_state: torch.Tensor, num_prefills: int, num_decodes: int,
                             num_spec_decodes: int, num_actual_tokens: int, num_decode_tokens: int,
                             num_prefill_tokens: int, has_initial_state: Optional[torch.Tensor],
                             non_spec_query_start_loc: Optional[torch.Tensor],
                             non_spec_token_indx: Optional[torch.Tensor],
                             non_spec_state_indices: Optional[torch.Tensor],
                             spec_query_start_loc: Optional[torch.Tensor], spec_token_indx: Optional[torch.Tensor],
                             spec_state_indices: Optional[torch.Tensor], num_accepted_tokens: Optional[torch.Tensor],
                             sentinel: int) -> None:
    """The fused core (`repro::gdn_attention`) with a schema that declares only its output, as vLLM
    declares its XPU wrapper (`vllm/_xpu_ops.py`: `gdn_attention_core_xpu`, mutates_args
    core_attn_out and z; the states are reached through the forward context there): hazard
    `undeclared-mutation` under a fused provider. Its writes to `conv_state` and `ssm_state` are
    what opcheck and the capture lint report."""
    torch.ops.repro.gdn_attention(core_out, qkv, b, a, conv_weight, A_log, dt_bias, conv_state, ssm_state,
                                  num_prefills, num_decodes, num_spec_decodes, num_actual_tokens, num_decode_tokens,
                                  num_prefill_tokens, has_initial_state, non_spec_query_start_loc, non_spec_token_indx,
                                  non_spec_state_indices, spec_query_start_loc, spec_token_indx, spec_state_indices,
                                  num_accepted_tokens, sentinel)


@gdn_attention_undeclared.register_fake
def _(*args):
    return None
