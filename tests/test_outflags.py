"""The step's output flags in one kernel (`repro/check/outflags.py`) say exactly what the per-tensor
flags say (`stepcheck.differs`), for every dtype, shape, column slice and single-bit change, and
pairs the kernel cannot take keep the per-tensor path. The kernel runs on a CUDA GPU with Triton;
on the CPU under Triton's interpreter (TRITON_INTERPRET=1 with triton importable), where the same
kernel runs on CPU tensors. The interpreter needs numpy < 2.4 (with 2.4 it takes the kernel's loop
bound, a loaded value, with `int()` of a one-element array, which 2.4 refuses): with triton 3.6.0
and numpy 2.3 every test here passed on 2026-12-02. The table rows themselves are checked on the
CPU with no kernel."""
import importlib.util
import os

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from repro.check import outflags
from repro.check.stepcheck import StepCheck

INTERPRETER = os.environ.get("TRITON_INTERPRET") == "1" and importlib.util.find_spec("triton") is not None


def _device():
    if torch.cuda.is_available() and importlib.util.find_spec("triton") is not None:
        return "cuda"
    return "cpu" if INTERPRETER else None


needs_kernel = pytest.mark.skipif(_device() is None, reason="needs an NVIDIA GPU with triton, or Triton's "
                                                            "interpreter (TRITON_INTERPRET=1) on the CPU")

DTYPES = [torch.bfloat16, torch.float32, torch.int64, torch.int32, torch.bool, torch.int8, torch.float16]


def _tensor(dtype, n, gen, device):
    if dtype == torch.bool:
        return (torch.rand(n, generator=gen) > 0.5).to(device)
    if dtype.is_floating_point:
        return torch.randn(n, generator=gen).to(dtype).to(device)
    return torch.randint(-100, 100, (n,), generator=gen).to(dtype).to(device)


def _flip(t: torch.Tensor, index: int, bit: int) -> None:
    """Flip one bit of element `index` (through the byte view: any dtype)."""
    b = t.view(-1).view(torch.uint8)
    pos = index * t.element_size() + bit // 8
    b[pos] ^= 1 << (bit % 8)


def _split_shape(n: int) -> tuple[int, int]:
    """[rows, w] with rows * w == n, rows > 1 where n has a divisor that allows it."""
    rows = next((r for r in (4, 3, 2) if n % r == 0), 1)
    return rows, n // rows


def _covered(t: torch.Tensor, row) -> bytes:
    """The bytes a table row (`outflags.entry`) names for its first tensor, read from the storage."""
    ptr, _, words, rows, stride, _ = row
    store = torch.empty(0, dtype=torch.uint8).set_(t.untyped_storage()).numpy().tobytes()
    start = ptr - t.untyped_storage().data_ptr()
    return b"".join(store[start + 4 * r * stride:start + 4 * (r * stride + words)] for r in range(rows))


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(DTYPES), st.integers(1, 40), st.integers(1, 5), st.integers(0, 7), st.integers(0, 6),
       st.sampled_from(["contiguous", "columns", "heads", "offset", "transposed", "contiguous-vs-columns"]))
def test_a_table_row_names_exactly_the_tensors_bytes(dtype, w, rows, start, extra, form):
    """CPU, no kernel: every pair `entry` accepts is addressed byte for byte (rows of whole words
    at their strides, in element order); the pairs it refuses are the ones the words cannot tile."""
    gen = torch.Generator().manual_seed(w * 1000 + rows * 10 + start)
    base = _tensor(dtype, rows * (2 * w + start + extra) + 8, gen, "cpu")
    if form == "contiguous":
        x = base[:rows * w].view(rows, w)
    elif form in ("columns", "contiguous-vs-columns"):
        x = base[:rows * (w + start + extra)].view(rows, w + start + extra)[:, start:start + w]
    elif form == "heads":
        x = base[:rows * (2 * w + start)].view(rows, 2 * w + start)[:, start:start + 2 * w].view(rows, w, 2)
    elif form == "offset":
        x = base[start:start + rows * w].view(rows, w)
    else:
        x = base[:rows * w].view(w, rows).t()
    y = x.contiguous() if form == "contiguous-vs-columns" else x.clone() if form != "transposed" else x
    row = outflags.entry(x, y)
    size = x.element_size()
    whole = x.is_contiguous() and x.numel() * size % 4 == 0
    runs = x.dim() > 1 and x[0].is_contiguous() and x[0].numel() * size % 4 == 0 and x.stride(0) * size % 4 == 0
    assert (row is not None) == (x.data_ptr() % 4 == 0 and (whole or runs))
    if row is None:
        return
    want = x.contiguous().view(-1).view(torch.uint8).numpy().tobytes()
    assert _covered(x, row) == want
    swapped = (row[1], row[0], row[2], row[3], row[5], row[4])
    assert _covered(y, swapped) == want


