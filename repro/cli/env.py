"""`repro env`: argparse values to `EnvConfig`, then `repro.commands.env.env_command`."""
from __future__ import annotations


def env(a) -> int:
    from ..commands.env import EnvConfig, env_command
    return env_command(EnvConfig(json=a.json))
