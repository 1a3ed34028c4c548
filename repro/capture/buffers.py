"""The graph runner's persistent input buffers: one max-size buffer per input, sliced per step and
padded to the captured size (vLLM's `input_ids` and state-index buffers).

A graph reads the addresses it was captured with, so every step's inputs are copied into these
buffers rather than passed as new tensors; rows past the live ones are padding, and what they hold
is the runner's pad policy (`Pad`): the kernel's own sentinel (nano-vllm's `slot_mapping.fill_(-1)`),
whatever the last step left there, or the other sentinel.
"""
from __future__ import annotations

import torch

from ..control.meta import GDNMeta
from ..knobs.options import Pad


class StaticInputs:
    """Token ids and each token's state slot, `rows` long, on `device`; padded rows hold the value
    the pad policy gives for a kernel that skips `sentinel`."""

    def __init__(self, rows: int, device, sentinel: int):
        self.sentinel = sentinel
        self.input_ids = torch.zeros(rows, dtype=torch.long, device=device)
        self.token_slot = torch.full((rows,), sentinel, dtype=torch.int32, device=device)

    def pad_value(self, pad: Pad) -> int:
        """The state index a padded row carries: the kernel's sentinel, or (`Pad.OTHER`) the other one."""
        if pad is Pad.OTHER:
            return 0 if self.sentinel != 0 else -1
        return self.sentinel

    def fill(self, n: int, size: int, ids: torch.Tensor, token_slots: torch.Tensor, pad: Pad) -> None:
        """The live rows from this step's inputs; rows n..size per `pad` (`Pad.STALE`: untouched)."""
        self.input_ids[:n].copy_(ids)
        self.token_slot[:n].copy_(token_slots)
        if size > n and pad is not Pad.STALE:
            self.input_ids[n:size].zero_()
            self.token_slot[n:size].fill_(self.pad_value(pad))

    def decode_meta(self, size: int) -> GDNMeta:
        """The metadata a captured all-decode step reads: one token a request, state indices straight
        from the persistent slot buffer (so a replay reads what the last fill left there)."""
        dev = self.input_ids.device
        return GDNMeta(query_start_loc=torch.arange(size + 1, dtype=torch.int32, device=dev),
                       state_indices=self.token_slot[:size], has_initial_state=None,
                       num_decodes=size, num_tokens=size)
