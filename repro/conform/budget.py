"""How much a conformance run draws (`repro conform --cases/--sequences`); apart from `run.py` so the
command line reads its defaults without importing the families."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Budget:
    cases: int = 300  # runner configurations of the dispatch family
    # request sequences for each (K, block size) of the step families (3x for the input batch); 72 puts
    # every family of each release over 10,000 calls
    sequences: int = 72
