"""`env.txt`: this machine (torch build, devices and drivers, packages, OS) and the result's own."""
from __future__ import annotations

import os
import platform
import subprocess
import sys
from ..env import environment, format_env


def _guard(fn, default="?"):
    try:
        return fn()
    except Exception:
        return default


def drivers() -> list[str]:
    import torch
    lines = []
    if _guard(torch.cuda.is_available, False):
        drv = _guard(lambda: subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                            capture_output=True, text=True, timeout=20).stdout.split()[0])
        for i in range(torch.cuda.device_count()):
            pr = torch.cuda.get_device_properties(i)
            lines.append(f"cuda:{i}      {pr.name}, cc {pr.major}.{pr.minor}, {pr.total_memory >> 20} MiB, "
                         f"driver {drv}, CUDA runtime {torch.version.cuda}")
    xpu = getattr(torch, "xpu", None)
    if xpu is not None and _guard(xpu.is_available, False):
        for i in range(xpu.device_count()):
            pr = xpu.get_device_properties(i)
            lines.append(f"xpu:{i}       {getattr(pr, 'name', '?')}, driver {getattr(pr, 'driver_version', '?')}, "
                         f"{getattr(pr, 'total_memory', 0) >> 20} MiB")
    cpu = _guard(lambda: next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                              if line.startswith("model name")), platform.processor() or "?")
    lines.append(f"cpu         {cpu}, {os.cpu_count()} logical cores")
    return lines


def environment_text(doc: dict) -> str:
    lines = ["# Environment of the machine that wrote this report (`repro env`)", "",
             format_env(environment()), "devices and drivers"]
    lines += [f"  {x}" for x in drivers()]
    lines += [f"os          {platform.platform()}", f"python      {sys.version.split()[0]} ({sys.executable})", "",
              "# Where the result was produced (from the result file)",
              f"device      {doc.get('device', '?')}", f"provider    {doc.get('graph_provider', '?')}",
              f"torch       {doc.get('torch', '?')}", f"checkpoint  {doc.get('checkpoint', '?')}"]
    return "\n".join(lines) + "\n"
