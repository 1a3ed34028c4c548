"""`repro env` from its typed config: the environment as text or JSON (`repro.env.environment`)."""
from __future__ import annotations

import json
from dataclasses import dataclass

from ..env import environment, format_env
from ..io import emit


@dataclass(frozen=True)
class EnvConfig:
    """What `repro env` needs."""

    json: bool = False  # JSON instead of text


def env_command(c: EnvConfig) -> int:
    """`repro env`: print the environment; always 0."""
    d = environment()
    emit(json.dumps(d, indent=2) if c.json else format_env(d))
    return 0
