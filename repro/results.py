"""A case of the single-rank job, its result, its verdict, the table and the exit code.

A result keeps its `Divergence` objects: the case's failure (graph hazard or corruption, or in
strict mode the first kernel finding) and the kernel findings (batch variance, nondeterminism:
count and first of each). `first_divergence` is the failure's JSON, as the result files carry it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .compare import BATCH_VARIANCE, NONDETERMINISM, Divergence
from .hazards import FINDING_KINDS


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
        for kind in (BATCH_VARIANCE, NONDETERMINISM):
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
                "eager_us": round(self.eager_us, 1), "replay_us": round(self.replay_us, 1)}


def verdict(r: CaseResult) -> str:
    if r.case.expect == "clean":
        return "ok" if not r.detected else "DIVERGED"
    if r.case.expect == "finding":
        return "detected" if r.detected else "MISSED"
    # a planted hazard is detected by a graph hazard or corruption, never by a kernel finding
    return "detected" if r.divergence is not None else "MISSED"


def exit_code(results: list[CaseResult], hazards_requested: bool = False) -> int:
    """The run's exit code: 1 when a case that should be clean is not (a graph hazard, corruption,
    an undeclared mutation, or in strict mode a kernel finding), when a planted hazard was missed,
    or when hazards were planted on request and detected; else 0 (batch variance and
    nondeterminism alone give 0)."""
    if any(verdict(r) in ("DIVERGED", "MISSED") for r in results):
        return 1
    if hazards_requested and any(r.detected for r in results):
        return 1
    return 0


def format_table(results: list[CaseResult]) -> str:
    rows = [("island", "mode", "hazard", "repair", "steps", "result", "class", "first divergence / finding",
             "replay/eager")]
    for r in results:
        f = r.failure
        if f is None and r.kernel_findings:
            f = min((v["first"] for v in r.kernel_findings.values()), key=lambda d: d.step)
        where = f.where() if f is not None else (r.findings[0]["kind"] + ": " + r.findings[0]["detail"][:40]
                                                 if r.findings else "")
        race = next((x["detail"] for x in r.findings if x["kind"] == "race"), None)
        if f is not None and race:  # the interleaving the race amplifier forced (runner.RaceLog)
            where += " [race " + race.split(";")[0] + "]"
        ratio = f"{r.replay_us / r.eager_us:.2f}" if r.eager_us else "-"
        rows.append((r.case.island, r.case.mode, ",".join(r.case.hazards) or "-", ",".join(r.case.repairs) or "-",
                     str(r.steps), verdict(r), r.classification, where, ratio))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
