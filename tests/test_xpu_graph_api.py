"""The XPU graph provider held to the graph APIs it calls, on the CPU.

- The provider's calls (`graph_cls()`, `graph_ctx(graph, pool=..., stream=...)`,
  `graph_pool_handle()`) are bound against `inspect.signature` of the real objects: torch's
  `torch.xpu.XPUGraph` / `torch.xpu.graph` where this torch has them, IPEX's where IPEX is
  installed, and always against IPEX 2.6.10/2.7.10's signatures as recorded below.
- IPEX 2.6.10/2.7.10 install their `XPUGraph` as `torch.xpu.XPUGraph` when imported. A fake IPEX
  package that does the same at import shows that `repro env` and the provider then name the
  class that actually runs (module-qualified), not the attribute where it was found.
"""
import contextlib
import importlib
import inspect
import sys
import textwrap

import pytest
import torch

from repro import env
from repro.graphs.device import DeviceGraphProvider, xpu_provider


# IPEX 2.6.10+xpu / 2.7.10+xpu, intel_extension_for_pytorch/xpu/graphs.py (signatures only).
def ipex_graph(xpu_graph, pool=None, stream=None, capture_error_mode="global"):
    """`intel_extension_for_pytorch.xpu.graph.__init__`, without `self`."""


def ipex_xpugraph():
    """`intel_extension_for_pytorch.xpu.XPUGraph()` takes no argument."""


def ipex_graph_pool_handle():
    """`intel_extension_for_pytorch.xpu.graph_pool_handle()`."""


def _signature(obj):
    return inspect.signature(obj)


def spy_provider(ctx_sig, cls_sig, pool_sig):
    """A provider whose graph class, capture context and pool handle only bind their arguments
    to the given signatures (TypeError when a call does not fit) and do nothing else."""
    def ctx(*a, **k):
        ctx_sig.bind(*a, **k)
        return contextlib.nullcontext()

    def cls(*a, **k):
        cls_sig.bind(*a, **k)
        return object()

    def pool(*a, **k):
        pool_sig.bind(*a, **k)
        return "pool"

    return DeviceGraphProvider("xpu", torch.device("cpu"), cls, ctx, pool, None)


def _capture_both_ways(p):
    pool = p.new_pool()
    assert p.capture(lambda: 7, pool)[1] == 7
    assert p.capture(lambda: 8, pool, stream="side")[1] == 8


def test_provider_calls_fit_ipex_26_27_signatures():
    _capture_both_ways(spy_provider(_signature(ipex_graph), _signature(ipex_xpugraph),
                                    _signature(ipex_graph_pool_handle)))


def ipex_graph_without_stream(xpu_graph, pool=None):
    """A deliberately narrower `graph(...)`: the provider's `stream=` does not fit it."""


def test_a_call_that_does_not_fit_fails():
    p = spy_provider(_signature(ipex_graph_without_stream), _signature(ipex_xpugraph),
                     _signature(ipex_graph_pool_handle))
    with pytest.raises(TypeError, match="stream"):
        p.capture(lambda: 1, p.new_pool(), stream="side")


def _torch_xpu_graph_api():
    xpu = getattr(torch, "xpu", None)
    if xpu is None or not all(hasattr(xpu, n) for n in ("XPUGraph", "graph")):
        pytest.skip(f"needs torch >= 2.11 (torch.xpu.XPUGraph and torch.xpu.graph); this is torch {torch.__version__}")
    return xpu


def test_provider_calls_fit_torch_xpu_graph():
    xpu = _torch_xpu_graph_api()
    pool_sig = _signature(getattr(xpu, "graph_pool_handle", ipex_graph_pool_handle))
    _capture_both_ways(spy_provider(_signature(xpu.graph), _signature(xpu.XPUGraph), pool_sig))
    # the CUDA-only knob the runner passes for `escaped-capture` never reaches torch.xpu.graph
    # (a spy bound to a signature without it would raise TypeError if it did)
    def no_mode(xpu_graph, pool=None, stream=None):
        """torch.xpu.graph as if it had no capture_error_mode."""
    p = spy_provider(_signature(no_mode), _signature(xpu.XPUGraph), pool_sig)
    assert p.capture(lambda: 1, p.new_pool(), capture_error_mode="relaxed")[1] == 1


