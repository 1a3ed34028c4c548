"""`repro hunt`: search, shrink, cut after the first divergence, save, and print a replay line
(the search itself is `repro.search.hunt`); with no hazard on a stack other than `fixed`, a blind
hunt that names the control rule at fault (`repro.search.blind`)."""
from __future__ import annotations

import json
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ..control.dispatch import DEFAULT_SIZES
from ..errors import BadInput
from ..graphs import make_provider
from ..io import cache_dir, check_distinct, check_output_file, emit, write_json
from ..islands import Model, check_island, kind
from ..job.cases import Case, check_knobs, run_case
from ..knobs import hazards as hz
from ..model.tiny import default_checkpoint
from ..progress import for_cases
from ..report import OUTPUTS as REPORT_FILES
from ..report import check_output as check_report_dir
from ..report import write_report
from ..scheduler.prefix import check_block_size
from ..scheduler.sequence import Sequence, request_json
from ..search.blind import blame_json, blame_lines, blame_minimal, failure, hunt_mode, is_blind, sequence_shape
from ..search.hunt import Budget, FlakyHunt, hunt
from ..search.strategies import space_for


@dataclass(frozen=True)
class HuntConfig:
    """What `repro hunt` needs, typed (the command line builds it; Python callers may too)."""

    model: str | None = None  # as the user gave it (the replay line names it); None: the embedded tiny one
    device: str = "auto"
    island: str = "chain"
    layer: int | None = None
    mode: str | None = None
    hazards: tuple[str, ...] = ()
    repairs: tuple[str, ...] = ()
    stack: str = "fixed"  # the stack profile searched (`knobs.stacks`); with no hazard, a blind hunt of it
    spec_tokens: int | None = None  # None: the hazards' own K, else 0 (a blind hunt: `blind.BLIND_SPEC`)
    data_parallel: bool | None = None  # dummy steps in the sequences; None: when a hazard needs them
    block_size: int | None = None  # prefix caching's block size in the sequences (wider than K); None: mode "none"
    sentinel: int = 0
    max_examples: int | None = None
    profile: str | None = None
    save: str | None = None
    json: str | None = None
    report: Path | None = None
    force: bool = False
    command: str = "repro hunt"  # the command line, for the report
    cache: Path | None = None  # None: `io.cache_dir`'s default


def kernel_sentinel(hazards, sentinel: int) -> int:
    """The pad sentinel the kernels run with: a hazard may force its own (the typed table's
    `sets["kernel_sentinel"]`), and a saved sequence must be scheduled for that one to replay."""
    return hz.options_for(hazards).sentinel(sentinel)


def default_mode(hazards) -> str:
    """piecewise, unless a hazard only exists in full mode (the table's `modes`)."""
    return "full" if any("piecewise" not in hz.HAZARDS[h].modes for h in hazards) else "piecewise"


def save_path(o: HuntConfig, mode: str) -> Path:
    stack = "" if o.stack == "fixed" else "@" + o.stack
    name = f"{o.island}-{'-'.join(o.hazards) or 'baseline'}{stack}{''.join('+' + r for r in o.repairs)}-{mode}.json"
    return Path(o.save) if o.save else cache_dir(o.cache) / "hunts" / name.replace("=", "_").replace("/", "_")


def replay_line(o: HuntConfig, mode: str, save: Path) -> str:
    parts = ["repro", "run", "--mode", mode, "--island", "all" if o.island == "chain" else o.island,
             "--sequence", str(save)]
    if o.model:
        parts += ["--model", o.model]
    if o.device != "auto":
        parts += ["--device", o.device]
    if o.layer is not None:
        parts += ["--layer", str(o.layer)]
    if o.sentinel != 0:
        parts += ["--sentinel", str(o.sentinel)]
    if o.stack != "fixed":
        parts += ["--stack", o.stack]
    for h in o.hazards:
        parts += ["--hazard", h]
    for r in o.repairs:
        parts += ["--repair", r]
    return " ".join(shlex.quote(p) for p in parts)


def cut_after(minimal: dict, step) -> dict:
    """Steps after the first divergence only lengthen the replay: keep steps 0..step."""
    if step is None or step + 1 >= len(minimal["steps"]):
        return minimal
    return {**minimal, "steps": minimal["steps"][: step + 1]}


