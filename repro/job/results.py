"""Cases, results, verdict, table, exit code and device name, for single-rank and multi-rank runs.

One layer so that `repro run` decides "ok / detected / DIVERGED / MISSED" and the exit code the
same way whether the case ran on one rank (`job.py`) or on N (`comm/`): a multi-rank case is a
`MultiRankResult`, a `CaseResult` with the collective counts and the ranks that diverged.

A result keeps its `Divergence` objects: the case's failure (graph hazard or corruption, or in
strict mode the first kernel finding) and the kernel findings (batch variance, nondeterminism:
count and first of each). `first_divergence` is the failure's JSON, as the result files carry it.

A case is anything with `island`, `mode`, `hazards`, `repairs` and `expect`: `Case` here, or
`comm.CommCase`, whose mode is the comm mode derived from its knobs.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..check.compare import KERNEL_FINDINGS, Divergence
from ..knobs.hazards import FINDING_KINDS


@dataclass
class Case:
    island: str  # "chain" or an island name
    mode: str
    hazards: tuple[str, ...] = ()
    repairs: tuple[str, ...] = ()
    expect: str = "clean"  # what a healthy stack gives: "clean" or "diverged"/"finding"


@dataclass
class CaseResult:
    case: Case
    steps: int
    divergence: Divergence | None  # the first graph hazard or corruption
    findings: list = field(default_factory=list)  # the runner's findings, as JSON dicts
    eager_us: float = 0.0
    replay_us: float = 0.0
    kernel_findings: dict = field(default_factory=dict)  # kind -> {"count": n, "first": Divergence}
    strict: bool = False  # kernel findings fail the case too
    ran: bool = True  # False: the run never reached this case (a rank died or hung first)
    bound_usage: dict = field(default_factory=dict)  # tensor -> largest |d| / bound against the third copy

    @property
    def failure(self) -> Divergence | None:
        """What fails the case: a graph hazard or corruption, or (strict) the first kernel finding."""
        if self.divergence is not None:
            return self.divergence
        if self.strict and self.kernel_findings:
            return min((v["first"] for v in self.kernel_findings.values()), key=lambda d: d.step)
        return None

    @property
    def diverged(self) -> bool:
        return self.failure is not None

    @property
    def first_divergence(self) -> dict | None:
        f = self.failure
        return None if f is None else f.to_json()

    @property
    def detected(self) -> bool:
        return self.diverged or any(f["kind"] in FINDING_KINDS for f in self.findings)

    @property
    def classification(self) -> str:
        """The table's `class` cell: the failure's kind, then each kernel finding with its count."""
        parts = [self.divergence.kind] if self.divergence is not None and self.divergence.kind else []
        for kind in KERNEL_FINDINGS:
            if kind in self.kernel_findings:
                parts.append(f"{kind} x{self.kernel_findings[kind]['count']}")
        return ", ".join(parts) or "-"

    def to_json(self) -> dict:
        fd = self.first_divergence
        keys = ("step", "island", "tensor", "row", "request", "slot", "max_abs", "kind", "nonfinite")
        return {"island": self.case.island, "mode": self.case.mode, "hazards": list(self.case.hazards),
                "repairs": list(self.case.repairs), "steps": self.steps, "diverged": self.diverged,
                "first_divergence": None if fd is None else {k: fd[k] for k in keys},
                "microscope": fd, "findings": self.findings, "expect": self.case.expect,
                "classification": self.classification, "strict": self.strict,
                "kernel_findings": {k: {"count": v["count"], "first": v["first"].to_json()}
                                    for k, v in self.kernel_findings.items()},
                "eager_us": round(self.eager_us, 1), "replay_us": round(self.replay_us, 1),
                "bound_usage": {k: round(v, 4) for k, v in sorted(self.bound_usage.items())}}


@dataclass
class MultiRankResult(CaseResult):
    """A case run on N ranks (forced_comm): steps and divergence merged over the ranks (the
    earliest step, then the lowest rank), timings averaged, collective counts from rank 0."""

    ranks_diverged: list = field(default_factory=list)
    captures: int = 0
    replays: int = 0
    collectives_in_graphs: int | None = None  # collectives the graphs replay (None: the provider cannot tell)

    def to_json(self) -> dict:
        """The multi-rank row of the JSON contract (its own keys: comm mode, ranks, collectives)."""
        d = self.divergence
        return {"island": self.case.island, "comm_mode": self.case.mode, "hazards": list(self.case.hazards),
                "repairs": list(self.case.repairs), "steps": self.steps, "diverged": self.diverged,
                "first_divergence": None if d is None else rank_divergence_json(d),
                "ranks_diverged": list(self.ranks_diverged), "expect": self.case.expect,
                "eager_us": self.eager_us, "replay_us": self.replay_us, "captures": self.captures,
                "replays": self.replays, "collectives_in_graphs": self.collectives_in_graphs, "verdict": verdict(self)}


def rank_divergence(index: int, step: int, island: str, tensor: str, row: int | None, rank: int, max_abs: float,
                    detail: str | None = None) -> Divergence:
    """A difference one rank saw at step `step` (the `index`-th batch). The TP slice has no
    request slots; `detail` says why there is no row (the shapes differ)."""
    context = {"index": index} if detail is None else {"index": index, "detail": detail}
    return Divergence(step, island, tensor, row, None, None, max_abs, context=context, rank=rank)


def rank_divergence_json(d: Divergence) -> dict:
    """A rank's divergence as the multi-rank JSON carries it."""
    j = {"index": d.context["index"], "step": d.step, "island": d.island, "tensor": d.tensor, "row": d.row,
         "rank": d.rank, "max_abs": d.max_abs}
    if "detail" in d.context:
        j["detail"] = d.context["detail"]
    return j


