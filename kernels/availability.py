"""Whether the providers that need an optional package can run here: `triton` and `vllm_xpu`
(FLA's check is GDN's own, `kernels/gdn/fla.py`). The op folders' provider tables name these; none
imports the package it asks about unless it is installed, so `import kernels` works without them.
"""
from __future__ import annotations

import functools
import importlib
import importlib.util
import os

import torch

from kernels.vllm_xpu_ops import EXTENSIONS, WHEEL, WHEEL_VERSION


def interpreting() -> bool:
    """Triton's CPU interpreter is on (`TRITON_INTERPRET=1`): tests run the kernels without a GPU."""
    return os.environ.get("TRITON_INTERPRET") == "1"


@functools.lru_cache(maxsize=None)
def triton() -> tuple[bool, str]:
    """Our Triton kernels (`kernels/<op>/triton.py`) need triton and a CUDA device, or the interpreter
    (slow, for testing). Select them with `REPRO_KERNELS=all=triton`; the default stays `torch`."""
    if importlib.util.find_spec("triton") is None:
        return False, "triton is not installed"
    if interpreting():
        return True, "Triton interpreter (TRITON_INTERPRET=1): CPU, slow, for testing"
    if not torch.cuda.is_available():
        return False, "needs an NVIDIA GPU (CUDA)"
    return True, "triton imports and a CUDA device is present"


@functools.lru_cache(maxsize=None)
def vllm_xpu() -> tuple[bool, str]:
    """The wheel's extensions import only with torch >= 2.13 (they need a libc10 constructor,
    `c10::NotImplementedError(SourceLocation, std::string)`, first exported there) and only on an
    XPU stack (tox cell `torch213-xpu` is where they load)."""
    if importlib.util.find_spec("vllm_xpu_kernels") is None:
        return False, f"{WHEEL} is not installed"
    if not (hasattr(torch, "xpu") and torch.xpu.is_available()):
        return False, "needs an XPU device"
    try:
        for name in EXTENSIONS:
            importlib.import_module(name)
    except Exception as e:
        return False, (f"{WHEEL} does not import: {type(e).__name__}: {e} "
                       f"({WHEEL} {WHEEL_VERSION} needs torch >= 2.13 +xpu)")
    return True, f"{WHEEL} imports"
