"""What a device graph capture refuses, and how the CPU tape refuses the same things.

A CUDA capture fails on two kinds of host interaction, with these messages:
- a host sync (`.item()`, `nonzero`, an op whose output shape depends on data, `unique`, a
  boolean-mask index): the runtime refuses the stream synchronisation with
  `cudaErrorStreamCaptureUnsupported`, "operation not permitted when stream is capturing", and
  the capture is then invalidated (`cudaErrorStreamCaptureInvalidated`, "operation failed due to a
  previous error during capture");
- a copy to or from pageable host memory (`.tolist()`, `.cpu()`, `.numpy()`,
  `torch.tensor(data, device=dev)`): PyTorch's copy kernel raises "Cannot copy between CPU and CUDA
  tensors during CUDA graph capture unless the CPU tensor is pinned".

The tape raises `CaptureError` with the same key phrase and a `kind` ("sync" or "host-copy"), so a
test can ask `capture_refusal(exc)` on either device and compare the answers. `CaptureError` is a
`RuntimeError` (what CUDA raises) and a `BadInput` (the CLI's exit 2).

What counts as host memory on the tape, where every tensor is on the CPU (the decision, and why):
- a tensor built from Python data inside the capture (`torch.tensor(list)`, `as_tensor(list)`,
  seen as `aten.lift_fresh` with at least one dimension): code that runs on a device builds it with
  `device=dev`, a pageable host-to-device copy. A 0-dim lift is how a Python scalar enters an index
  or fill op; CUDA passes those by value, so they are allowed;
- the explicit host methods `Tensor.tolist`, `.numpy`, `.cpu`: they never dispatch an op on the
  CPU, so they are patched for the duration of a capture (`host_methods_refused`);
- a copy between tensors on two devices whose CPU side is not pinned (CUDA's own rule; on the CPU
  tape it can only come from code that names a second device).
A tensor created before the capture is a static input (device memory), never host memory: on the
tape nothing tells a host tensor made outside the capture from a device one, so `x.to("cpu")` of
such a tensor is not refused. `escape()` (work the capture does not follow) is exempt, as an
unrecorded side queue is on a device.
"""
from __future__ import annotations

import contextlib
import gc

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

from ..errors import BadInput
from .lint import _tensors

aten = torch.ops.aten

SYNC_PHRASE = "operation not permitted when stream is capturing"
HOST_COPY_PHRASE = ("Cannot copy between CPU and CUDA tensors during CUDA graph capture unless the CPU "
                    "tensor is pinned")
# CUDACachingAllocator's internal assert on a capture into a pool id whose graphs were all released
# while its memory is still in use (torch 2.11: CUDACachingAllocator.cpp:2799).
RELEASED_POOL_PHRASE = "use_count > 0"
# Substrings of a device's capture failures, most specific first (see `capture_refusal`).
_PHRASES = (
    ("released-pool", RELEASED_POOL_PHRASE),
    ("host-copy", "cannot copy between cpu and"),
    ("sync", SYNC_PHRASE),
    ("sync", "cudaerrorstreamcaptureunsupported"),
    ("sync", "cudaerrorstreamcaptureinvalidated"),
    ("sync", "operation failed due to a previous error during capture"),
    ("sync", "stream is capturing"),
    ("sync", "graph capture"),
)

# A host value, or an output shape that depends on data: the host must wait for the device.
SYNC_OPS = {
    aten._local_scalar_dense.default,
    aten.item.default,
    aten.is_nonzero.default,
    aten.equal.default,
    aten.nonzero.default,
    aten.nonzero_numpy.default,
    aten.argwhere.default,
    aten.masked_select.default,
    aten.unique_consecutive.default,
    aten.unique_dim.default,
    aten._unique.default,
    aten._unique2.default,
    aten.bincount.default,
}
# Static only when the caller gives `output_size`.
_SIZED = {aten.repeat_interleave.Tensor, aten.repeat_interleave.self_Tensor}
_MASK_INDEX = {aten.index.Tensor}
_MASK_PUT = {aten.index_put.default, aten.index_put_.default, aten._index_put_impl_.default}
_LIFT = {aten.lift_fresh.default, aten.lift_fresh_copy.default}
_COPIES = {aten.copy_.default, aten._copy_from.default, aten._to_copy.default}


class CaptureError(BadInput, RuntimeError):
    """What a device graph cannot capture. `kind`: "sync", "host-copy" or "released-pool"."""

    def __init__(self, kind: str, what: str, why: str):
        phrase, cuda = {
            "sync": (SYNC_PHRASE, "cudaErrorStreamCaptureUnsupported"),
            "host-copy": (HOST_COPY_PHRASE, "a pageable host copy"),
            "released-pool": (RELEASED_POOL_PHRASE, "CUDACachingAllocator's internal assert"),
        }[kind]
        where = "" if kind == "released-pool" else " inside a captured piece"
        super().__init__(f"{phrase} ({cuda} on CUDA): {what}{where}: {why}")
        self.kind = kind


