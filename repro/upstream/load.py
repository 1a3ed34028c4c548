"""Which vLLM is installed, and loading its control classes through the module of that release.

`installed()` reads the package metadata only (importing vLLM takes seconds and switches nothing);
`load()` runs the release's module (`v0_33`, `v0_26`: every trick that release needs) once per
process and returns what it loaded. A release without a module here is refused in one line: its
tricks are unknown, and a half-loaded vLLM would judge the mirror wrongly.
"""
from __future__ import annotations

import functools
import importlib.metadata as md
import types

from ..errors import BadInput
from . import v0_26, v0_33

RELEASES = {m.VERSION: m for m in (v0_33, v0_26)}
# What installs each release (README, "Conformance"): the tox environment and its pinned list.
TOX_ENV = {"0.33.0": "vllm033", "0.26.0": "vllm026"}
REQUIREMENTS = {"0.33.0": "requirements/vllm-0.33.txt", "0.26.0": "requirements/vllm-0.26.txt"}


class UpstreamMissing(BadInput):
    """vLLM is not installed, or is a release this seam has no module for."""


def installed() -> str | None:
    """The installed vLLM release (its package metadata), or None."""
    try:
        return md.version("vllm")
    except md.PackageNotFoundError:
        return None


def why_not() -> str | None:
    """Why `load()` would refuse here (one line naming the tox environments), or None."""
    v = installed()
    envs = ", ".join(f"`tox -e {e}`" for e in TOX_ENV.values())
    if v is None:
        return f"vLLM is not installed (its control path runs in {envs})"
    if v not in RELEASES:
        return f"vLLM {v} is installed; the seam knows {', '.join(RELEASES)} ({envs})"
    return None


@functools.lru_cache(maxsize=None)
def load() -> types.SimpleNamespace:
    """vLLM's control modules, loaded by the installed release's module (once a process)."""
    problem = why_not()
    if problem:
        raise UpstreamMissing(problem)
    return RELEASES[installed()].load()
