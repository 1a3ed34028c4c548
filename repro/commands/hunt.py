"""`repro hunt`: search, shrink, cut after the first divergence, save, and print a replay line
(the search itself is `repro.search.hunt`); with no hazard, a blind hunt of the stack profile in
every mode it runs, which names the control rule at fault or says that none explains the failure
(`repro.search.blind`); with no hazard under a vLLM control source, a blind hunt of the installed
vLLM (as patched) that names the shipped patch that clears what it found (`repro.search.patch_blame`).
Each distinct failure is reported; the first is the one saved and replayed, and the result file
keeps the others (`other_failures`)."""
from __future__ import annotations

import json
import shlex
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from ..control.dispatch import DEFAULT_SIZES
from ..errors import BadInput
from ..graphs import make_provider
from ..io import cache_dir, check_distinct, check_output_file, emit, prepare_output_dir, write_json
from ..islands import Model, check_island, kind
from ..job.cases import Case, check_knobs, run_case
from ..job.steps import case_steps
from ..knobs import hazards as hz
from ..model.tiny import default_checkpoint
from ..progress import for_cases
from ..report import OUTPUTS as REPORT_FILES
from ..report import check_output as check_report_dir
from ..report import upstream as upstream_report
from ..report import write_report
from ..scheduler.prefix import check_block_size
from ..scheduler.sequence import UNSET, Sequence, request_json
from ..search.blind import blame_json, blame_lines, blame_minimal, failure, hunt_modes, is_blind, sequence_shape
from ..search.edges import PREFIX, RARE
from ..search.edges import ALL as EDGES
from ..search.edges import Edges
from ..search.hunt import Budget, Crash, Failure, FlakyHunt, hunt
from ..search.patch_blame import blame_patches
from ..search.strategies import size_of, space_for
from ..knobs.control import Control
from ..knobs.control import check as check_control
from ..upstream.paths import control_json, ready


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
    coverage: bool = False  # print the states the hunt's sequences reached (`search.edges`) after it
    control: str = "mirror"  # where the control decisions come from (`knobs.control`); a vLLM source with no
    # hazard is a blind hunt of vLLM itself (as patched), blamed on the shipped patches
    patches: tuple[str, ...] = ()  # patch files applied to the installed vLLM (`upstream.patches`)

    @property
    def ctl(self) -> Control:
        return Control(self.control, tuple(self.patches))


def kernel_sentinel(hazards, sentinel: int) -> int:
    """The pad sentinel the kernels run with: a hazard may force its own (the typed table's
    `sets["kernel_sentinel"]`), and a saved sequence must be scheduled for that one to replay."""
    return hz.options_for(hazards).sentinel(sentinel)


def default_mode(hazards) -> str:
    """piecewise, unless a hazard only exists in full mode (the table's `modes`)."""
    return "full" if any("piecewise" not in hz.HAZARDS[h].modes for h in hazards) else "piecewise"


EVERY_MODE = "every-mode"  # a saved blind hunt's name when it searched each mode of its profile


def save_path(o: HuntConfig, mode: str) -> Path:
    stack = "" if o.stack == "fixed" else "@" + o.stack
    stack += "" if not o.ctl.upstream else "@" + o.ctl.label()
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
    if o.ctl.upstream:
        parts += ["--control", o.control] + [x for p in o.patches for x in ("--patch", p)]
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
    if o.report and doc is not None and not doc["results"]:
        emit(f"report: not written ({doc['crash']}: a crash has no divergence to write up)")
    elif o.report and doc is not None and upstream_report.is_upstream(doc):
        upstream_report.write_upstream_report(doc, Path(o.report).absolute())
    elif o.report and doc is not None:
        write_report(doc, o.report, command=o.command, layer=o.layer, sentinel=o.sentinel, force=o.force,
                     what="--report", stack=o.stack)
        emit(f"report: {o.report}/REPORT.md")
    return rc


def _check(o: HuntConfig) -> tuple[str, Path]:
    """Everything refused before any work: the knobs, the island, the options, the outputs.
    Returns the mode and the save path."""
    check_knobs(o.hazards, o.repairs)
    check_control(o.ctl, o.stack, o.hazards, o.repairs, o.sentinel)
    ready(o.ctl)
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
    modes = hunt_modes(o, default_mode(o.hazards))
    save = save_path(o, modes[0] if len(modes) == 1 else EVERY_MODE)
    check_distinct([("--save", save), ("--json", o.json)], [("--report", o.report, REPORT_FILES)])
    if not o.save:
        save.parent.mkdir(parents=True, exist_ok=True)  # the cache's own folder for saved hunts
    check_output_file(save, "--save")
    check_output_file(o.json, "--json")
    if o.report and o.ctl.upstream:
        prepare_output_dir(o.report, o.force, "--report", names=upstream_report.OUTPUTS)
    elif o.report:
        check_report_dir(o.report, o.force, "--report")
    return modes, save


