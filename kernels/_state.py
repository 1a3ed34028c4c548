"""State-cache addressing shared by the ops that read and write per-sequence state rows.

Rules (the same in every provider):
- A row whose state index equals `sentinel` is padding: its output is zero and no state row
  changes because of it (vLLM pads with -1, newer vLLM with 0 = the null block).
- Any other index is used modulo S (the cache's row count): never a device assert, so a
  runner that pads with the wrong sentinel (-1 against a kernel that skips 0) corrupts the last
  row, a silent hazard the suite can detect, rather than crashing the process.
- Every row reads the state as it was before the call (snapshot). When several valid rows
  name the same slot, the last of them in batch order is what the slot holds afterwards.
- Speculative decoding (the `_spec` ops): a row has at most 1 + k tokens (its tokens past the
  first 1 + k belong to no row: output zero), and its accepted count is used clamped into 1..1+k
  (`accepted_column`), for the same reason as the modulo: no device assert.

The vectorised writer has no race even on a GPU: every row writes, to the slot it addresses,
the value that slot must end with (the last valid claimant's new state, or the slot's old
contents if no valid row claims it), so duplicate writes carry identical bytes. Slots that no
valid row claims are rewritten with their own old bytes, i.e. left bit-identical.
"""
from __future__ import annotations

import torch


def slot_rows(state_indices: torch.Tensor, sentinel: int, num_slots: int):
    """(valid [B] bool, slot [B] int64): which rows are real and the cache row each one addresses."""
    idx = state_indices.to(torch.int64)
    valid = idx != sentinel
    slot = torch.remainder(torch.where(valid, idx, torch.zeros_like(idx)), num_slots)
    return valid, slot


def _rows(mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return mask.view(mask.shape + (1,) * (like.dim() - 1))


def scatter_last_wins(cache: torch.Tensor, slot: torch.Tensor, valid: torch.Tensor,
                      new: torch.Tensor, old: torch.Tensor) -> None:
    """Write `new[b]` into cache[slot[b]] for valid rows, last valid row winning; race-free.

    `old` must be `cache.index_select(0, slot)` taken before the call changed anything.
    Static shapes, no host sync: safe inside a captured graph.
    """
    B = slot.shape[0]
    if B == 0:
        return
    order = torch.arange(B, device=slot.device)
    claims = (slot[:, None] == slot[None, :]) & valid[None, :]   # row j is valid and aims at slot[b]
    winner = torch.where(claims, order[None, :], torch.full_like(claims, -1, dtype=order.dtype)).amax(1)
    value = torch.where(_rows(winner >= 0, new), new.index_select(0, winner.clamp(min=0)), old)
    cache.index_put_((slot,), value.to(cache.dtype))


def write_rows_in_order(cache: torch.Tensor, slot: torch.Tensor, valid: torch.Tensor,
                        new: torch.Tensor) -> None:
    """Reference writer: one row at a time in batch order, a padding row rewriting what is there."""
    for b in range(slot.shape[0]):
        at = slot[b:b + 1]
        current = cache.index_select(0, at)
        cache.index_copy_(0, at, torch.where(valid[b], new[b:b + 1].to(cache.dtype), current))


def accepted_column(num_accepted: torch.Tensor, width: int) -> torch.Tensor:
    """int64 [B]: num_accepted - 1 clamped into 0..width-1, the column a speculative row starts from."""
    return num_accepted.to(torch.int64).clamp(1, width) - 1


def scatter_columns_last_wins(cache: torch.Tensor, slot: torch.Tensor, writes: torch.Tensor,
                              new: torch.Tensor, old: torch.Tensor) -> None:
    """`scatter_last_wins` column by column of the last dimension: row b writes `new[b][..., c]`
    into its slot where writes[b, c] (a [B, W] mask; padding rows write nothing); for each (slot,
    column) the last row that writes it wins, and a column no row writes keeps its bytes.
    Race-free for the same reason: every row writes its slot's final value. `old` as there."""
    B, W = writes.shape
    if B == 0:
        return
    order = torch.arange(B, device=slot.device)
    claims = (slot[:, None] == slot[None, :])[:, :, None] & writes[None, :, :]   # [b, j, c]: j writes c of slot[b]
    winner = torch.where(claims, order[None, :, None], torch.full_like(claims, -1, dtype=order.dtype)).amax(1)
    at = (B,) + (1,) * (new.dim() - 2) + (W,)
    picked = new.gather(0, winner.clamp(min=0).view(at).expand(new.shape))
    cache.index_put_((slot,), torch.where((winner >= 0).view(at), picked, old).to(cache.dtype))