def verdict(r: CaseResult) -> str:
    if not r.ran:
        return "not run"
    if r.case.expect == "clean":
        return "ok" if not r.detected else "DIVERGED"
    if r.case.expect == "finding":
        return "detected" if r.detected else "MISSED"
    # a planted hazard is detected by a graph hazard or corruption, never by a kernel finding
    return "detected" if r.divergence is not None else "MISSED"


def exit_code(results: list[CaseResult], hazards_requested: bool = False, run: dict | None = None) -> int:
    """The run's exit code: 1 when a case that should be clean is not (a graph hazard, corruption,
    an undeclared mutation, or in strict mode a kernel finding), when a planted hazard was missed,
    or when hazards were planted on request and detected; else 0 (batch variance and
    nondeterminism alone give 0).

    `run`: a multi-rank run's JSON object. Its `failure` (a rank died, hung or raised) fails the
    run. A missed planted hazard fails single- and multi-rank runs alike (issue 18: a MISSED row
    must not exit 0)."""
    if run is not None and run.get("failure"):
        return 1
    if any(verdict(r) in ("DIVERGED", "MISSED") for r in results):
        return 1
    if hazards_requested and any(r.detected for r in results):
        return 1
    return 0


def _where(d: Divergence) -> str:
    if d.rank is not None:  # the rank that saw it; the TP slice has no slots
        return f"step {d.step} rank {d.rank} {d.tensor} row {d.row} |d|={d.max_abs:.3g}"
    return d.where()


MIN_TIMED_STEPS = 10  # below this a row's replay/eager ratio is capture time, not replay speed
FINDING_WIDTH = 60  # characters of a finding's text in the table (the JSON keeps it whole)


def _finding_cell(r: CaseResult) -> str:
    """The first runner finding, cut at a word and marked; on a clean row it is a note (what the
    repair's mechanism showed), not a failure, and says so."""
    if not r.findings:
        return ""
    text = f"{r.findings[0]['kind']}: {r.findings[0]['detail']}"
    if len(text) > FINDING_WIDTH:
        cut = text[:FINDING_WIDTH].rsplit(" ", 1)[0]
        text = (cut if len(cut) > FINDING_WIDTH // 2 else text[:FINDING_WIDTH]) + " ..."  # a word, unless one fills it
    more = f" (+{len(r.findings) - 1} more)" if len(r.findings) > 1 else ""
    return ("note: " if verdict(r) == "ok" else "") + text + more


def format_table(results: list[CaseResult], run: dict | None = None) -> str:
    """One row a case. `run`: a multi-rank run's JSON object; its table has a comm mode column
    and no class column (ranks report no kernel findings), and ends with the failure, if any,
    and the launch line (ranks, backend, device, provider, comm dtype, time)."""
    multi = run is not None
    rows = [("island", "comm mode" if multi else "mode", "hazard", "repair", "steps", "result")
            + (() if multi else ("class",)) + ("first divergence" if multi else "first divergence / finding",
                                               "replay/eager")]
    for r in results:
        f = r.failure
        if f is None and r.kernel_findings:
            f = min((v["first"] for v in r.kernel_findings.values()), key=lambda d: d.step)
        where = _where(f) if f is not None else _finding_cell(r)
        race = next((x["detail"] for x in r.findings if x["kind"] == "race"), None)
        if f is not None and race:  # the interleaving the race amplifier forced (runner.RaceLog)
            where += " [race " + race.split(";")[0] + "]"
        # a few steps' timing is mostly capture and warm-up: no ratio is shown for them
        ratio = f"{r.replay_us / r.eager_us:.2f}" if r.eager_us and r.steps >= MIN_TIMED_STEPS else "-"
        rows.append((r.case.island, r.case.mode, ",".join(r.case.hazards) or "-", ",".join(r.case.repairs) or "-",
                     str(r.steps), verdict(r)) + (() if multi else (r.classification,)) + (where, ratio))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    if multi:
        f = run.get("failure")
        if f:
            where = f"case {f['case']}, step {f['step']}, {f['phase']}" if f.get("case") else f"phase {f.get('phase')}"
            lines.append(f"FAILED: {f['kind']}: {f['detail']} (at {where})")
        lines.append(f"tp {run['tp']} over {run['backend']} on {run['device']}, provider {run['graph_provider']}, "
                     f"comm dtype {run['comm_dtype']}, {run['elapsed_s']:.1f} s")
    return "\n".join(lines)


def device_name(where) -> str:
    """The device's marketing name for result files: a `torch.device`, or a provider (its device)."""
    d = getattr(where, "device", where)
    if d.type == "cuda":
        return torch.cuda.get_device_name(d)
    if d.type == "xpu":
        return torch.xpu.get_device_name(d)
    return "cpu"
