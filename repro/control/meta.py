"""The metadata the GDN core reads each step (vLLM's `GDNAttentionMetadata`, the fields this layer
uses): requests in order, decodes first, as vLLM's runner orders them."""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class GDNMeta:
    """One step's GDN metadata: requests in order, decodes first (as vLLM orders them)."""

    query_start_loc: torch.Tensor  # int32 [B+1]
    state_indices: torch.Tensor  # int32 [B]
    has_initial_state: torch.Tensor  # bool [B]
    num_decodes: int  # requests with one token and a state (host ints, as the XPU op takes them)
    num_tokens: int
