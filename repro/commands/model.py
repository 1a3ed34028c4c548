"""`repro make-tiny` and `repro inspect` from their typed configs (the checkpoint generator and
the checkpoint's description are `repro.model.tiny` and `repro.model.inspect`)."""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

from ..errors import BadInput
from ..io import check_output_folder, emit
from ..model.config import PRESETS
from ..model.inspect import format_inspect, inspect
from ..model.tiny import make_tiny


@dataclass(frozen=True)
class MakeTinyConfig:
    """What `repro make-tiny` needs (`make_tiny`'s options)."""

    dir: Path
    seed: int = 0
    preset: str = "tiny"
    quantised: str = "production"
    naming: str = "split"
    experts: str = "per_expert"
    shards: int = 1


def make_tiny_command(c: MakeTinyConfig) -> int:
    """`repro make-tiny`: write the checkpoint and say where. Its folder must exist (repro creates
    no folder on the way), and each shard holds at least one of the preset's layers, its embedding
    or its head."""
    check_output_folder(c.dir, "make-tiny")
    units = PRESETS[c.preset].num_hidden_layers + 2 if c.preset in PRESETS else None
    if units is not None and not 1 <= c.shards <= units:
        raise BadInput(f"--shards {c.shards}: out of range 1..{units} (preset {c.preset}: "
                       f"{units - 2} layers, the embedding and the head, at least one a shard)")
    path = make_tiny(c.dir, seed=c.seed, preset=c.preset, quantised=c.quantised, naming=c.naming,
                     experts=c.experts, shards=c.shards)
    emit(f"wrote {path}")
    return 0


@dataclass(frozen=True)
class InspectConfig:
    """What `repro inspect` needs."""

    model: Path
    json: bool = False  # JSON instead of the table


def inspect_command(c: InspectConfig) -> int:
    """`repro inspect`: each problem and warning on stderr, worded as `repro run` words it, then
    the description on stdout; 2 when the checkpoint has problems (what `repro run` refuses)."""
    d = inspect(c.model)
    for p in d["problems"]:
        print(f"repro: error: {p}", file=sys.stderr)
    for w in d["warnings"]:
        print(f"repro: warning: {c.model}: {w}", file=sys.stderr)
    emit(json.dumps(d, indent=2) if c.json else format_inspect(d))
    return 2 if d["problems"] else 0
