"""Which repairs clear the divergence and what each costs: the only place a report runs the suite
again (through `repro.job.run_case`), because a result file holds at most the first repair.

A cost is the replay time per step of the repaired case over that of a healthy case (no hazard,
no repair) on the same island, mode and steps. It is never taken against the diverging run: that
one stops at its first divergence, so it ran fewer steps and its mean carries the captures."""
from __future__ import annotations

from dataclasses import dataclass

from ..knobs import hazards as hz
from ..errors import Refused
from ..graphs import TapeProvider
from ..job.cases import run_case
from .cases import fixes
from .load import rerun_case, rerun_sequence


@dataclass
class RepairRow:
    repair: str
    diverged: bool | None
    replay_us: float | None
    baseline_us: float | None
    source: str
    note: str = ""
    steps: int | None = None
    baseline_steps: int | None = None

    @property
    def comparable(self) -> bool:
        return self.steps is not None and self.steps == self.baseline_steps

    @property
    def cost(self) -> float | None:
        if self.comparable and self.replay_us and self.baseline_us:
            return self.replay_us / self.baseline_us
        return None

    @property
    def why_no_cost(self) -> str:
        if self.replay_us is None:
            return ""
        if self.baseline_us is None:
            return "no healthy run to compare with"
        if not self.comparable:
            return f"not compared: {self.steps} steps with the repair, {self.baseline_steps} without"
        return ""


def _same_case(x: dict, r: dict) -> bool:
    return x["island"] == r["island"] and x["mode"] == r["mode"]


def _from_file(doc: dict, r: dict) -> list[RepairRow]:
    base = next((x for x in doc["results"] if _same_case(x, r) and not x["hazards"] and not x["repairs"]), None)
    rows = []
    for x in doc["results"]:
        if x is r or not _same_case(x, r) or x["hazards"] != r["hazards"] or not x["repairs"]:
            continue
        rows.append(RepairRow(",".join(x["repairs"]), x["diverged"], x.get("replay_us"),
                              base.get("replay_us") if base else None, f"result file ({doc.get('graph_provider', '?')})",
                              steps=x.get("steps"), baseline_steps=base.get("steps") if base else None))
    return rows


def wanted_repairs(r: dict, have: list[RepairRow]) -> list[str]:
    """The table's repairs of the planted hazards that neither the result nor the file applied."""
    done = set(r["repairs"]) | {x for row in have for x in row.repair.split(",")}
    out = []
    for h in r["hazards"]:
        for rep in hz.HAZARDS[h].repairs:
            if rep not in done and rep not in out:
                out.append(rep)
    return out


def repair_rows(doc: dict, r: dict, steps, seqj, model, sentinel: int | None) -> list[RepairRow]:
    """Repairs of the planted hazards, or the fixes of the rule a blind hunt blamed (`cases.fixes`):
    from the result file when it has them, else run here on the CPU tape over the report's steps
    (with a healthy run beside them for the cost: no hazard and no repair, on the fixed stack for
    a blamed rule, since the blamed stack's own run is the one that diverged)."""
    rows = _from_file(doc, r)
    wanted = wanted_repairs(r, rows) if r["hazards"] else [x for x in fixes(r) if x not in r["repairs"]]
    if not wanted:
        return rows
    if model is None:
        return rows + [RepairRow(rep, None, None, None, "not run", "checkpoint not found here") for rep in wanted]
    if r["island"] not in hz.CHAIN_ISLANDS:
        return rows + [RepairRow(rep, None, None, None, "not run", f"island {r['island']}: run it with `repro run`")
                       for rep in wanted]
    provider = TapeProvider("cpu")
    seq = rerun_sequence(seqj, steps)
    sent = sentinel if sentinel is not None else 0
    healthy = None
    for rep in wanted:
        repairs = tuple(r["repairs"]) + (rep,)
        try:
            hz.check(r["hazards"], repairs, r["mode"], provider.supports_streams, "chain")
        except Refused as e:
            rows.append(RepairRow(rep, None, None, None, "refused", str(e)))
            continue
        if healthy is None:
            # the same kernel sentinel as the hazard's run, so both address the same slots
            fixed = r if r["hazards"] else {**r, "stack": "fixed"}
            healthy = run_case(model, provider, rerun_case(fixed, (), ()), seq,
                               sentinel=hz.options_for(r["hazards"]).sentinel(sent))
        res = run_case(model, provider, rerun_case(r, repairs=repairs), seq, sentinel=sent)
        rows.append(RepairRow(rep, res.detected, res.replay_us, healthy.replay_us, "run here (cpu-tape, same steps)",
                              steps=res.steps, baseline_steps=healthy.steps))
    return rows
