"""A step's output flags in one Triton launch on a CUDA device.

`stepcheck.differs` costs two kernels and a few tensor views per compared output (`!=`, then
`any`): about twenty launches a checked chain step, each several microseconds of host time. Here
every eligible pair of outputs is one row of a small table, copied to the device in one
non-blocking copy from a pinned buffer, and one kernel compares the pairs word by word: program
(i, c) ORs `a != b` over the words c, c + C, ... (in blocks) of pair i and writes one flag, so pair
i differs exactly when one of its C flags is set.

A table row (`entry`) is (address of a, address of b, 32-bit words a row, rows, a's row stride, b's
row stride, strides in words): a pair's bytes are `rows` runs of `words a row` words, run r at
address + r * stride. A contiguous pair is one run (its byte length a multiple of 4); a pair whose
rows are contiguous runs at a row stride (a column slice of a wider matrix: the in-projection's
split outputs) is one run a row, when a row's bytes and the row stride are whole words. Both
addresses 4-byte aligned; any other pair keeps the per-tensor path.

Words, not elements: a pair of the same shape and dtype differs in some element's bit pattern
exactly when it differs in some byte, so comparing the words that hold exactly its bytes is the
same test as `stepcheck.bits`.

The pinned table is rewritten at every call, so a call must not come before the previous call's
copy has run: `StepCheck` calls it once per step, between two of its reads (each read
synchronises), and falls back to the per-tensor path otherwise.
"""
from __future__ import annotations

import os

import torch

C = 8  # programs per pair (the flags a pair gets)
BLOCK = 1024  # 32-bit words a program compares per iteration
MAX = 64  # pairs per call (a chain step has about ten)
W = 6  # int64 entries a table row
ENV = "REPRO_OUTFLAGS"  # "0": the per-tensor path everywhere (read when a StepCheck first needs it)
_kernel = None


def _build():
    global _kernel
    if _kernel is None:
        import triton
        import triton.language as tl

        @triton.jit
        def _words_differ(table, out, W: tl.constexpr, C: tl.constexpr, BLOCK: tl.constexpr):
            i = tl.program_id(0)
            c = tl.program_id(1)
            a = tl.load(table + W * i).to(tl.pointer_type(tl.int32))
            b = tl.load(table + W * i + 1).to(tl.pointer_type(tl.int32))
            w = tl.load(table + W * i + 2).to(tl.int32)  # a tensor's words fit in 31 bits
            n = w * tl.load(table + W * i + 3).to(tl.int32)
            sa = tl.load(table + W * i + 4)
            sb = tl.load(table + W * i + 5)
            acc = tl.zeros([BLOCK], dtype=tl.int32)
            for s in range(c * BLOCK, n, C * BLOCK):
                o = s + tl.arange(0, BLOCK)
                m = o < n
                r = o // w  # the run (row) of word o, and the word within it
                col = o - r * w
                acc |= (tl.load(a + r * sa + col, mask=m, other=0) !=
                        tl.load(b + r * sb + col, mask=m, other=0)).to(tl.int32)
            tl.store(out + i * C + c, tl.max(acc, axis=0).to(tl.int64))
        _kernel = _words_differ
    return _kernel


def wanted(device: torch.device) -> bool:
    """Use the kernel on `device`: a CUDA device, Triton importable, not switched off by `ENV`."""
    if device.type != "cuda" or os.environ.get(ENV) == "0":
        return False
    from kernels.availability import triton
    return triton()[0]


def layout(t: torch.Tensor):
    """(words a row, rows, row stride in words) of `t`'s bytes, or None: one run when contiguous,
    else one run a row when every dimension after the first is contiguous within the row."""
    size = t.element_size()
    if t.data_ptr() % 4:
        return None
    if t.is_contiguous():
        n = t.numel() * size
        return (n // 4, 1, 0) if n % 4 == 0 else None
    if t.dim() < 2 or not t[0].is_contiguous():
        return None
    row, stride = t[0].numel() * size, t.stride(0) * size
    return (row // 4, t.shape[0], stride // 4) if row % 4 == 0 and stride % 4 == 0 else None


def entry(a: torch.Tensor, b: torch.Tensor):
    """The pair's table row, or None when the kernel cannot take it (same shape and dtype is the
    caller's). Rows of equal length: a contiguous tensor paired with a strided one is taken as rows."""
    la, lb = layout(a), layout(b)
    if la is None or lb is None:
        return None
    if la[1] != lb[1]:  # one is a single run: take it as rows too, when its rows are whole words
        la, lb = (_rows(a) if la[1] == 1 else la), (_rows(b) if lb[1] == 1 else lb)
        if la is None or lb is None:
            return None
    return (a.data_ptr(), b.data_ptr(), la[0], la[1], la[2], lb[2])


def _rows(t: torch.Tensor):
    """A contiguous tensor of two or more dims as one run a row (rows of whole words), or None."""
    if t.dim() < 2:
        return None
    row = t[0].numel() * t.element_size()
    return (row // 4, t.shape[0], row // 4) if row % 4 == 0 else None


class OutputFlags:
    """The table, its pinned host copy and the flag buffer of one device, reused every call."""

    def __init__(self, device: torch.device):
        self.device = torch.device(device)
        host = torch.zeros(W * MAX, dtype=torch.int64)
        self.host = host.pin_memory() if self.device.type == "cuda" else host
        self.rows = self.host.numpy()
        self.table = torch.zeros(W * MAX, dtype=torch.int64, device=self.device)
        self.out = torch.zeros(MAX * C, dtype=torch.int64, device=self.device)

    def __call__(self, entries: list) -> torch.Tensor:
        """[len(entries) * C] int64 on the device: pair i (its table row `entry(a, b)`) differs iff
        one of entries iC..iC+C-1 is nonzero. At most MAX pairs."""
        from kernels.triton_launch import launch
        n = len(entries)
        rows = self.rows
        for i, e in enumerate(entries):
            rows[W * i:W * i + W] = e
        self.table[:W * n].copy_(self.host[:W * n], non_blocking=True)
        launch(_build(), (n, C), self.table, self.out, W=W, C=C, BLOCK=BLOCK)
        return self.out[:n * C]
