"""`repro env`: what this machine offers - torch build, devices, graph providers, collectives, packages.

Every optional import is lazy and guarded: collecting the environment never fails.
"""
from __future__ import annotations

import importlib
import importlib.metadata as md
import importlib.util
import platform
import sys
from pathlib import Path

import torch

from .graphs.device import is_ipex, qualified_name

# import name -> distribution names to ask for a version (first found wins)
OPTIONAL = {
    "intel_extension_for_pytorch": ("intel-extension-for-pytorch", "intel_extension_for_pytorch"),
    "oneccl_bindings_for_pytorch": ("oneccl-bind-pt", "oneccl_bind_pt", "oneccl_bindings_for_pytorch"),
    "triton": ("triton", "pytorch-triton-xpu", "pytorch-triton"),
    "fla": ("flash-linear-attention", "fla-core"),
    "vllm_xpu_kernels": ("vllm-xpu-kernels", "vllm_xpu_kernels"),
    "safetensors": ("safetensors",),
    "hypothesis": ("hypothesis",),
    "numpy": ("numpy",),
}
ABSENT = "absent"
KERNELS_MARKER = 'PROJECT = "repro-graph-replay"'  # the line `kernels/__init__.py` carries


def _guard(fn, default=None):
    try:
        return fn()
    except Exception:
        return default


def _present(module: str) -> bool:
    return bool(_guard(lambda: importlib.util.find_spec(module) is not None, False))


def _version(module: str) -> str:
    """Installed version of an optional package without importing it, or "absent"."""
    if not _present(module):
        return ABSENT
    for dist in OPTIONAL.get(module, (module,)):
        v = _guard(lambda: md.version(dist))
        if v:
            return v
    mod = _guard(lambda: importlib.import_module(module))
    return str(getattr(mod, "__version__", "unknown")) if mod is not None else "present (import failed)"


def _torch_info() -> dict:
    v = torch.version
    xpu = getattr(v, "xpu", None)
    if getattr(v, "cuda", None):
        build = f"cuda {v.cuda}"
    elif getattr(v, "hip", None):
        build = f"rocm {v.hip}"
    elif xpu:
        build = f"xpu {xpu}"
    elif _guard(lambda: torch.xpu._is_compiled(), False):
        build = "xpu"
    else:
        build = "cpu"
    return {"version": torch.__version__, "build": build, "git_version": getattr(v, "git_version", "unknown"),
            "cuda": getattr(v, "cuda", None), "xpu": xpu}


def _devices() -> dict:
    cuda_ok = bool(_guard(torch.cuda.is_available, False))
    n = _guard(torch.cuda.device_count, 0) if cuda_ok else 0
    cuda = {"available": cuda_ok, "count": n,
            "names": [_guard(lambda i=i: torch.cuda.get_device_name(i), "?") for i in range(n)]}
    xpu_mod = getattr(torch, "xpu", None)
    xpu_ok = bool(xpu_mod is not None and _guard(xpu_mod.is_available, False))
    m = _guard(xpu_mod.device_count, 0) if xpu_ok else 0
    xpu = {"available": xpu_ok, "count": m,
           "names": [_guard(lambda i=i: xpu_mod.get_device_name(i), "?") for i in range(m)]}
    return {"cuda": cuda, "xpu": xpu}


def _graph_providers(devices: dict) -> dict:
    """provider -> {"available": bool, "detail": str, "graph_class": module-qualified name or None}.

    IPEX is imported first, as a run on an IPEX stack does: IPEX 2.6.10/2.7.10 install their own
    `XPUGraph` as `torch.xpu.XPUGraph` when imported, so the class found there afterwards is named
    by where it is defined, which is the one that runs."""
    out = {}
    cuda_graph = hasattr(torch.cuda, "CUDAGraph")
    out["cuda"] = {"available": devices["cuda"]["available"] and cuda_graph,
                   "detail": "torch.cuda.CUDAGraph" if devices["cuda"]["available"] else "no CUDA device",
                   "graph_class": qualified_name(torch.cuda.CUDAGraph) if cuda_graph else None}
    ipex = _ipex_graph(devices["xpu"]["available"])
    out["xpu"] = _xpu_graph(devices["xpu"]["available"])
    out["ipex-xpu"] = ipex
    out["cpu-tape"] = {"available": True, "detail": "TorchDispatchMode emulation (always)", "graph_class": None}
    return out


def _xpu_graph(xpu_ok: bool) -> dict:
    xpu_mod = getattr(torch, "xpu", None)
    cls = getattr(xpu_mod, "XPUGraph", None) if xpu_mod is not None else None
    if cls is None:
        return {"available": False, "detail": f"torch {torch.__version__} has no torch.xpu.XPUGraph", "graph_class": None}
    name = qualified_name(cls)
    runs_as = " (IPEX's, installed by its import: runs as provider ipex-xpu)" if is_ipex(cls) else ""
    detail = f"torch.xpu.XPUGraph is {name}{runs_as}"
    if not xpu_ok:
        detail += ", no XPU device"
    return {"available": bool(xpu_ok) and not is_ipex(cls), "detail": detail, "graph_class": name}


