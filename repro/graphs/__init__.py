"""Graph providers: one interface, chosen at run time.

A provider has `name`, `device`, `supports_streams`, `new_pool()`, `capture(fn, pool, stream)`
-> (graph with `.replay()`, outputs), `release(graph, tensors)` / `release_all_but(graph, keep)`
(pool bookkeeping after capture), `escape()` (a context whose work the capture does not
follow) and `synchronize()`.
"""
from __future__ import annotations

import torch

from ..errors import BadInput
from .device import cuda_provider, xpu_provider
from .tape import CaptureError, TapeProvider

DEVICES = ("auto", "cpu", "cuda", "xpu")


def resolve_device(device: str = "auto") -> str:
    if device not in DEVICES and not device.startswith(("cuda:", "xpu:")):
        raise BadInput(f"unknown device {device!r} (choose from {', '.join(DEVICES)})")
    if device != "auto":
        return device
    if torch.cuda.is_available():
        return "cuda"
    xpu = getattr(torch, "xpu", None)
    if xpu is not None and xpu.is_available():
        return "xpu"
    return "cpu"


def make_provider(device: str = "auto"):
    device = resolve_device(device)
    kind, _, idx = device.partition(":")
    index = int(idx or 0)
    if kind == "cpu":
        return TapeProvider("cpu")
    if kind == "cuda":
        return cuda_provider(index)
    return xpu_provider(index)


__all__ = ["make_provider", "resolve_device", "CaptureError", "TapeProvider", "DEVICES"]
