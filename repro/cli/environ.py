"""Every environment variable `repro` reads (outside `kernels`, which reads its own selection at
import), read here at the edge and handed inward as plain values in the commands' configs."""
from __future__ import annotations

import os
from pathlib import Path

from ..errors import BadInput

CACHE_ENV = "REPRO_CACHE"  # the cache directory (default ~/.cache/repro)
KILL_ENV = "REPRO_FORCED_COMM_KILL"  # rank:step[:hang], a test hook of the forced_comm supervisor
BACKEND_ENV = "REPRO_COMM_BACKEND"  # gloo | nccl | xccl | ccl: the forced_comm process-group backend
PLUGINS_ENV = "REPRO_PLUGINS"  # read by `kernels` at import; named here only in an error message


def cache(environ=os.environ) -> Path | None:
    """`$REPRO_CACHE`; None when unset or empty (the library's default, ~/.cache/repro)."""
    v = environ.get(CACHE_ENV)
    return Path(v).expanduser() if v else None


def parse_kill(value: str | None):
    """`$REPRO_FORCED_COMM_KILL` = rank:step[:kill|hang] -> (rank, step, action), or None."""
    if not value:
        return None
    parts = value.split(":")
    try:
        return (int(parts[0]), int(parts[1]), *(parts[2:3] or ["kill"]))
    except (ValueError, IndexError):
        raise BadInput(f"{KILL_ENV}={value!r}: expected rank:step[:hang]") from None


def kill(environ=os.environ):
    return parse_kill(environ.get(KILL_ENV))


BACKENDS = ("gloo", "nccl", "xccl", "ccl")  # torch.distributed's, and oneCCL's bindings' "ccl"


def comm_backend(environ=os.environ) -> str | None:
    """`$REPRO_COMM_BACKEND`, one of BACKENDS; None when unset or empty (the device's own)."""
    v = environ.get(BACKEND_ENV) or None
    if v is not None and v not in BACKENDS:
        raise BadInput(f"{BACKEND_ENV}={v!r}: not a process-group backend (choose from {', '.join(BACKENDS)})")
    return v


def plugins(environ=os.environ) -> str:
    return environ.get(PLUGINS_ENV, "")
