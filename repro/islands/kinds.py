"""What each island is to a run: how it is checked, which layer it is built from, and the capture
mode and eager families that isolate it. Callers ask these attributes, never compare names.

- `Runs.CHAIN`: the GDN layer's decode chain in lockstep (eager and replay copies with state);
  `submod0`, `submod1` and `gdn_core` are the chain with the other pieces run eagerly, or (the
  splitting op only enters a graph in full mode) the chain in full mode.
- `Runs.ALONE`: the island by itself, one graph per padded size (the MoE block).
- `Runs.RANKS`: a tensor-parallel slice on N ranks with a supervisor (the forced-communication slice).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

from ..errors import BadInput


class Runs(enum.Enum):
    CHAIN = "chain"
    ALONE = "alone"
    RANKS = "ranks"


@dataclass(frozen=True)
class Kind:
    name: str
    runs: Runs
    gdn_layer: bool  # built from a GDN (linear_attention) layer; else any layer (default: layer 0)
    mode: str | None = None  # the one capture mode it is checked in; None: the case's
    eager: frozenset = frozenset()  # families run eagerly around it, so that only it is graphed


KINDS: dict[str, Kind] = {k.name: k for k in (
    Kind("chain", Runs.CHAIN, True),
    Kind("submod0", Runs.CHAIN, True, "piecewise", frozenset({"submod1"})),
    Kind("submod1", Runs.CHAIN, True, "piecewise", frozenset({"submod0"})),
    Kind("gdn_core", Runs.CHAIN, True, "full"),
    Kind("moe", Runs.ALONE, False, "piecewise"),
    Kind("forced_comm", Runs.RANKS, False),
)}
ISLANDS = ("submod0", "gdn_core", "submod1", "moe", "forced_comm")  # what `--island` names


def kind(name: str) -> Kind:
    """The kind of island `name` ("chain" included); unknown names are bad input."""
    if name not in KINDS:
        raise BadInput(f"unknown island {name!r} (choose from all, chain, {', '.join(ISLANDS)})")
    return KINDS[name]
