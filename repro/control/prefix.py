"""Block-aligned prefix caching of GDN state: vLLM's mamba cache mode "align", the runner's side.

With a block size, a request's state blocks grow with its sequence: column j of its block-table row
holds the state after exactly (j+1)*block_size tokens, and the state the next token continues from
lives in the running column `(seq_len - 1) // block_size` (seq_len: tokens computed plus tokens
scheduled, drafts included), followed by K speculative columns. Three host-side rules read that:

- `running_column`: where a step keeps its running state (`vllm/v1/worker/mamba_utils.py:
  preprocess_mamba`, `curr_state_idx = cdiv(num_computed + num_scheduled, block_size) - 1`);
- `state_block_columns`: the 1+K block-table columns the GDN metadata builder takes as a row's state
  indices (`vllm/v1/attention/backends/utils.py: mamba_get_block_table_tensor`, mode "align");
- `forward_copies` / `copy_states`: before the forward, a request whose running column moved copies
  its state from the old column to the new one (`preprocess_mamba` with `collect_mamba_copy_meta`
  and the copy specs of `vllm/model_executor/layers/mamba/mamba_utils.py: get_conv_copy_spec,
  get_temporal_copy_spec`), after the previous step's spec decodes saved the block-boundary states
  their kept tokens reached (`vllm/v1/worker/mamba_utils.py: postprocess_mamba_align_gpu`, decided by
  the scheduler: `repro/scheduler/prefix.py`). The copies run on the host's stream, outside any
  graph, on every copy of the state (eager, replay, the third copy, the oracle's probe) alike.

The scheduler's side (chunks floored to block boundaries, prefix hits) is `repro/scheduler/prefix.py`.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


def running_column(seq_len: int, block_size: int) -> int:
    """The running state's column: `(seq_len - 1) // block_size`, -1 for an empty sequence
    (`preprocess_mamba`: `cdiv(num_computed + num_scheduled, block_size) - 1`; a new request with
    nothing computed has the previous column -1 by the same formula)."""
    return -(-seq_len // block_size) - 1


def state_block_columns(blocks: np.ndarray, seq_lens, width: int, block_size: int) -> np.ndarray:
    """The state indices of each row: `width` (1+K) consecutive block-table columns from
    `(seq_len - 1) // block_size`, the start clamped at 0 (`mamba_get_block_table_tensor`, mode
    "align"; a padding row of seq_len 0 starts at column 0). The table holds every column a row
    reads (the scheduler allocates the running and speculative ones)."""
    start = np.maximum((np.asarray(seq_lens, dtype=np.int64) - 1) // block_size, 0)
    table = np.asarray(blocks)
    if len(table) and int(start.max()) + width > table.shape[1]:
        raise ValueError(f"a block-table row of {table.shape[1]} columns has no column {int(start.max()) + width - 1}")
    cols = start[:, None] + np.arange(width)[None, :]
    return np.take_along_axis(table, cols, axis=1).astype(np.int32)


@dataclass(frozen=True)
class StateCopy:
    """One request's forward copy: the conv state from `conv_src` (its window shifted left by
    `conv_offset` tokens) and the SSM state from `ssm_src`, both into `dst`."""
    dst: int
    conv_src: int
    conv_offset: int
    ssm_src: int


def forward_copies(batch) -> tuple[list[StateCopy], list[int]]:
    """`preprocess_mamba`, per request of a step with a block size: where the running column moved
    from `prev` (the batch's `prev_cols`; -1: nothing computed) to `curr` (`state_cols`), the conv
    state comes from block[prev] at token offset accepted-1 and the SSM state from
    block[prev + accepted - 1] (the column of the last kept token), into block[curr]; that request's
    accepted count becomes 1. Returns the copies and every request's accepted count after them
    (what the metadata builder then reads). The previous step's boundary copies (`post_copies`) come
    first, a dummy step's too; otherwise a batch without a block size copies nothing."""
    accepted = list(batch.accepted())
    copies = [StateCopy(*c) for c in batch.post_copies]
    if batch.block_size is None or batch.dummy:
        return copies, accepted
    for i, (row, prev, curr) in enumerate(zip(batch.block_rows(), batch.prev_cols, batch.state_cols)):
        if prev == -1 or prev == curr:
            continue
        a = accepted[i]
        copies.append(StateCopy(row[curr], row[prev], a - 1, row[prev + a - 1]))
        accepted[i] = 1
    return copies, accepted


def copy_states(conv: torch.Tensor, ssm: torch.Tensor, copies: list[StateCopy]) -> None:
    """Apply the forward copies to one copy's state tensors (conv: [blocks, dim, width], the state's
    tokens along the last axis; ssm: [blocks, ...]). A conv window shifted by `conv_offset` fills the
    destination's first width-offset tokens (`get_conv_copy_spec`: the source from the offset on)."""
    for c in copies:
        w = conv.shape[-1] - c.conv_offset
        src = conv[c.conv_src, :, c.conv_offset:]
        conv[c.dst, :, :w].copy_(src.clone() if c.conv_src == c.dst else src)  # a block's window shifted in place
        if c.ssm_src != c.dst:
            ssm[c.dst].copy_(ssm[c.ssm_src])
