"""A step's output flags in one Triton launch on a CUDA device (issue 19).

`stepcheck.differs` costs two kernels and a few tensor views per compared output (`!=`, then
`any`): about twenty launches a checked chain step, each several microseconds of host time. Here
every eligible pair of outputs is one row of a small table of (address of a, address of b, length
in 32-bit words), copied to the device in one non-blocking copy from a pinned buffer, and one
kernel compares the pairs word by word: program (i, c) ORs `a != b` over the words c, c + C, ...
(in blocks) of pair i and writes one flag, so pair i differs exactly when one of its C flags is set.

Words, not elements: a pair of the same shape and dtype differs in some element's bit pattern
exactly when it differs in some byte, so comparing 32-bit words is the same test as
`stepcheck.bits`. A pair is eligible when both tensors are contiguous, their byte length is a
multiple of 4 and both addresses are 4-byte aligned; any other pair keeps the per-tensor path.

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
ENV = "REPRO_OUTFLAGS"  # "0": the per-tensor path everywhere (read when a StepCheck first needs it)
_kernel = None


def _build():
    global _kernel
    if _kernel is None:
        import triton
        import triton.language as tl

        @triton.jit
        def _words_differ(table, out, C: tl.constexpr, BLOCK: tl.constexpr):
            i = tl.program_id(0)
            c = tl.program_id(1)
            a = tl.load(table + 3 * i).to(tl.pointer_type(tl.int32))
            b = tl.load(table + 3 * i + 1).to(tl.pointer_type(tl.int32))
            n = tl.load(table + 3 * i + 2)
            acc = tl.zeros([BLOCK], dtype=tl.int32)
            for s in range(c * BLOCK, n, C * BLOCK):
                o = s + tl.arange(0, BLOCK)
                m = o < n
                acc |= (tl.load(a + o, mask=m, other=0) != tl.load(b + o, mask=m, other=0)).to(tl.int32)
            tl.store(out + i * C + c, tl.max(acc, axis=0).to(tl.int64))
        _kernel = _words_differ
    return _kernel


def wanted(device: torch.device) -> bool:
    """Use the kernel on `device`: a CUDA device, Triton importable, not switched off by `ENV`."""
    if device.type != "cuda" or os.environ.get(ENV) == "0":
        return False
    from kernels.triton_provider import available
    return available()[0]


def eligible(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Both contiguous, a whole number of 32-bit words, both 4-byte aligned (same shape and dtype
    is the caller's)."""
    return a.is_contiguous() and b.is_contiguous() and (a.numel() * a.element_size()) % 4 == 0 \
        and a.data_ptr() % 4 == 0 and b.data_ptr() % 4 == 0


class OutputFlags:
    """The table, its pinned host copy and the flag buffer of one device, reused every call."""

    def __init__(self, device: torch.device):
        self.device = torch.device(device)
        host = torch.zeros(3 * MAX, dtype=torch.int64)
        self.host = host.pin_memory() if self.device.type == "cuda" else host
        self.rows = self.host.numpy()
        self.table = torch.zeros(3 * MAX, dtype=torch.int64, device=self.device)
        self.out = torch.zeros(MAX * C, dtype=torch.int64, device=self.device)

    def __call__(self, pairs: list) -> torch.Tensor:
        """[len(pairs) * C] int64 on the device: pair i differs iff one of entries iC..iC+C-1 is
        nonzero. At most MAX eligible pairs."""
        from kernels.triton_launch import launch
        n = len(pairs)
        rows = self.rows
        for i, (a, b) in enumerate(pairs):
            rows[3 * i] = a.data_ptr()
            rows[3 * i + 1] = b.data_ptr()
            rows[3 * i + 2] = a.numel() * a.element_size() // 4
        self.table[:3 * n].copy_(self.host[:3 * n], non_blocking=True)
        launch(_build(), (n, C), self.table, self.out, C=C, BLOCK=BLOCK)
        return self.out[:n * C]
