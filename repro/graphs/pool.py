"""A memory pool model for the CPU tape: one arena shared by captured pieces.

A device graph pool hands out blocks during capture; after capture, blocks whose tensors are
only weakly held go back to the pool and a *later capture* may place its tensors there, while
the earlier graph still writes the same bytes on every replay. This arena does the same with
byte ranges of a few large uint8 tensors, so allocator reuse is testable on a CPU.

Each block is handed out as its own storage over the segment's bytes (as a device allocator's
block is its own allocation): `t.untyped_storage()` of a pooled tensor is its block, not the whole
segment, so whole-storage checks (`lint.py`) and a custom op's aliasing rule see one allocation.
The block's storage keeps its segment alive, so a tensor may outlive its arena.
"""
from __future__ import annotations

import torch

ALIGN = 64
SEGMENT = 4 << 20


def _storage_nbytes(shape, stride, itemsize) -> int:
    if any(s == 0 for s in shape):
        return 0
    return (1 + sum((n - 1) * st for n, st in zip(shape, stride))) * itemsize


def _block_bytes(segment: torch.Tensor, off: int, nbytes: int) -> torch.Tensor:
    """uint8 [nbytes] at `segment[off:]`, with a storage of its own that holds `segment` alive."""
    if segment.device.type != "cpu":
        return segment[off:off + nbytes]  # no per-block storage off the CPU: a view of the segment
    return torch.from_numpy(torch._C.TensorBase.numpy(segment)[off:off + nbytes])


class Arena:
    """First-fit allocator over segments; blocks are (segment, offset, nbytes)."""

    def __init__(self, device="cpu", name="pool"):
        self.device = torch.device(device)
        self.name = name
        self.segments: list[torch.Tensor] = []
        self.free: list[list[tuple[int, int]]] = []  # per segment: sorted (offset, nbytes)
        self.live: dict[tuple[int, int], int] = {}  # (segment, offset) -> nbytes
        self._largest: dict[tuple[int, int], int] = {}  # (segment, offset) -> largest nbytes taken there
        # Graphs captured into this arena and still alive. When the last one goes, the arena is
        # `released`: CUDA's allocator asserts `use_count > 0` on a capture into such a pool while
        # any of its memory is in use, and the tape refuses every such capture (stricter than CUDA
        # only where the allocator had found the whole pool free; a runner takes a new pool).
        self.users = 0
        self.released = False

    def add_user(self) -> None:
        self.users += 1

    def drop_user(self) -> None:
        self.users -= 1
        self.released = self.users == 0

    def _new_segment(self, nbytes: int) -> int:
        size = max(SEGMENT, -(-nbytes // ALIGN) * ALIGN)
        self.segments.append(torch.zeros(size, dtype=torch.uint8, device=self.device))
        self.free.append([(0, size)])
        return len(self.segments) - 1

    def alloc(self, nbytes: int) -> tuple[int, int]:
        need = max(ALIGN, -(-nbytes // ALIGN) * ALIGN)
        for seg, spans in enumerate(self.free):
            for i, (off, n) in enumerate(spans):
                if n >= need:
                    spans[i:i + 1] = [(off + need, n - need)] if n > need else []
                    return self._take(seg, off, need)
        seg = self._new_segment(need)
        off, n = self.free[seg][0]
        self.free[seg] = [(off + need, n - need)] if n > need else []
        return self._take(seg, off, need)

    def _take(self, seg: int, off: int, n: int) -> tuple[int, int]:
        self.live[(seg, off)] = n
        if n > self._largest.get((seg, off), 0):
            self._largest[(seg, off)] = n
        return seg, off

    def release(self, block: tuple[int, int]) -> None:
        n = self.live.pop(block, None)
        if n is None:
            return
        seg, off = block
        spans = self.free[seg]
        spans.append((off, n))
        spans.sort()
        merged: list[tuple[int, int]] = []
        for o, m in spans:
            if merged and merged[-1][0] + merged[-1][1] == o:
                merged[-1] = (merged[-1][0], merged[-1][1] + m)
            else:
                merged.append((o, m))
        self.free[seg] = merged

    def tensor(self, block, shape, stride, dtype, storage_offset=0) -> torch.Tensor:
        seg, off = block
        itemsize = dtype.itemsize
        nbytes = self.live.get(block) or _storage_nbytes(shape, stride, itemsize)
        flat = _block_bytes(self.segments[seg], off, nbytes)
        flat = flat[: (flat.numel() // itemsize) * itemsize].view(dtype)
        return flat.as_strided(shape, stride, storage_offset)

    def empty_like_strided(self, shape, stride, dtype) -> tuple[torch.Tensor, tuple[int, int]]:
        itemsize = dtype.itemsize
        block = self.alloc(_storage_nbytes(shape, stride, itemsize))
        return self.tensor(block, shape, stride, dtype), block

    def span_of(self, block, nbytes: int | None = None) -> tuple[int, int]:
        """(start address, end address) of a block, for alias maps. Give `nbytes` (the size the
        block had when taken) for a block that may have been released: its offset may since have
        been handed out again with another size. Without it: the live size, else the largest ever."""
        seg, off = block
        base = self.segments[seg].data_ptr()
        n = nbytes or self.live.get(block) or self._largest.get(block, 0)
        return base + off, base + off + n