def _verdicts(a, b):
    fast, slow = StepCheck(outflags=True), StepCheck(outflags=False)
    pending = fast.launch(a, b, {}, {})
    used = [item for item in pending[1] if item[0] == "outs"]
    return fast.read(pending).outputs, slow.read(slow.launch(a, b, {}, {})).outputs, used


@needs_kernel
@settings(max_examples=40 if _device() == "cuda" else 8, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(DTYPES), st.integers(1, 3000), st.booleans(),
                          st.integers(0, 10 ** 6), st.integers(0, 63), st.integers(0, 5)),
                min_size=1, max_size=9),
       st.integers(0, 2 ** 31))
def test_one_kernel_flags_equal_the_per_tensor_flags(specs, seed):
    device = _device()
    gen = torch.Generator().manual_seed(seed)
    islands = ["submod0", "gdn_core", "submod1", "head"]
    a, b, expect = {}, {}, set()
    for j, (dtype, n, change, where, bit, shape) in enumerate(specs):
        key = f"{islands[j % 4]}.t{j}"
        x = _tensor(dtype, n, gen, device)
        if shape == 1 and n > 1:  # one column: rows of one element, whole words only for 4- and 8-byte dtypes
            x = _tensor(dtype, 2 * n, gen, device).view(n, 2)[:, 0]
        elif shape == 2 and n > 2:  # a view one element in: misaligned for 2-byte and 1-byte dtypes
            x = _tensor(dtype, n + 1, gen, device)[1:]
        elif shape == 3 and n > 1:  # columns [c, c + w) of a wider matrix (the in-projection's split outputs)
            rows, w = _split_shape(n)
            x = _tensor(dtype, rows * (w + 6), gen, device).view(rows, w + 6)[:, 4:4 + w]
        elif shape == 4 and n > 3:  # such a slice viewed as [rows, heads, dim] (the GDN core's q, k, v)
            rows, w = _split_shape(n - n % 2)
            x = _tensor(dtype, rows * (w + 2), gen, device).view(rows, w + 2)[:, 2:2 + w].view(rows, w // 2, 2) \
                if w % 2 == 0 else _tensor(dtype, n, gen, device)
        y = x.clone()  # contiguous and aligned whatever x is
        if change:
            _flip(y, where % y.numel(), bit % (8 * x.element_size() if dtype != torch.bool else 1))
            expect.add(key)
        a[key], b[key] = x, y
    fast, slow, used = _verdicts(a, b)
    assert fast == slow and set(fast) == expect
    assert used or all(outflags.entry(a[k], b[k]) is None for k in a)


@needs_kernel
def test_long_outputs_and_the_last_word():
    """Outputs longer than C * BLOCK words (the strided loop), changed at the first and last word."""
    device = _device()
    n = 2 * outflags.C * outflags.BLOCK * 2 + 6  # bf16: words = n / 2, three loop rounds
    x = torch.zeros(n, dtype=torch.bfloat16, device=device)
    for at in (0, n - 1, n // 2):
        y = x.clone()
        y[at] = 1.0
        fast, slow, used = _verdicts({"submod0.x": x, "submod1.y": x.clone()}, {"submod0.x": y, "submod1.y": x})
        assert fast == slow == ["submod0.x"] and used


@needs_kernel
def test_a_second_launch_before_the_read_takes_the_per_tensor_path():
    """The pinned table is rewritten per call: a launch before the previous read must not use it."""
    device = _device()
    x = torch.ones(64, device=device)
    y = x.clone()
    y[3] = 2.0
    check = StepCheck(outflags=True)
    first = check.launch({"submod0.x": x}, {"submod0.x": y}, {}, {})
    second = check.launch({"submod0.x": x}, {"submod0.x": x}, {}, {})
    assert [i[0] for i in first[1]] == ["outs"] and [i[0] for i in second[1]] == ["out"]
    assert check.read(first).outputs == ["submod0.x"] and check.read(second).clean
    assert [i[0] for i in check.launch({"submod0.x": x}, {"submod0.x": y}, {}, {})[1]] == ["outs"]


def test_the_kernel_is_off_on_the_cpu_and_by_switch(monkeypatch):
    """Only CUDA devices use it by default, and REPRO_OUTFLAGS=0 turns it off there too."""
    assert not outflags.wanted(torch.device("cpu"))
    monkeypatch.setenv(outflags.ENV, "0")
    assert not outflags.wanted(torch.device("cuda"))
    x = torch.ones(8)
    pending = StepCheck().launch({"submod0.x": x}, {"submod0.x": x}, {}, {})
    assert [i[0] for i in pending[1]] == ["out"]
