"""The main job: every island at baseline, then each hazard alone, with and without its repair,
over one seeded request sequence, on one provider. Results follow DESIGN.md's JSON contract."""
from __future__ import annotations

import sys
from dataclasses import dataclass, field

import torch

from . import hazards as hz
from .errors import BadInput
from .islands import Model
from .lockstep import run_lockstep
from .runner import DEFAULT_SIZES
from .sequence import Sequence, random_sequence

# Islands the single-rank job covers, and how each maps onto a runner setting.
ISLAND_MODES = {
    "submod0": ("piecewise", ("eager-family=submod1",)),  # only submod0 graphed
    "submod1": ("piecewise", ("eager-family=submod0",)),  # only submod1 graphed
    "gdn_core": ("full", ()),  # the splitting op only enters a graph in full mode
}
ISLAND_REPAIRS = {"declare": "undeclared-mutation", "capture-stream": "escaped-capture"}


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


def plan(island: str, mode: str | None, hazards, repairs, provider_name: str) -> list[Case]:
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
                hz.check(hazards, repairs, m, provider_name, "chain" if isl != "moe" else "moe")
                cases.append(Case(isl, m, tuple(hazards), tuple(repairs), _expect(hazards, repairs)))
            else:
                cases.append(Case(isl, m))
    if hazards or repairs or island not in ("all", None, "chain"):
        return cases
    for m in modes:
        for name, h in hz.HAZARDS.items():
            if m not in h.modes or "chain" not in h.islands or (h.device_only and provider_name == "cpu-tape"):
                continue
            cases.append(Case("chain", m, (name,), (), "finding" if h.detected_as == "finding" else "diverged"))
            if h.repairs:
                cases.append(Case("chain", m, (name,), (h.repairs[0],), "clean"))
    return cases


def _expect(hazards, repairs) -> str:
    live = [h for h in hazards if not any(r in repairs for r in hz.HAZARDS[h].repairs)]
    if not live:
        return "clean"
    return "finding" if all(hz.HAZARDS[h].detected_as == "finding" for h in live) else "diverged"


def run_case(model: Model, provider, case: Case, seq: Sequence, sentinel: int = 0, sizes=DEFAULT_SIZES,
             trace=None, progress=None) -> CaseResult:
    repairs = set(case.repairs)
    hazards = set(case.hazards)
    if case.island in ISLAND_MODES:
        repairs |= set(ISLAND_MODES[case.island][1])
    # repairs made in the islands' code (declare the mutation, issue on the capture stream)
    copy_hazards = {h for h in hazards if not any(ISLAND_REPAIRS.get(r) == h for r in repairs)}
    if "pad-sentinel-mismatch" in hazards:
        sentinel = -1  # the kernel skips only -1; the runner pads with 0 (see hazards.py)
    copy_sentinel = sentinel
    if case.island == "moe":
        from .lockstep import run_moe_lockstep
        res = run_moe_lockstep(model, provider, seq.batches(), sizes=sizes)
    else:
        usable = None if copy_sentinel == 0 else range(seq.num_slots)
        batches = seq.batches(usable)
        res = run_lockstep(lambda hzs: model.copy(hzs, num_slots=seq.num_slots, sentinel=copy_sentinel),
                           provider, batches, mode=case.mode, hazards=copy_hazards, repairs=repairs,
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