def _ipex_graph(xpu_ok: bool) -> dict:
    if not _present("intel_extension_for_pytorch"):
        return {"available": False, "detail": "intel_extension_for_pytorch absent", "graph_class": None}
    ipex = _guard(lambda: importlib.import_module("intel_extension_for_pytorch"))
    if ipex is None:
        return {"available": False, "detail": "intel_extension_for_pytorch present but failed to import",
                "graph_class": None}
    ver = str(getattr(ipex, "__version__", _version("intel_extension_for_pytorch")))
    cls = _guard(lambda: ipex.xpu.XPUGraph)
    if cls is None:
        return {"available": False, "detail": f"ipex {ver}: no graph support", "graph_class": None}
    name = qualified_name(cls)
    if not xpu_ok:
        return {"available": False, "detail": f"ipex {ver}: {name} present, no XPU device", "graph_class": name}
    return {"available": True, "detail": f"ipex {ver}: {name}", "graph_class": name}


def _distributed() -> dict:
    dist = _guard(lambda: importlib.import_module("torch.distributed"))
    ok = bool(dist is not None and _guard(dist.is_available, False))

    def avail(fn: str) -> bool:
        return bool(ok and _guard(lambda: getattr(dist, fn)(), False))

    ccl = _version("oneccl_bindings_for_pytorch")
    return {"available": ok, "gloo": avail("is_gloo_available"), "nccl": avail("is_nccl_available"),
            "xccl": avail("is_xccl_available"),
            "ccl": ccl if ccl == ABSENT else f"oneccl_bindings_for_pytorch {ccl}"}


class KernelsShadowed(ImportError):
    """`import kernels` finds another package (e.g. Hugging Face's `kernels`) instead of this
    project's. Defined here, not in `kernels`, because that package is the one that is missing."""


def _project_kernels_dir() -> Path:
    return Path(__file__).resolve().parents[1] / "kernels"


def kernels_identity() -> dict:
    """Where `import kernels` leads, without importing it: {"path", "project": whether that
    package is this project's (its `__init__.py` carries the marker), "expected"}."""
    spec = _guard(lambda: importlib.util.find_spec("kernels"))
    origin = getattr(spec, "origin", None) if spec is not None else None
    text = _guard(lambda: Path(origin).read_text(), "") if origin else ""
    return {"path": str(Path(origin).parent) if origin else None, "project": KERNELS_MARKER in (text or ""),
            "expected": str(_project_kernels_dir())}


def project_kernels():
    """Import and return this project's `kernels` package, or raise `KernelsShadowed` with one line
    naming both packages' paths. Call it before `import kernels` anywhere in `repro` would matter:
    the other package would otherwise fail later with an unrelated ImportError."""
    expected = _project_kernels_dir()
    try:
        mod = importlib.import_module("kernels")
    except ImportError as e:
        found = kernels_identity()["path"]
        if found is None or Path(found).resolve() == expected:
            raise
        raise KernelsShadowed(f"`import kernels` found {found} (which fails: {e}), not this project's kernels "
                              f"at {expected}: uninstall the other `kernels` package or put {expected.parent} "
                              "first on sys.path") from e
    if getattr(mod, "PROJECT", None) != "repro-graph-replay":
        found = Path(getattr(mod, "__file__", None) or "?").parent
        raise KernelsShadowed(f"`import kernels` found {found}, not this project's kernels at {expected} "
                              "(Hugging Face's `kernels` package has the same name): uninstall it or put "
                              f"{expected.parent} first on sys.path")
    mod.check_identity()
    return mod


def environment() -> dict:
    """Everything `repro env` reports, as a JSON-serialisable dict."""
    devices = _devices()
    return {
        "python": platform.python_version(),
        "executable": sys.executable,
        "os": _guard(platform.platform, "unknown"),
        "torch": _torch_info(),
        "devices": devices,
        "graph_providers": _graph_providers(devices),
        "distributed": _distributed(),
        "packages": {name: _version(name) for name in OPTIONAL},
        "kernels": kernels_identity(),
    }


def format_env(d: dict) -> str:
    """Readable plain text of `environment()`."""
    t, dev = d["torch"], d["devices"]
    lines = [
        f"python      {d['python']} ({d['os']})",
        f"torch       {t['version']} build {t['build']} (git {t['git_version']})",
    ]
    for kind in ("cuda", "xpu"):
        x = dev[kind]
        names = ", ".join(x["names"]) if x["names"] else "-"
        lines.append(f"{kind:<11} {'available' if x['available'] else 'not available'}; {x['count']} device(s): {names}")
    lines.append("graphs")
    for name, g in d["graph_providers"].items():
        lines.append(f"  {name:<10} {'yes' if g['available'] else 'no '}  {g['detail']}")
    ds = d["distributed"]
    yn = lambda b: "yes" if b else "no"
    lines.append(f"distributed gloo {yn(ds['gloo'])}, nccl {yn(ds['nccl'])}, xccl {yn(ds['xccl'])}, ccl {ds['ccl']}")
    lines.append("packages")
    for name, v in d["packages"].items():
        lines.append(f"  {name:<29} {v}")
    k = d.get("kernels") or {}
    if k:
        which = "this project's" if k.get("project") else f"NOT this project's (expected {k.get('expected')})"
        lines.append(f"kernels     {k.get('path')} ({which})")
    return "\n".join(lines)
