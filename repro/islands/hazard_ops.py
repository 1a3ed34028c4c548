"""Op variants that plant a hazard at the op level (registered next to the real ones)."""
from __future__ import annotations

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
