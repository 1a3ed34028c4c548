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
from ..io import text_width, wrap
from ..knobs import hazards as hz
from ..knobs.control import Control
from ..knobs.hazards import FINDING_KINDS
from .triggers import needs, shown_by_finding


@dataclass
class Case:
    island: str  # "chain" or an island name
    mode: str
    hazards: tuple[str, ...] = ()
    repairs: tuple[str, ...] = ()
    expect: str = "clean"  # what a healthy stack gives: "clean" or "diverged"/"finding"
    spec_tokens: int = 0  # draft tokens a decode of its sequence carries
    data_parallel: bool = False  # its sequence has an idle data-parallel rank's dummy steps
    stack: str = "fixed"  # the stack profile its control rules start from (`knobs.stacks`)
    block_size: int | None = None  # prefix caching's block size (vLLM's mamba cache mode "align"); None: "none"
    control: Control = Control()  # where its control decisions come from (`--control`, `--patch`)


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
    triggered: bool | None = None  # the steps reached a live hazard's trigger (`triggers.py`); None: not judged
    refused: str = ""  # a kernel provider refused the case (`kernels.errors.KernelRefused`): its one line

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
    def shown_by_finding(self) -> bool:
        """A live planted hazard whose mechanism the runner reported as a finding (its trigger)."""
        return shown_by_finding(self.case.hazards, self.case.repairs, self.findings)

    @property
    def detected(self) -> bool:
        return self.diverged or any(f["kind"] in FINDING_KINDS for f in self.findings) or self.shown_by_finding

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
                "repairs": list(self.case.repairs), "spec_tokens": self.case.spec_tokens,
                "data_parallel": self.case.data_parallel, "stack": self.case.stack, "block_size": self.case.block_size,
                "steps": self.steps, "diverged": self.diverged,
                "first_divergence": None if fd is None else {k: fd[k] for k in keys},
                "microscope": fd, "findings": self.findings, "expect": self.case.expect,
                "classification": self.classification, "strict": self.strict,
                "kernel_findings": {k: {"count": v["count"], "first": v["first"].to_json()}
                                    for k, v in self.kernel_findings.items()},
                "eager_us": round(self.eager_us, 1), "replay_us": round(self.replay_us, 1),
                "bound_usage": {k: round(v, 4) for k, v in sorted(self.bound_usage.items())},
                "triggered": self.triggered, "verdict": verdict(self), **self._control()}

    def _control(self) -> dict:
        """The case's control source, where it is not the mirror (mirror rows keep their keys)."""
        c = self.case.control
        return {"control": c.source, "patches": list(c.patches)} if c.upstream else {}


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
    """ok / DIVERGED for a case that should be clean; detected / MISSED / not triggered for a
    planted hazard; refused (REFUSED where the plan expected an answer) when a kernel provider
    would not say what the case does (`kernels.errors.KernelRefused`). A planted hazard is detected
    by a graph hazard or corruption (never by a kernel finding), by the finding its row expects, or
    by the finding that reports its mechanism (its trigger); "not triggered": the steps never
    reached what it needs (`triggers.py`)."""
    if not r.ran:
        return "not run"
    if r.refused:  # a kernel that cannot say what the case does: expected where the plan says so
        return "refused" if r.case.expect == "refused" else "REFUSED"
    if r.case.expect == "clean":
        return "ok" if not r.detected else "DIVERGED"
    shown = r.detected if r.case.expect == "finding" else (r.divergence is not None or r.shown_by_finding)
    if shown:
        return "detected"
    return "not triggered" if r.triggered is False else "MISSED"


def exit_code(results: list[CaseResult], hazards_requested: bool = False, run: dict | None = None) -> int:
    """The run's exit code: 1 when a case that should be clean is not (a graph hazard, corruption,
    an undeclared mutation, or in strict mode a kernel finding), when a planted hazard was missed,
    when a kernel provider refused a case the plan did not expect it to refuse,
    or when hazards were planted on request and detected; else 0 (batch variance and
    nondeterminism alone give 0).

    `run`: a multi-rank run's JSON object. Its `failure` (a rank died, hung or raised) fails the
    run. A missed planted hazard fails single- and multi-rank runs alike (a MISSED row
    must not exit 0)."""
    if run is not None and run.get("failure"):
        return 1
    if any(verdict(r) in ("DIVERGED", "MISSED", "REFUSED") for r in results):
        return 1
    if hazards_requested and any(r.detected for r in results):
        return 1
    return 0


def _where(d: Divergence) -> str:
    if d.rank is not None:  # the rank that saw it; the TP slice has no slots
        return f"step {d.step} rank {d.rank} {d.tensor} row {d.row} |d|={d.max_abs:.3g}"
    return d.where()




def _probes(r: CaseResult) -> list[str]:
    return [h for h in r.case.hazards if hz.HAZARDS[h].probe]