HUNT_LINE_EVERY = 10  # without a terminal: one stderr line per this many sequences run


class HuntProgress:
    """What a hunt shows on stderr, against its bound: a bar per phase on a terminal (searching,
    then shrinking, each with its end), else a line every HUNT_LINE_EVERY sequences and one when
    the first failure starts the shrinking; `end` prints the last line in both cases."""

    def __init__(self, label: str, stream=None, tty: bool | None = None):
        self.label = label
        self.p = for_cases(2, stream=stream, tty=tty)
        self.stream = self.p.stream
        self.draw = self.p.start(f"{label} searching")
        self.shrinking = False

    def _line(self, text: str) -> None:
        self.p.clear()
        self.stream.write(f"repro: {self.label}: {text}\n")
        self.stream.flush()

    def __call__(self, b: Budget) -> None:
        if b.phase == "shrinking" and not self.shrinking:
            self.shrinking = True
            self._line(f"found at sequence {b.found_at}; shrinking with at most {b.total - b.spent} more")
            self.draw = self.p.start(f"{self.label} shrinking")
        if self.draw is not None:
            start = b.found_at if self.shrinking else 0
            self.draw(b.spent - start, b.total - start)
        elif b.spent % HUNT_LINE_EVERY == 0:
            self._line(f"{b.spent} sequences run of at most {b.total} ({b.phase})")

    def end(self, b: Budget | None) -> None:
        if b is None:
            self.p.clear()
            return
        if self.shrinking:
            why = "the bound is reached" if b.spent >= b.total else "no smaller sequence fails"
            self._line(f"shrinking: done ({why}), {b.spent} sequences run of at most {b.total}")
        else:
            self._line(f"searching: done, nothing found in {b.spent} sequences run of at most {b.total}")


def hunt_command(o: HuntConfig) -> int:
    """`repro hunt`: search, shrink, cut after the divergence, save (the island in the name), and
    print a replay line that keeps every option the run needs; with `report`, write a report of
    what was found. Returns the exit code: 1 when something was found (or a failure did not
    repeat on the same sequence), else 0."""
    try:
        rc, doc = run_hunt(o)
    except FlakyHunt as e:
        print(f"repro: {e}", file=sys.stderr)
        return 1
    if o.report and doc is not None:
        write_report(doc, o.report, command=o.command, layer=o.layer, sentinel=o.sentinel, force=o.force,
                     what="--report", stack=o.stack)
        emit(f"report: {o.report}/REPORT.md")
    return rc


def _check(o: HuntConfig) -> tuple[str, Path]:
    """Everything refused before any work: the knobs, the island, the options, the outputs.
    Returns the mode and the save path."""
    check_knobs(o.hazards, o.repairs)
    for what, names, table in (("hazard", o.hazards, hz.HAZARDS), ("repair", o.repairs, hz.REPAIRS)):
        unknown = [n for n in names if n not in table]
        if unknown:
            raise BadInput(f"unknown {what} {unknown[0]!r} (known: {', '.join(table)})")
    check_island(o.island if o.island != "chain" else "submod0")
    if o.island == "forced_comm":
        raise BadInput("hunt does not search forced_comm (it runs on several ranks): use "
                       "`repro run --island forced_comm --tp N`")
    if o.force and not o.report:
        raise BadInput("--force: only with --report (it lets a report replace what repro wrote in DIR before)")
    mode = hunt_mode(o, default_mode(o.hazards))
    save = save_path(o, mode)
    check_distinct([("--save", save), ("--json", o.json)], [("--report", o.report, REPORT_FILES)])
    if not o.save:
        save.parent.mkdir(parents=True, exist_ok=True)  # the cache's own folder for saved hunts
    check_output_file(save, "--save")
    check_output_file(o.json, "--json")
    if o.report:
        check_report_dir(o.report, o.force, "--report")
    return mode, save


