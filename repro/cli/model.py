"""`repro make-tiny` and `repro inspect`: argparse values to the model library's configs."""
from __future__ import annotations

from pathlib import Path


def make_tiny(a) -> int:
    from ..model.tiny import MakeTinyConfig, make_tiny_command
    return make_tiny_command(MakeTinyConfig(Path(a.dir), seed=a.seed, preset=a.preset, quantised=a.quantised,
                                            naming=a.naming, experts=a.experts, shards=a.shards))


def inspect(a) -> int:
    from ..model.inspect import InspectConfig, inspect_command
    return inspect_command(InspectConfig(Path(a.model), json=a.json))