def run_hunt(o: HuntConfig, stats: dict | None = None) -> tuple[int, dict | None]:
    """The hunt itself; `stats` (when given) gets the seconds from the search's start to the first
    failing sequence (`first_s`) and to the minimal one (`minimal_s`), and the sequences run."""
    modes, save = _check(o)
    mode = modes[0]
    provider = make_provider(o.device)
    for m in modes:
        hz.check(o.hazards, o.repairs, m, provider.supports_streams, o.island, kind(o.island).eager)
    checkpoint = Path(o.model) if o.model else default_checkpoint(o.cache)
    model = Model(checkpoint, provider.device, o.layer, island="moe" if o.island == "moe" else "submod0")
    k, dp = sequence_shape(o)
    check_block_size(o.block_size, k, ("--block-size", "--spec-tokens"))
    case = Case(o.island, mode, tuple(o.hazards), tuple(o.repairs), spec_tokens=k, data_parallel=dp, stack=o.stack,
                block_size=o.block_size, control=o.ctl)

    edges = Edges(mode, k, space_for(DEFAULT_SIZES)["num_slots"]) if o.coverage else None

    def check(seq, m=None):
        c = case if m is None else replace(case, mode=m)
        if edges is not None:
            edges.watch(seq, c.mode)
        return failure(run_case(model, provider, c, seq, sentinel=o.sentinel))

    label = ",".join(o.hazards) or "blind " + (o.ctl.label() if o.ctl.upstream else o.stack)
    clock = stats if stats is not None else {}
    found, t0 = _search(o, check, model.cfg.vocab_size, modes, k, dp, label, clock)
    what = f"{label}, {o.island}, {'/'.join(modes)}" + ("" if o.stack == "fixed" or is_blind(o) else f", stack {o.stack}")
    if edges is not None:
        for line in coverage_lines(edges, clock["examples"], o.block_size):
            emit(line)
    if not found:
        emit(f"nothing found ({what}, k={k}) in {clock['examples']} sequences, "
             f"{time.perf_counter() - t0:.1f} s")
        return 0, None
    clock["minimal_s"] = round(time.perf_counter() - t0, 2)
    found.sort(key=lambda f: (isinstance(f.found, Crash), size_of(f.seq)))  # divergences first, smallest first
    docs = [_failure_doc(o, f, case, model, provider, checkpoint, save, k, dp, mode, clock, i == 0)
            for i, f in enumerate(found)]
    if is_blind(o):
        clock["blame_s"] = round(time.perf_counter() - t0, 2)
    doc = _publish(o, save, docs, found, what, clock)
    return 1, doc


def _search(o: HuntConfig, check, vocab: int, modes: tuple[str, ...], k: int, dp: bool, label: str,
            clock: dict) -> tuple[list, float]:
    """The search under its progress line: the failures found and the search's start time; `clock`
    gets the seconds to the first failure (`first_s`) and the sequences run (`examples`)."""
    progress = HuntProgress(f"hunt {o.island} {'/'.join(modes)} {label}")
    seen: list = []
    t0 = time.perf_counter()

    def shown(b: Budget) -> None:
        seen[:] = [b]
        if b.found_at is not None and "first_s" not in clock:
            clock["first_s"] = round(time.perf_counter() - t0, 2)
        progress(b)
    stopped = False
    try:
        found = hunt(check, o.max_examples, o.profile, vocab=vocab, cache=o.cache, progress=shown,
                     spec_tokens=k, data_parallel=dp, block_size=o.block_size, modes=modes if len(modes) > 1 else None,
                     **space_for(DEFAULT_SIZES))
    except KeyboardInterrupt:
        stopped = True  # the search did not end: no "done" line
        raise
    finally:
        progress.end(seen[0] if seen and not stopped else None)
    clock["examples"] = seen[0].spent if seen else 0
    return found, t0