def test_provider_calls_fit_installed_ipex_graph():
    try:
        ipex = importlib.import_module("intel_extension_for_pytorch")
    except Exception as e:
        pytest.skip(f"needs intel-extension-for-pytorch 2.6.10/2.7.10 +xpu ({type(e).__name__}: {e})")
    xpu = getattr(ipex, "xpu", None)
    if xpu is None or not hasattr(xpu, "graph"):
        pytest.skip(f"needs intel-extension-for-pytorch 2.6.10/2.7.10 +xpu with xpu.graph "
                    f"(IPEX {getattr(ipex, '__version__', '?')} has none)")
    _capture_both_ways(spy_provider(_signature(xpu.graph), _signature(xpu.XPUGraph),
                                    _signature(getattr(xpu, "graph_pool_handle", ipex_graph_pool_handle))))


FAKE_IPEX = {
    "__init__.py": """
        import torch
        from . import xpu
        __version__ = "2.7.10+xpu"
        # what IPEX 2.6.10 / 2.7.10 do when imported: their graph API becomes torch.xpu's
        torch.xpu.XPUGraph = xpu.XPUGraph
        torch.xpu.graph = xpu.graph
        torch.xpu.graph_pool_handle = xpu.graph_pool_handle
    """,
    "xpu/__init__.py": "from .graphs import XPUGraph, graph, graph_pool_handle\n",
    "xpu/graphs.py": """
        class XPUGraph:
            def replay(self):
                pass

        class graph:
            def __init__(self, xpu_graph, pool=None, stream=None, capture_error_mode="global"):
                self.xpu_graph = xpu_graph

        def graph_pool_handle():
            return "ipex-pool"
    """,
}
IPEX_CLASS = "intel_extension_for_pytorch.xpu.graphs.XPUGraph"
GRAPH_NAMES = ("XPUGraph", "graph", "graph_pool_handle")


@pytest.fixture
def fake_ipex_on_path(tmp_path, monkeypatch):
    """A fake IPEX package first on sys.path; torch.xpu's graph attributes restored afterwards."""
    xpu = getattr(torch, "xpu", None)
    if xpu is None:
        pytest.skip(f"needs torch.xpu (torch {torch.__version__} has none)")
    saved = {name: getattr(xpu, name) for name in GRAPH_NAMES if hasattr(xpu, name)}
    for rel, text in FAKE_IPEX.items():
        path = tmp_path / "intel_extension_for_pytorch" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(xpu, "is_available", lambda: True)
    yield xpu
    for name in GRAPH_NAMES:
        if name in saved:
            setattr(xpu, name, saved[name])
        elif hasattr(xpu, name):
            delattr(xpu, name)
    for mod in [m for m in sys.modules if m.split(".")[0] == "intel_extension_for_pytorch"]:
        del sys.modules[mod]


def test_provider_names_the_class_that_runs_after_ipex_import(fake_ipex_on_path):
    if hasattr(torch.xpu, "XPUGraph"):  # torch >= 2.11: its own class until IPEX is imported
        before = xpu_provider()
        assert before.name == "xpu" and before.graph_class == "torch.xpu.graphs.XPUGraph"
    importlib.import_module("intel_extension_for_pytorch")
    assert torch.xpu.XPUGraph.__module__ == "intel_extension_for_pytorch.xpu.graphs"  # the simulation took
    after = xpu_provider()
    assert after.name == "ipex-xpu"
    assert after.graph_class == IPEX_CLASS
    assert after.graph_context == "intel_extension_for_pytorch.xpu.graphs.graph"


def test_repro_env_names_the_class_that_runs_on_an_ipex_stack(fake_ipex_on_path):
    devices = {"cuda": {"available": False}, "xpu": {"available": True}}
    rows = env._graph_providers(devices)     # imports IPEX first, as a run on that stack does
    assert rows["xpu"]["graph_class"] == IPEX_CLASS
    assert IPEX_CLASS in rows["xpu"]["detail"] and "ipex-xpu" in rows["xpu"]["detail"]
    assert not rows["xpu"]["available"]      # it runs as ipex-xpu, not as upstream xpu
    assert rows["ipex-xpu"]["available"] and rows["ipex-xpu"]["graph_class"] == IPEX_CLASS
    assert "2.7.10" in rows["ipex-xpu"]["detail"]


def test_repro_env_names_torch_class_without_ipex():
    xpu = _torch_xpu_graph_api()
    rows = env._graph_providers({"cuda": {"available": False}, "xpu": {"available": False}})
    assert rows["xpu"]["graph_class"] == f"{xpu.XPUGraph.__module__}.{xpu.XPUGraph.__qualname__}"
    assert "intel_extension_for_pytorch" not in rows["xpu"]["detail"]
