"""Device graph providers: CUDA (`torch.cuda.CUDAGraph`), XPU upstream (`torch.xpu.XPUGraph`,
torch >= 2.11) and XPU through IPEX 2.6/2.7 (`intel_extension_for_pytorch.xpu.XPUGraph`).

They share one shape: a pool handle, `capture(fn, pool, stream)` returning (graph, outputs),
`release` turning outputs into weak references whose memory goes back to the pool (what
vLLM does for graph outputs), `synchronize`, and stream helpers. The XPU paths follow the
documented APIs and are kept thin; they were not run here (no Intel GPU was available).
"""
from __future__ import annotations

import contextlib

import torch

from ..errors import DeviceUnavailable
from .refusals import collection_paused


class _WeakCuda:
    """Exposes raw device memory through `__cuda_array_interface__` without owning it."""

    def __init__(self, ptr: int, nbytes: int):
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (ptr, False),
                                         "version": 3, "strides": None}


def weak_alias_cuda(t: torch.Tensor) -> torch.Tensor:
    """A tensor over `t`'s bytes that does not keep them alive (vLLM's `weak_ref_tensor`)."""
    nbytes = t.untyped_storage().nbytes()
    raw = torch.as_tensor(_WeakCuda(t.untyped_storage().data_ptr(), nbytes), device=t.device)
    return raw.view(t.dtype).as_strided(t.shape, t.stride(), t.storage_offset())


def _end_capture(ctx, reraise: bool = False) -> None:
    """End a capture and always give the caller its stream back. torch's graph context leaves its
    capture stream current when `capture_end` raises (a capture the runtime invalidated, e.g. by a
    host sync), and every later kernel of the process then runs on that stream: one refused
    capture would fail the captures after it. `reraise`: raise the ending's own error (the body
    succeeded); otherwise the body's error is the one that propagates."""
    try:
        ctx.__exit__(None, None, None)
    except BaseException:
        stream_ctx = getattr(ctx, "stream_ctx", None)
        if stream_ctx is not None:
            try:
                stream_ctx.__exit__(None, None, None)
            except Exception:  # already exited: nothing left to restore
                pass
        if reraise:
            raise


@contextlib.contextmanager
def _escape(backend, device):
    main = backend.current_stream(device)
    side = backend.Stream(device=device)
    capturing = getattr(backend, "is_current_stream_capturing", lambda: False)()
    if not capturing:
        side.wait_stream(main)
    with backend.stream(side):
        yield
    if not capturing:
        main.wait_stream(side)


class DeviceGraphProvider:
    supports_streams = True

    def __init__(self, name: str, device: torch.device, graph_cls, graph_ctx, pool_handle, backend):
        self.name = name
        self.device = device
        self._graph_cls = graph_cls
        self._graph_ctx = graph_ctx
        self._pool_handle = pool_handle
        self.backend = backend  # torch.cuda or torch.xpu

    def new_pool(self, name="pool"):
        return self._pool_handle()

    def capture(self, fn, pool, stream=None, capture_error_mode: str | None = None):
        """`capture_error_mode="relaxed"` (CUDA only) makes work on streams the capture does not
        follow legal; it is per capture, so no case's setting leaks into the next."""
        graph = self._graph_cls()
        kw = {"pool": pool}
        if capture_error_mode is not None and self.name == "cuda":
            kw["capture_error_mode"] = capture_error_mode
        if stream is not None:
            kw["stream"] = stream
        ctx = self._graph_ctx(graph, **kw)
        with collection_paused():  # from before capture_begin (inside __enter__) to after capture_end
            return graph, self._captured(ctx, fn)

    @staticmethod
    def _captured(ctx, fn):
        try:
            ctx.__enter__()
        except BaseException:  # capture_begin refused (e.g. a released pool): its stream is current
            stream_ctx = getattr(ctx, "stream_ctx", None)
            if stream_ctx is not None:
                stream_ctx.__exit__(None, None, None)
            raise
        try:
            out = fn()
        except BaseException:
            _end_capture(ctx)
            raise
        _end_capture(ctx, reraise=True)
        return out

    def release(self, graph, tensors):
        """No-op here: the runner replaces its strong references by `weak_alias` itself."""

    def release_all_but(self, graph, keep):
        """Intermediates are freed by the allocator when their last Python reference dies."""

    def written_spans(self, graph) -> list[tuple[int, int]]:
        """Unknown on a device: the pool's internal blocks are not visible from Python. The alias
        map then checks captured outputs against each other only."""
        return []

    def weak_alias(self, t: torch.Tensor) -> torch.Tensor | None:
        if self.device.type == "cuda":
            return weak_alias_cuda(t)
        return None  # no portable weak tensor on XPU: the runner keeps a strong reference

    def escape(self):
        """Issue work on a side stream the capture does not join (its effect is not recorded).
        Outside a capture the side stream is ordered with the current one both ways, as a library
        running on its own queue orders its eager work (oneDNN on a cached queue); inside one it is
        left unjoined, which is the hazard: the capture never sees that work."""
        return _escape(self.backend, self.device)

    def new_stream(self):
        return self.backend.Stream(device=self.device)

    def stream(self, s):
        return self.backend.stream(s) if s is not None else contextlib.nullcontext()

    def current_stream(self):
        return self.backend.current_stream(self.device)

    def new_event(self):
        return self.backend.Event()

    def timed_event(self):
        """An event that can be compared in time with another (`RaceLog.order_device`)."""
        return self.backend.Event(enable_timing=True)

    def synchronize(self) -> None:
        self.backend.synchronize(self.device)