def _notes_of(r: CaseResult) -> list[str]:
    """Everything a row has to say, whole: what failed it (or the first kernel finding), the kernel
    findings' counts, the runner's findings, why a hazard was not triggered, what a probe is."""
    notes = [r.refused] if r.refused else []
    f = r.failure
    if f is not None:
        text = f"{f.kind or 'difference'}: {_where(f)}"
        race = next((x["detail"] for x in r.findings if x["kind"] == "race"), None)
        if race:  # the interleaving the race amplifier forced (runner.RaceLog)
            text += " [race " + race.split(";")[0] + "]"
        notes.append(text)
    for kind in KERNEL_FINDINGS:
        k = r.kernel_findings.get(kind)
        if k is not None and k["first"] is not f:
            notes.append(f"{kind} x{k['count']}, the first: {_where(k['first'])}")
    found = [f"{x['kind']}: {x['detail']}" for x in r.findings if not (f is not None and x["kind"] == "race")]
    if found and r.case.hazards and r.case.repairs and verdict(r) == "ok":  # what the repair answers, and it held
        found = [f"{','.join(r.case.repairs)} held: replay equals eager in all {r.steps} steps, though capture "
                 f"still shows what it answers ({'; '.join(found)})"]
    notes += found
    if verdict(r) == "not triggered":
        notes.append(f"not triggered in {r.steps} steps: {needs(r.case.hazards, r.case.repairs)}; a longer "
                     "run (--steps) or `repro hunt` reaches it")
    for h in _probes(r):
        notes.append(f"{h} is a probe for an upstream bug with no known repair ({hz.HAZARDS[h].cases}): "
                     "ok means this stack does not show it")
    return notes


def _refs(ns: list[int]) -> list[str]:
    """Note numbers, runs of three or more as a range: ["1"], ["2,5"], ["3-16"], ["13-19,21-24"]."""
    ns, parts = sorted(set(ns)), []
    while ns:
        k = 1
        while k < len(ns) and ns[k] == ns[0] + k:
            k += 1
        parts += [f"{ns[0]}-{ns[k - 1]}"] if k > 2 else [str(n) for n in ns[:k]]
        ns = ns[k:]
    return parts


def _pack(parts: list[str], width: int) -> list[str]:
    """`parts` joined by commas, over as many lines of `width` as they need (a comma ends a line)."""
    lines = [""]
    for p in parts:
        if lines[-1] and len(lines[-1]) + 1 + len(p) > width:
            lines[-1] += ","
            lines.append("")
        lines[-1] += ("," if lines[-1] else "") + p
    return lines


def _wrap(text: str, label: str = "") -> list[str]:
    return wrap(text, label)


def _case_cell(r: CaseResult, before: CaseResult | None) -> str:
    """The hazards and repairs in one column: a repair's row right after its hazard's shows only
    `  +repair` (the default plan's pairs), any other row both."""
    hazards, repairs = ",".join(r.case.hazards), ",".join(r.case.repairs)
    if not repairs:
        return hazards or "baseline"
    same = before is not None and (before.case.island, before.case.mode, before.case.hazards) == \
        (r.case.island, r.case.mode, r.case.hazards) and not before.case.repairs
    return f"  +{repairs}" if same and hazards else f"{hazards or 'baseline'} +{repairs}"


def format_table(results: list[CaseResult], run: dict | None = None) -> str:
    """One row a case (with its K draft tokens a decode), then the notes the rows refer to, numbered,
    each printed whole once; all of it within `io.text_width()` columns (a row's note numbers go on over more
    lines if they must). No timing: the replay/eager ratio of a lockstep step is mostly the
    checking's cost; `repro bench` times replay. `run`: a multi-rank run's JSON object; its table
    has a comm mode column and ends with the failure, if any, and the launch line (ranks, backend,
    device, provider, comm dtype, time)."""
    multi = run is not None
    head = ("island", "comm mode" if multi else "mode", "K", "hazard / +repair", "steps", "result")
    rows, refs, notes = [head], [["notes"]], {}
    for i, r in enumerate(results):
        refs.append(_refs([notes.setdefault(text, len(notes) + 1) for text in _notes_of(r)]))
        rows.append((r.case.island, r.case.mode, str(getattr(r.case, "spec_tokens", 0)),  # a CommCase has none
                     _case_cell(r, results[i - 1] if i else None),
                     str(r.steps), verdict(r) + (" (probe)" if _probes(r) else "")))
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    left = sum(widths) + 2 * len(widths)  # where the notes column starts
    lines = []
    for row, ref in zip(rows, refs):
        cells = "  ".join(c.rjust(w) if i in (2, 4) else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths)))
        numbers = _pack(ref, max(text_width() - left, 8))
        lines.append((cells + "  " + numbers[0]).rstrip())
        lines += [" " * left + more for more in numbers[1:]]
    lines.insert(1, "  ".join("-" * w for w in widths) + "  -----")
    if notes:
        lines.append("")
        for text, n in notes.items():
            lines += _wrap(text, f"[{n}] ")
    if multi:
        f = run.get("failure")
        if f:
            where = f"case {f['case']}, step {f['step']}, {f['phase']}" if f.get("case") else f"phase {f.get('phase')}"
            lines += _wrap(f"FAILED: {f['kind']}: {f['detail']} (at {where})")
        lines += _wrap(f"tp {run['tp']} over {run['backend']} on {run['device']}, provider {run['graph_provider']}, "
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
