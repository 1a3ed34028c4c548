"""`repro make-tiny` and `repro inspect`: argparse values to their typed configs (`repro.commands.model`)."""
from __future__ import annotations

from pathlib import Path


def make_tiny(a) -> int:
    from ..commands.model import MakeTinyConfig, make_tiny_command
    return make_tiny_command(MakeTinyConfig(Path(a.dir), seed=a.seed, preset=a.preset, quantised=a.quantised,
                                            naming=a.naming, experts=a.experts, shards=a.shards))


def inspect(a) -> int:
    from ..commands.model import InspectConfig, inspect_command
    return inspect_command(InspectConfig(Path(a.model), json=a.json))
