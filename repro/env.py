"""`repro env`: what this machine offers - torch build, devices, graph providers, collectives, packages.

Every optional import is lazy and guarded: collecting the environment never fails.
"""
from __future__ import annotations

import importlib
import importlib.metadata as md
import importlib.util
import platform
import sys

import torch

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


def _guard(fn, default=None):
    try:
        return fn()
    except Exception:  # noqa: BLE001 - the environment report must never fail
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
    """provider -> {"available": bool, "detail": str}."""
    out = {}
    cuda_graph = hasattr(torch.cuda, "CUDAGraph")
    out["cuda"] = {"available": devices["cuda"]["available"] and cuda_graph,
                   "detail": "torch.cuda.CUDAGraph" if devices["cuda"]["available"] else "no CUDA device"}
    xpu_mod = getattr(torch, "xpu", None)
    has_api = xpu_mod is not None and hasattr(xpu_mod, "XPUGraph")
    if not has_api:
        detail = f"torch {torch.__version__} has no torch.xpu.XPUGraph"
    elif not devices["xpu"]["available"]:
        detail = "torch.xpu.XPUGraph present, no XPU device"
    else:
        detail = "torch.xpu.XPUGraph"
    out["xpu"] = {"available": has_api and devices["xpu"]["available"], "detail": detail}
    out["ipex-xpu"] = _ipex_graph(devices["xpu"]["available"])
    out["cpu-tape"] = {"available": True, "detail": "TorchDispatchMode emulation (always)"}
    return out


def _ipex_graph(xpu_ok: bool) -> dict:
    if not _present("intel_extension_for_pytorch"):
        return {"available": False, "detail": "intel_extension_for_pytorch absent"}
    ipex = _guard(lambda: importlib.import_module("intel_extension_for_pytorch"))
    if ipex is None:
        return {"available": False, "detail": "intel_extension_for_pytorch present but failed to import"}
    ver = str(getattr(ipex, "__version__", _version("intel_extension_for_pytorch")))
    has_graph = _guard(lambda: hasattr(ipex.xpu, "XPUGraph"), False)
    if not has_graph:
        return {"available": False, "detail": f"ipex {ver}: no graph support"}
    if not xpu_ok:
        return {"available": False, "detail": f"ipex {ver}: XPUGraph present, no XPU device"}
    return {"available": True, "detail": f"ipex {ver}: intel_extension_for_pytorch.xpu.XPUGraph"}


def _distributed() -> dict:
    dist = _guard(lambda: importlib.import_module("torch.distributed"))
    ok = bool(dist is not None and _guard(dist.is_available, False))

    def avail(fn: str) -> bool:
        return bool(ok and _guard(lambda: getattr(dist, fn)(), False))

    ccl = _version("oneccl_bindings_for_pytorch")
    return {"available": ok, "gloo": avail("is_gloo_available"), "nccl": avail("is_nccl_available"),
            "xccl": avail("is_xccl_available"),
            "ccl": ccl if ccl == ABSENT else f"oneccl_bindings_for_pytorch {ccl}"}


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
    yn = lambda b: "yes" if b else "no"  # noqa: E731
    lines.append(f"distributed gloo {yn(ds['gloo'])}, nccl {yn(ds['nccl'])}, xccl {yn(ds['xccl'])}, ccl {ds['ccl']}")
    lines.append("packages")
    for name, v in d["packages"].items():
        lines.append(f"  {name:<29} {v}")
    return "\n".join(lines)
