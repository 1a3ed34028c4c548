"""The step's output flags in one kernel (`repro/outflags.py`) say exactly what the per-tensor
flags say (`stepcheck.differs`), for every dtype, shape and single-bit change, and pairs the kernel
cannot take keep the per-tensor path. On a CUDA GPU with Triton; on the CPU only under Triton's
interpreter (TRITON_INTERPRET=1 with triton importable), where the same kernel runs on CPU tensors,
but not with triton 3.6 and numpy 2.4 (the interpreter takes the kernel's loop bound, a loaded value,
with `int()` of a one-element array, which numpy 2.4 refuses: three tests fail there, checked
2026-12-02), so the GPU is where these run."""
import importlib.util
import os

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from repro import outflags
from repro.stepcheck import StepCheck

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


def _verdicts(a, b):
    fast, slow = StepCheck(outflags=True), StepCheck(outflags=False)
    pending = fast.launch(a, b, {}, {})
    used = [item for item in pending[1] if item[0] == "outs"]
    return fast.read(pending).outputs, slow.read(slow.launch(a, b, {}, {})).outputs, used


@needs_kernel
@settings(max_examples=40 if _device() == "cuda" else 8, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(DTYPES), st.integers(1, 3000), st.booleans(),
                          st.integers(0, 10 ** 6), st.integers(0, 63), st.integers(0, 3)),
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
        if shape == 1 and n > 1:  # a column slice: not contiguous, the per-tensor path
            x = _tensor(dtype, 2 * n, gen, device).view(n, 2)[:, 0]
        elif shape == 2 and n > 2:  # a view one element in: misaligned for 2-byte and 1-byte dtypes
            x = _tensor(dtype, n + 1, gen, device)[1:]
        y = x.clone()  # contiguous and aligned whatever x is
        if change:
            _flip(y, where % y.numel(), bit % (8 * x.element_size() if dtype != torch.bool else 1))
            expect.add(key)
        a[key], b[key] = x, y
    fast, slow, used = _verdicts(a, b)
    assert fast == slow and set(fast) == expect
    assert used or all(not outflags.eligible(a[k], b[k]) for k in a)


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