def run_hunt(o: HuntConfig, stats: dict | None = None) -> tuple[int, dict | None]:
    """The hunt itself; `stats` (when given) gets the seconds from the search's start to the first
    failing sequence (`first_s`) and to the minimal one (`minimal_s`), and the sequences run."""
    mode, save = _check(o)
    provider = make_provider(o.device)
    hz.check(o.hazards, o.repairs, mode, provider.supports_streams, o.island, kind(o.island).eager)
    checkpoint = Path(o.model) if o.model else default_checkpoint(o.cache)
    model = Model(checkpoint, provider.device, o.layer, island="moe" if o.island == "moe" else "submod0")
    k, dp = sequence_shape(o)
    check_block_size(o.block_size, k, ("--block-size", "--spec-tokens"))
    case = Case(o.island, mode, tuple(o.hazards), tuple(o.repairs), spec_tokens=k, data_parallel=dp, stack=o.stack,
                block_size=o.block_size)

    def check(seq):
        return failure(run_case(model, provider, case, seq, sentinel=o.sentinel))

    label = ",".join(o.hazards) or ("blind " + o.stack if is_blind(o) else "baseline")
    progress = HuntProgress(f"hunt {o.island} {mode} {label}")
    seen: list = []
    t0 = time.perf_counter()
    clock = stats if stats is not None else {}

    def shown(b: Budget) -> None:
        seen[:] = [b]
        if b.found_at is not None and "first_s" not in clock:
            clock["first_s"] = round(time.perf_counter() - t0, 2)
        progress(b)
    stopped = False
    try:
        seq, div = hunt(check, o.max_examples, o.profile, vocab=model.cfg.vocab_size, cache=o.cache, progress=shown,
                        spec_tokens=k, data_parallel=dp, block_size=o.block_size, **space_for(DEFAULT_SIZES))
    except KeyboardInterrupt:
        stopped = True  # the search did not end: no "done" line
        raise
    finally:
        progress.end(seen[0] if seen and not stopped else None)
    clock["examples"] = seen[0].spent if seen else 0
    what = f"{label}, {o.island}, {mode}" + ("" if o.stack == "fixed" or is_blind(o) else f", stack {o.stack}")
    if seq is None:
        emit(f"nothing found ({what}, k={k})")
        return 0, None
    clock["minimal_s"] = round(time.perf_counter() - t0, 2)
    eff = kernel_sentinel(o.hazards, o.sentinel)
    minimal = {"requests": [request_json(r, ("accept",)) for r in seq.requests], "num_slots": seq.num_slots,
               "max_tokens": seq.max_tokens, "vocab": seq.vocab, "seed": seq.seed, "spec_tokens": seq.spec_tokens,
               "data_parallel": seq.data_parallel, "tail_dummies": seq.tail_dummies,
               **({"block_size": seq.block_size} if seq.block_size else {}),
               "steps": [b.to_json() for b in seq.batches(None if eff == 0 else range(seq.num_slots))]}
    minimal = cut_after(minimal, div.step)
    cut = Sequence.from_json(minimal)
    result = run_case(model, provider, case, cut, sentinel=o.sentinel)
    doc = {"device": str(provider.device), "graph_provider": provider.name, "checkpoint": str(checkpoint),
           "torch": torch.__version__, "kernel_sentinel": eff, "stack": o.stack, "spec_tokens": k,
           "data_parallel": dp, "minimal_sequence": minimal, "results": [result.to_json()],
           "command": o.command, "replay": replay_line(o, mode, save)}
    lines = []
    if is_blind(o):
        b = blame_minimal(model, provider, case, cut, o.sentinel)
        doc["blame"] = blame_json(b)
        clock["blame_s"] = round(time.perf_counter() - t0, 2)
        lines = blame_lines(b, o.stack)
    clock.update(minimal_steps=len(minimal["steps"]), first_divergence=div.line())
    write_json(save, doc, "--save")
    if o.json:
        write_json(o.json, doc)
    for line in lines:
        emit(line)
    emit(json.dumps(minimal, indent=None))
    emit(f"first {'divergence' if div.step is not None else 'finding'}: {div.line()}")
    emit(f"{len(seq.requests)} requests, {len(minimal['steps'])} steps; saved to {save}")
    emit(f"replay: {replay_line(o, mode, save)}")
    print(f"hunt ({what}) found: {div.line()}", file=sys.stderr)
    return 1, doc
