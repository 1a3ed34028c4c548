"""The metadata the GDN core reads each step (`vllm/v1/attention/backends/gdn_attn.py:
GDNAttentionMetadata`, the fields this layer uses).

Requests split into spec rows (a decode carrying draft tokens: `num_decode_draft_tokens >= 0`) and
non-spec rows (one-token decodes first, then prefills). Spec rows read their state from column
`num_accepted - 1` of their 2-D state indices and write the state after token t to column t;
non-spec rows read and write one block. The counts are host ints: a FULL graph freezes them at
capture, and only the tensors' contents change between its replays.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class GDNMeta:
    num_actual_tokens: int  # the tokens the core processes (padded under a FULL graph)
    num_decodes: int = 0  # non-spec one-token rows, first among the non-spec rows
    num_prefills: int = 0
    num_spec_decodes: int = 0
    num_decode_tokens: int = 0
    num_prefill_tokens: int = 0
    num_spec_decode_tokens: int = 0
    non_spec_query_start_loc: torch.Tensor | None = None  # int32 [non-spec rows + 1]
    non_spec_state_indices: torch.Tensor | None = None  # int32 [non-spec rows]
    has_initial_state: torch.Tensor | None = None  # bool [non-spec rows]
    spec_query_start_loc: torch.Tensor | None = None  # int32 [spec rows + 1]
    spec_state_indices: torch.Tensor | None = None  # int32 [spec rows, 1+k]
    num_accepted_tokens: torch.Tensor | None = None  # int32 [spec rows]
    spec_token_indx: torch.Tensor | None = None  # int64: the spec rows' tokens
    non_spec_token_indx: torch.Tensor | None = None  # int64: the other rows' tokens (a mixed batch only)