def capture_refusal(exc: BaseException | None) -> str | None:
    """"sync", "host-copy", "released-pool" or None: what kind of capture failure `exc` is, on the tape or on CUDA.
    The chain is walked (`__cause__`, `__context__`) and the innermost recognised cause wins: CUDA
    reports the invalidated capture last, the refused operation first."""
    found, seen = None, set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        kind = getattr(exc, "kind", None) if isinstance(exc, CaptureError) else None
        if kind is None and isinstance(exc, RuntimeError):
            msg = str(exc).lower()
            kind = next((k for k, p in _PHRASES if p.lower() in msg), None)
        found = kind or found
        exc = exc.__cause__ or exc.__context__
    return found


def _has_mask(indices) -> bool:
    return any(t is not None and t.dtype in (torch.bool, torch.uint8) for t in _tensors(indices))


def _pinned(t: torch.Tensor) -> bool:
    try:
        return t.is_pinned()
    except RuntimeError:  # no accelerator in this build: nothing is pinned
        return False


def _host_side_unpinned(sides) -> bool:
    """`sides`: (device type, pinned) of every tensor a copy touches."""
    devs = {d for d, _ in sides}
    return len(devs) > 1 and any(d == "cpu" and not pinned for d, pinned in sides)


def check(func, args, kwargs) -> None:
    """Raise `CaptureError` if a device capture would refuse `func(*args, **kwargs)`."""
    if func in SYNC_OPS:
        raise CaptureError("sync", str(func), "it needs a host value or a data-dependent output shape "
                           "(move it out of the piece or make it static)")
    if func in _SIZED and kwargs.get("output_size") is None:
        raise CaptureError("sync", str(func), "its output size depends on data unless `output_size` is given")
    if func in _MASK_INDEX and _has_mask(args[1]):
        raise CaptureError("sync", f"{func} with a boolean mask", "a masked gather's shape depends on data "
                           "(nonzero); use torch.where or a static index")
    if func in _MASK_PUT and _has_mask(args[1]):
        values = args[2] if len(args) > 2 else kwargs.get("values")
        if isinstance(values, torch.Tensor) and values.numel() != 1:
            raise CaptureError("sync", f"{func} with a boolean mask", "a masked scatter of a tensor expands "
                               "the mask with nonzero (a scalar fill would be a masked_fill)")
    if func in _LIFT and args and isinstance(args[0], torch.Tensor) and args[0].dim() > 0:
        raise CaptureError("host-copy", "a tensor built from Python data (torch.tensor / as_tensor)",
                           "on a device this is a copy from pageable host memory; build it before capture "
                           "into a static buffer")
    if func in _COPIES:
        sides = [(t.device.type, _pinned(t)) for t in _tensors(list(args))]
        dev = kwargs.get("device")
        if func is aten._to_copy.default and dev is not None:
            sides.append((torch.device(dev).type, bool(kwargs.get("pin_memory"))))
        if _host_side_unpinned(sides):
            raise CaptureError("host-copy", str(func), "a copy between the device and unpinned host memory")


_HOST_METHODS = ("tolist", "numpy", "cpu")


def _capturing(mode_type) -> bool:
    return any(isinstance(m, mode_type) for m in _get_current_dispatch_mode_stack())


@contextlib.contextmanager
def collection_paused():
    """Python's cyclic garbage collector off for the length of a capture. A collection that runs
    inside one (it starts whenever enough objects were allocated, so at no fixed place) can free a
    `CUDAGraph` left in a reference cycle; its destructor's `cudaGraphExecDestroy` is not permitted
    while a stream captures ("operation not permitted when stream is capturing (function reset)"),
    and the capture fails with `cudaErrorStreamCaptureInvalidated`. Seen on an H200 in the state
    machine, whose earlier examples leave runners behind; from torch 2.11, `torch.cuda.graph` does
    not collect before a capture by default. The garbage is freed at the next collection after it."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


@contextlib.contextmanager
def host_methods_refused(mode_type):
    """Patch `Tensor.tolist/numpy/cpu` so that, while a mode of `mode_type` is active (a capture,
    not an `escape()`), they raise `CaptureError`: they read host memory without dispatching an op."""
    saved = {name: vars(torch.Tensor).get(name) for name in _HOST_METHODS}

    def guard(name):
        original = getattr(torch.Tensor, name)

        def method(self, *args, **kwargs):
            if _capturing(mode_type):
                raise CaptureError("host-copy", f"Tensor.{name}()", "it copies device memory to pageable host "
                                   "memory and waits for it")
            return original(self, *args, **kwargs)
        method.__name__ = name
        return method

    for name in _HOST_METHODS:
        setattr(torch.Tensor, name, guard(name))
    try:
        yield
    finally:
        for name, old in saved.items():
            if old is None:
                delattr(torch.Tensor, name)
            else:
                setattr(torch.Tensor, name, old)