def _publish(o: HuntConfig, save, docs: list, found: list, what: str, clock: dict) -> dict:
    """Save the result (the first failure, the others beside it), print each failure's lines and the
    one-line finding; returns the saved result."""
    doc = {**docs[0][0], **({"other_failures": [d for d, _ in docs[1:]]} if len(docs) > 1 else {})}
    write_json(save, doc, "--save")
    if o.json:
        write_json(o.json, doc)
    emit(f"time: first failure at {clock.get('first_s')} s, minimal sequence at {clock['minimal_s']} s "
         f"({clock['examples']} sequences run)")
    for i, (_, lines) in enumerate(docs[1:] + docs[:1]):  # the saved one last: its replay line ends the output
        if len(docs) > 1:
            emit(f"failure {i + 1} of {len(docs)}" + (" (the one saved)" if i == len(docs) - 1 else ""))
        for line in lines:
            emit(line)
    print(f"hunt ({what}) found: {found[0].found.line()}" + (f" (and {len(found) - 1} more)" if len(found) > 1 else ""),
          file=sys.stderr)
    return doc


def coverage_lines(edges: Edges, examples: int, block_size: int | None) -> list[str]:
    """`--coverage`: the steps of the hunt's sequences that reached each state (`search.edges`)."""
    names = EDGES + RARE + (PREFIX if block_size else ())
    width = max(map(len, names))
    return [f"coverage: steps reaching each state over {examples} sequences (0: never reached)"] + [
        f"  {n.ljust(width)}  {edges.counts[n]}" for n in names]


def _failure_doc(o: HuntConfig, f: Failure, case: Case, model, provider, checkpoint, save: Path, k: int, dp: bool,
                 default: str, clock: dict, saved: bool = True) -> tuple[dict, list[str]]:
    """One failure's result object and the lines that report it: its minimal sequence cut after the
    divergence and run once more (a crash is not: it would raise again), and for a blind hunt the
    rule at fault or that none explains it."""
    seq, div, mode = f.seq, f.found, f.mode or default
    case = replace(case, mode=mode)
    eff = kernel_sentinel(o.hazards, o.sentinel)
    minimal = {"requests": [request_json(r, ("accept",)) for r in seq.requests], "num_slots": seq.num_slots,
               "max_tokens": seq.max_tokens, "vocab": seq.vocab, "seed": seq.seed, "spec_tokens": seq.spec_tokens,
               "data_parallel": seq.data_parallel, "tail_dummies": seq.tail_dummies,
               **{key: getattr(seq, key) for key, unset in UNSET.items() if getattr(seq, key) != unset},
               "steps": [b.to_json() for b in case_steps(case, seq, None if eff == 0 else range(seq.num_slots))]}
    minimal = cut_after(minimal, div.step)
    n_steps = len(minimal["steps"])
    if o.ctl.upstream:  # vLLM's scheduler makes the steps again from the requests (its block ids are its pool's)
        minimal = {**{k: v for k, v in minimal.items() if k != "steps"}, "max_steps": n_steps}
    cut = Sequence.from_json(minimal)
    crash = isinstance(div, Crash)
    result = None if crash else run_case(model, provider, case, cut, sentinel=o.sentinel)
    doc = {"device": str(provider.device), "graph_provider": provider.name, "checkpoint": str(checkpoint),
           "torch": torch.__version__, "kernel_sentinel": eff, "stack": o.stack, **control_json(o.ctl),
           "spec_tokens": k,
           "data_parallel": dp, "mode": mode, "minimal_sequence": minimal,
           "results": [] if crash else [result.to_json()], "command": o.command,
           "replay": replay_line(o, mode, save)}
    lines = []
    if crash:
        doc["crash"] = div.line()
        lines.append("a crash, not a divergence: the suite or the stack's code failed on this sequence")
    elif is_blind(o) and o.ctl.upstream:
        pb = blame_patches(model, provider, case, cut, o.sentinel)
        doc["blame"] = pb.to_json()
        lines = pb.lines(o.ctl.label())
    elif is_blind(o):
        b = blame_minimal(model, provider, case, cut, o.sentinel)
        doc["blame"] = blame_json(b)
        lines = blame_lines(b, o.stack, hz.options_for(case.hazards, case.repairs, case.stack).control)
    clock.setdefault("minimal_steps", n_steps)
    clock.setdefault("first_divergence", div.line())
    lines += [json.dumps(minimal, indent=None), f"mode: {mode}",
              f"first {'divergence' if div.step is not None else 'finding' if not crash else 'failure'}: {div.line()}",
              f"{len(seq.requests)} requests, {n_steps} steps; "
              + (f"saved to {save}" if saved else f"kept in {save} under other_failures (save the line above to replay it)")]
    if saved:
        lines.append(f"replay: {replay_line(o, mode, save)}")
    return doc, lines
