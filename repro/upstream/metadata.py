"""vLLM's GDN metadata as the islands read it, and the step's view vLLM's builder reads.

`gdn_meta` turns a `GDNAttentionMetadata` (`vllm/v1/attention/backends/gdn_attn.py`) into the
mirror's `GDNMeta` (`repro.control.meta`, the fields the GDN layer's `_forward_core` uses) without
copying a tensor: where vLLM's builder staged its persistent buffers, the fields are views of them,
so a FULL graph captured over them reads vLLM's own buffers at every replay (module docstring of
`repro.capture.control`). Only the token gathers of a mixed batch change dtype (vLLM's are int32,
`index_copy_` needs int64): those are fresh tensors, and a batch the builder splits that way never
stages them (vLLM reads them only when the batch mixes spec and non-spec rows).

`common` lays one step out as `_build_attention_metadata` does (rows in the step's order, `pad_rows`
zero-length rows after them, their block-table rows the null block) for `builder.Builder.common`.
"""
from __future__ import annotations

import numpy as np
import torch

from ..control.builder import Common
from ..control.meta import GDNMeta
from .builder import FIELDS

NULL_BLOCK_ID = 0  # `vllm/v1/attention/backends/utils.py: NULL_BLOCK_ID`: block 0 is reserved for padding
_INDICES = {"spec_token_indx", "non_spec_token_indx"}


def gdn_meta(meta) -> GDNMeta:
    """`meta` (vLLM's) as the islands' `GDNMeta`, sharing every tensor but the mixed-batch gathers."""
    out = {}
    for theirs, ours in FIELDS.items():
        v = getattr(meta, theirs, None)
        if ours in _INDICES and isinstance(v, torch.Tensor):
            v = v.long()
        out[ours] = v
    return GDNMeta(**out)


def common(query_lens, computed, prefilling, drafts, accepted, blocks: np.ndarray, num_tokens: int,
           block_size: int | None, pad_rows: int = 0) -> Common:
    """The builder's view of one step (module docstring): per-request lists, then `pad_rows`
    padding rows (query length 0, nothing computed, not prefilling, no drafts, 1 accepted token,
    the null block)."""
    pad = [0] * pad_rows
    rows = np.concatenate((np.asarray(blocks, dtype=np.int32).reshape(len(query_lens), -1),
                           np.full((pad_rows, np.shape(blocks)[1] if len(query_lens) else 1), NULL_BLOCK_ID,
                                   dtype=np.int32)))
    return Common(np.asarray(list(query_lens) + pad, dtype=np.int32), np.asarray(list(computed) + pad, dtype=np.int32),
                  np.asarray(list(prefilling) + [False] * pad_rows, dtype=bool),
                  np.asarray(list(drafts) + [-1] * pad_rows, dtype=np.int32),
                  np.asarray(list(accepted) + [1] * pad_rows, dtype=np.int32), rows, num_tokens, block_size)
