"""The forced_comm cases: which hazards and repairs one launch runs, planned from the hazard table.

Kept apart from the supervisor and the ranks because both need it: the parent plans and labels
the cases, every rank rebuilds them from the spec it is given (a `CommCase` is plain data, so it
crosses the spawn boundary as two tuples).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..knobs import hazards as hz
from ..islands.forced_comm import comm_mode_for

ISLAND = "forced_comm"


@dataclass(frozen=True)
class CommCase:
    """A case of the shared results layer (`repro.job.results`: island, mode, hazards, repairs,
    expect) whose mode is the replay copy's comm mode, derived from the knobs."""

    hazards: tuple[str, ...] = ()
    repairs: tuple[str, ...] = ()

    @property
    def island(self) -> str:
        return ISLAND

    @property
    def mode(self) -> str:
        """The comm mode (`islands/forced_comm.py`); refuses knobs forced_comm cannot honour."""
        return comm_mode_for(self.hazards, self.repairs)

    @property
    def expect(self) -> str:
        """What a healthy stack gives. comm-graph-then-eager has no repair: clean on gloo/NCCL, and
        a divergence is the upstream bug to report (PyTorch #189403 on XPU)."""
        return hz.expectation(self.hazards, self.repairs)

    def label(self) -> str:
        return ",".join(self.hazards) or "baseline"


def _default_plan() -> list[CommCase]:
    """Baseline, then each of the slice's hazards alone, without and with its first repair."""
    cases = [CommCase()]
    for h in hz.planted("piecewise", True, ISLAND):
        cases.append(CommCase((h.name,)))
        if h.repairs:
            cases.append(CommCase((h.name,), (h.repairs[0],)))
    return cases


def plan(hazards=(), repairs=()) -> list[CommCase]:
    """Explicit knobs -> that one case; none -> baseline and every hazard with and without its repair."""
    cases = [CommCase(tuple(hazards), tuple(repairs))] if (hazards or repairs) else _default_plan()
    for c in cases:
        c.mode
    return cases

