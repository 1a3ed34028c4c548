"""The main job: every island at baseline, then each hazard alone, with and without its repair,
over one seeded request sequence, on one provider. Results follow DESIGN.md's JSON contract."""
from __future__ import annotations

import sys
from dataclasses import dataclass, field

import torch

from dataclasses import replace

from . import hazards as hz
from .capture import DEFAULT_SIZES
from .errors import BadInput
from .islands import Model
from .lockstep import run_lockstep
from .sequence import Sequence, random_sequence

# Islands the single-rank job covers, and how each maps onto a runner setting: the capture mode
# and the families that run eagerly around it.
ISLAND_MODES = {
    "submod0": ("piecewise", frozenset({"submod1"})),  # only submod0 graphed
    "submod1": ("piecewise", frozenset({"submod0"})),  # only submod1 graphed
    "gdn_core": ("full", frozenset()),  # the splitting op only enters a graph in full mode
}


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
    diverged: bool
    first_divergence: dict | None
    findings: list = field(default_factory=list)
    eager_us: float = 0.0
    replay_us: float = 0.0

    @property
    def detected(self) -> bool:
        return self.diverged or any(f["kind"] == "undeclared-mutation" for f in self.findings)

    def to_json(self) -> dict:
        fd = self.first_divergence
        return {"island": self.case.island, "mode": self.case.mode, "hazards": list(self.case.hazards),
                "repairs": list(self.case.repairs), "steps": self.steps, "diverged": self.diverged,
                "first_divergence": None if fd is None else {k: fd[k] for k in
                                                             ("step", "island", "tensor", "row", "request", "slot", "max_abs")},
                "microscope": fd, "findings": self.findings, "expect": self.case.expect,
                "eager_us": round(self.eager_us, 1), "replay_us": round(self.replay_us, 1)}


def plan(island: str, mode: str | None, hazards, repairs, streams: bool) -> list[Case]:
    """Explicit hazards/repairs -> one case per mode; none -> baseline plus every applicable hazard."""
    if island in ("all", None):
        islands = ["chain"] if (hazards or repairs) else ["chain", "submod0", "submod1", "gdn_core", "moe"]
    else:
        islands = [island]
    modes = [mode] if mode else ["piecewise", "full"]
    cases: list[Case] = []
    for isl in islands:
        if isl == "forced_comm":
            raise BadInput("forced_comm needs ranks: use `repro run --island forced_comm --tp N`")
        isl_modes = [ISLAND_MODES[isl][0]] if isl in ISLAND_MODES else (["piecewise"] if isl == "moe" else modes)
        for m in isl_modes:
            if hazards or repairs:
                hz.check(hazards, repairs, m, streams, "chain" if isl != "moe" else "moe")
                cases.append(Case(isl, m, tuple(hazards), tuple(repairs), hz.expectation(hazards, repairs)))
            else:
                cases.append(Case(isl, m))
    if hazards or repairs or island not in ("all", None, "chain"):
        return cases
    for m in modes:
        for h in hz.planted(m, streams):
            cases.append(Case("chain", m, (h.name,), (), hz.expectation((h.name,), ())))
            if h.repairs:
                cases.append(Case("chain", m, (h.name,), (h.repairs[0],), "clean"))
    return cases


def run_case(model: Model, provider, case: Case, seq: Sequence, sentinel: int = 0, sizes=DEFAULT_SIZES,
             trace=None, progress=None) -> CaseResult:
    opts = hz.options_for(case.hazards, case.repairs)
    if case.island in ISLAND_MODES:
        families = opts.runner.eager_families | ISLAND_MODES[case.island][1]
        opts = replace(opts, runner=replace(opts.runner, eager_families=families))
    copy_sentinel = opts.sentinel(sentinel)  # a hazard may give the kernels another sentinel
    if case.island == "moe":
        from .lockstep import run_moe_lockstep
        res = run_moe_lockstep(model, provider, seq.batches(), sizes=sizes)
    else:
        usable = None if copy_sentinel == 0 else range(seq.num_slots)
        batches = seq.batches(usable)
        res = run_lockstep(lambda o: model.copy(o, num_slots=seq.num_slots, sentinel=copy_sentinel),
                           provider, batches, mode=case.mode, opts=opts,
                           sizes=sizes, trace=trace, progress=progress, max_tokens=seq.max_tokens)
    return CaseResult(case, res.steps, res.diverged, res.divergence.to_json() if res.divergence else None,
                      [f.to_json() for f in res.findings], res.eager_us, res.replay_us)


def default_sequence(seed: int, steps: int, num_slots: int = 8, vocab: int = 512) -> Sequence:
    """A seeded random sequence cut to exactly `steps` scheduler steps."""
    n = max(2, steps // 6)
    while True:
        seq = random_sequence(seed, num_requests=n, num_slots=num_slots, vocab=vocab)
        batches = seq.batches()
        if len(batches) >= steps:
            seq.max_steps = steps
            return seq
        n = n * 3 // 2 + 1


def progress_bar(label: str):
    if not sys.stderr.isatty():
        return None

    def show(done, total):
        w = 30
        k = int(w * done / max(total, 1))
        sys.stderr.write(f"\r{label[:38]:<38} [{'#' * k}{'.' * (w - k)}] {done}/{total}")
        if done == total:
            sys.stderr.write("\r" + " " * 80 + "\r")
        sys.stderr.flush()
    return show


def verdict(r: CaseResult) -> str:
    if r.case.expect == "clean":
        return "ok" if not r.detected else "DIVERGED"
    if r.case.expect == "finding":
        return "detected" if r.detected else "MISSED"
    return "detected" if r.diverged else "MISSED"


def format_table(results: list[CaseResult]) -> str:
    rows = [("island", "mode", "hazard", "repair", "steps", "result", "first divergence / finding", "replay/eager")]
    for r in results:
        fd = r.first_divergence
        where = (f"step {fd['step']} {fd['island']}.{fd['tensor']} row {fd['row']} slot {fd['slot']} "
                 f"|d|={fd['max_abs']:.3g}") if fd else (r.findings[0]["kind"] + ": " + r.findings[0]["detail"][:40]
                                                          if r.findings else "")
        ratio = f"{r.replay_us / r.eager_us:.2f}" if r.eager_us else "-"
        rows.append((r.case.island, r.case.mode, ",".join(r.case.hazards) or "-", ",".join(r.case.repairs) or "-",
                     str(r.steps), verdict(r), where, ratio))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def device_name(provider) -> str:
    d = provider.device
    if d.type == "cuda":
        return torch.cuda.get_device_name(d)
    if d.type == "xpu":
        return torch.xpu.get_device_name(d)
    return "cpu"