def cuda_provider(index: int = 0) -> DeviceGraphProvider:
    if not torch.cuda.is_available():
        raise DeviceUnavailable("--device cuda: torch.cuda.is_available() is False (no NVIDIA GPU or a CPU build of torch)")
    dev = torch.device("cuda", index)
    return DeviceGraphProvider("cuda", dev, torch.cuda.CUDAGraph, torch.cuda.graph,
                               torch.cuda.graph_pool_handle, torch.cuda)


def qualified_name(obj) -> str:
    """`module.QualName` of a class or function object: where it is defined, not where it is found
    (IPEX 2.6.10/2.7.10 install their `XPUGraph` as `torch.xpu.XPUGraph` when imported)."""
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', getattr(obj, '__name__', '?'))}"


def is_ipex(obj) -> bool:
    return str(getattr(obj, "__module__", "")).split(".")[0] == "intel_extension_for_pytorch"


def _named(provider: DeviceGraphProvider, graph_cls, graph_ctx) -> DeviceGraphProvider:
    provider.graph_class = qualified_name(graph_cls)  # the class that actually runs, for reports
    provider.graph_context = qualified_name(graph_ctx)
    return provider


def xpu_provider(index: int = 0) -> DeviceGraphProvider:
    """`torch.xpu.XPUGraph` (torch >= 2.11), else IPEX 2.6.10/2.7.10's `XPUGraph`. Importing those
    IPEX versions also installs their class as `torch.xpu.XPUGraph`, so the attribute's place says
    nothing: the provider is named by where the class is defined (`ipex-xpu` for IPEX's), and
    `graph_class` gives its module-qualified name."""
    xpu = getattr(torch, "xpu", None)
    if xpu is None or not xpu.is_available():
        raise DeviceUnavailable("--device xpu: torch.xpu.is_available() is False (no Intel GPU or no XPU build of torch)")
    dev = torch.device("xpu", index)
    if hasattr(xpu, "XPUGraph") and hasattr(xpu, "graph"):
        pool = getattr(xpu, "graph_pool_handle", lambda: None)
        name = "ipex-xpu" if is_ipex(xpu.XPUGraph) else "xpu"
        return _named(DeviceGraphProvider(name, dev, xpu.XPUGraph, xpu.graph, pool, xpu), xpu.XPUGraph, xpu.graph)
    try:
        import intel_extension_for_pytorch as ipex
    except Exception as e:  # pragma: no cover - only on XPU stacks
        raise DeviceUnavailable(f"XPU found but this torch has no torch.xpu.XPUGraph and IPEX does not import ({e})")
    ipex_xpu = getattr(ipex, "xpu", None)
    if ipex_xpu is None or not hasattr(ipex_xpu, "XPUGraph"):
        raise DeviceUnavailable(
            f"IPEX {getattr(ipex, '__version__', '?')}: no graph support (IPEX 2.8 removed XPUGraph; "
            "use torch >= 2.11 for torch.xpu.XPUGraph or IPEX 2.6.10/2.7.10)")
    pool = getattr(ipex_xpu, "graph_pool_handle", lambda: None)
    return _named(DeviceGraphProvider("ipex-xpu", dev, ipex_xpu.XPUGraph, ipex_xpu.graph, pool, xpu),
                  ipex_xpu.XPUGraph, ipex_xpu.graph)
