"""Triton helpers the `triton` provider's kernels share (imported lazily: needs triton).

Float order (why these exist): every multiply / add / divide that the reference does as a separate
torch op is done with an explicitly rounded instruction (`mul_rn`, `add_rn`, `div_rn`), so the
compiler cannot contract it into an FMA; exp / log1p are the CUDA math library's (`libdevice`), as
torch's CUDA kernels use. Under `TRITON_INTERPRET=1` they are plain operators (the interpreter has
no libdevice); results then agree with the reference to rounding, not bit for bit.

Also here: the activation quantisation (`_act_scale`, `_quantize`, a row's scale and packed int32
words: shared by the W8A8 GEMV and the MoE experts), `dp4a`, the state-row rules of
`kernels/_state.py` (`_slot`, `_last_claimant`: conv1d and GDN), and the autotuning helpers.
The kernels themselves live in their op's folder: `kernels/<op>/triton.py`.
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
import triton.testing

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"

if INTERPRET:
    @triton.jit
    def _mul(a, b):
        return a * b

    @triton.jit
    def _add(a, b):
        return a + b

    @triton.jit
    def _div(a, b):
        return a / b

    @triton.jit
    def _exp(x):
        return tl.exp(x)

    @triton.jit
    def _log1p(x):
        return tl.log(1.0 + x)

    @triton.jit
    def _rint(x):
        r = tl.floor(x + 0.5)
        tie = (r - x) == 0.5
        odd = (r - 2.0 * tl.floor(r * 0.5)) != 0.0
        return tl.where(tie & odd, r - 1.0, r)
else:
    from triton.language.extra import libdevice

    @triton.jit
    def _mul(a, b):
        return libdevice.mul_rn(a, b)

    @triton.jit
    def _add(a, b):
        return libdevice.add_rn(a, b)

    @triton.jit
    def _div(a, b):
        return libdevice.div_rn(a, b)

    @triton.jit
    def _exp(x):
        return libdevice.exp(x)

    @triton.jit
    def _log1p(x):
        return libdevice.log1p(x)

    @triton.jit
    def _rint(x):
        return libdevice.rint(x)


@triton.jit
def _silu(x):
    """x / (1 + exp(-x)), as kernels/_math.py writes it."""
    return _div(x, _add(1.0, _exp(-x)))


if INTERPRET:
    @triton.jit
    def _over_qmax(amax):
        return amax / 127.0  # torch's CPU kernel divides
else:
    @triton.jit
    def _over_qmax(amax):
        # `amax / QMAX` in quant.py divides a CUDA tensor by a Python float: torch's CUDA kernel then
        # multiplies by the fp32 reciprocal (1.0f / 127.0f), which differs from a true division for
        # about 1 amax in 20. Do the same, so scales (and everything after them) match bit for bit.
        return libdevice.mul_rn(amax, 0.007874015718698502)  # fp32(1 / 127) exactly


@triton.jit
def _act_scale(amax):
    """Per-token activation scale: amax / 127, and 1 where that is 0 (quant.py's rule)."""
    s = _over_qmax(amax)
    return tl.where(s == 0.0, 1.0, s)


@triton.jit
def _quantize(x, scale):
    """clamp(round_half_even(x / scale), -128, 127) as fp32 integers."""
    q = _rint(_div(x, scale))
    return tl.minimum(tl.maximum(q, -128.0), 127.0)


@triton.jit
def _slot(idx, sentinel, S):
    """(valid, slot): the row is real unless idx == sentinel; slot = idx mod S, non-negative."""
    valid = idx != sentinel
    r = tl.where(valid, idx, 0) % S
    return valid, tl.where(r < 0, r + S, r)


if INTERPRET:
    @triton.jit
    def _dp4a(a, b, c):
        """c + the dot product of the 4 signed bytes of a and of b (the interpreter has no PTX)."""
        acc = c
        for i in tl.static_range(4):
            acc += ((a << (24 - 8 * i)) >> 24) * ((b << (24 - 8 * i)) >> 24)
        return acc
else:
    @triton.jit
    def _dp4a(a, b, c):
        """c + the dot product of the 4 signed bytes of a and of b: one `dp4a`, exact in int32."""
        return tl.inline_asm_elementwise("dp4a.s32.s32 $0, $1, $2, $3;", "=r,r,r,r", [a, b, c],
                                         dtype=tl.int32, is_pure=True, pack=1)


@triton.jit
def _pack4(q, BK: tl.constexpr):
    """int32 [BK] of values in [-128, 127] -> int32 [BK // 4] words, byte i of word w = q[4 w + i]
    (the layout of an int8 row read as int32 words on a little-endian GPU). Bits do not overlap,
    so the wrapping sum is an OR."""
    shifts = tl.arange(0, 4) * 8
    return tl.sum((tl.reshape(q, (BK // 4, 4)) & 255) << shifts[None, :], axis=1)


@triton.jit
def _dp4a_acc(words, packed, acc):
    """acc [R, W] += per-word byte products of int32 weight words [R, W] and packed activations [W]."""
    return _dp4a(words, tl.broadcast_to(packed[None, :], words.shape), acc)


def _words(w: torch.Tensor) -> torch.Tensor | None:
    """An int8 weight whose rows are whole int32 words, as int32 words (a view); else None."""
    if w.dtype != torch.int8 or w.shape[-1] % 4 or w.stride(-1) != 1 or w.storage_offset() % 4 or \
            any(st % 4 for st in w.stride()[:-1]):
        return None
    return w.view(torch.int32)


def _np2(n: int) -> int:
    """`triton.next_power_of_2(max(1, n))` in plain Python: Triton 3.6's is a constexpr function
    whose host call costs ~4 us (~40 calls a checked step). Equal for every n >= 0
    (tests/test_triton_launch.py checks it against Triton's where Triton imports)."""
    return 1 << (max(1, int(n)) - 1).bit_length()


def _cdiv(a: int, b: int) -> int:
    """`triton.cdiv(a, b)` (ceiling division) in plain Python, for the same reason as `_np2`."""
    return -(-a // b)


def _quick_bench(kernel_call, quantiles):
    """Autotuning timer: shorter than Triton's default (25 ms warm-up, 100 ms of runs per config)."""
    return triton.testing.do_bench(kernel_call, warmup=5, rep=20, quantiles=quantiles)


def _configs(space, interpret_pick):
    """Autotuning configs; under the interpreter only one (autotuning there is pointless)."""
    if INTERPRET:
        space = [interpret_pick]
    return [triton.Config(kw, num_warps=w, num_stages=st) for kw, w, st in space]

@triton.jit
def _row_scale(row_ptr, KD: tl.constexpr, BK: tl.constexpr):
    """The activation scale of the KD values at row_ptr, read BK at a time (the K loop unrolls)."""
    rk = tl.arange(0, BK)
    amax = tl.zeros((BK,), tl.float32)
    for k0 in tl.static_range(0, KD, BK):
        amax = tl.maximum(amax, tl.abs(tl.load(row_ptr + k0 + rk, mask=(k0 + rk) < KD, other=0.0).to(tl.float32)))
    return _act_scale(tl.max(amax, axis=0))


@triton.jit
def _row_words(row_ptr, k0: tl.constexpr, scale, KD: tl.constexpr, BK: tl.constexpr):
    """Values k0 .. k0 + BK of the row quantised with `scale`, packed into BK / 4 int32 words."""
    rk = tl.arange(0, BK)
    xv = tl.load(row_ptr + k0 + rk, mask=(k0 + rk) < KD, other=0.0).to(tl.float32)
    return _pack4(_quantize(xv, scale).to(tl.int32), BK)

@triton.jit
def _last_claimant(b, slot, valid, idx_ptr, B, S, sentinel, BB: tl.constexpr):
    """Whether row b writes its slot: valid and no later valid row names the same slot."""
    rb = tl.arange(0, BB)
    others = tl.load(idx_ptr + rb, mask=rb < B, other=sentinel).to(tl.int64)
    ov, os_ = _slot(others, sentinel, S)
    later = (rb > b) & (rb < B) & ov & (os_ == slot)
    return valid & (tl.sum(later.to(tl.int32), axis=0) == 0)
