"""The graph runner's persistent input buffer: one max-size buffer of token ids, sliced per step and
padded to the captured size (vLLM's `input_ids`).

A graph reads the addresses it was captured with, so every step's token ids are copied into this
buffer rather than passed as a new tensor; rows past the live ones are padding, and what padding
holds is the runner's pad policy (`Pad`). The same policy says what the GDN metadata builder writes
into its persistent buffers past the live rows (`pad_value`): the kernel's own sentinel
(nano-vllm's `slot_mapping.fill_(-1)`), nothing (they keep what the last step left there), or the
other sentinel.
"""
from __future__ import annotations

import torch

from ..knobs.options import Pad


def pad_value(pad: Pad, sentinel: int) -> int | None:
    """The state index a padded row carries: the kernel's `sentinel`, the other one (`Pad.OTHER`),
    or None (`Pad.STALE`: whatever the last step left)."""
    if pad is Pad.STALE:
        return None
    if pad is Pad.OTHER:
        return 0 if sentinel != 0 else -1
    return sentinel


class StaticInputs:
    """Token ids, `rows` long, on `device`, for kernels that skip the state index `sentinel`."""

    def __init__(self, rows: int, device, sentinel: int):
        self.sentinel = sentinel
        self.input_ids = torch.zeros(rows, dtype=torch.long, device=device)

    def pad_value(self, pad: Pad) -> int | None:
        return pad_value(pad, self.sentinel)

    def fill(self, n: int, size: int, ids: torch.Tensor, pad: Pad) -> None:
        """The live rows from this step's token ids; rows n..size zero (`Pad.STALE`: untouched)."""
        self.input_ids[:n].copy_(ids)
        if size > n and pad is not Pad.STALE:
            self.input_ids[n:size].zero_()
