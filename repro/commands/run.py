"""`repro run`: the main job from a typed config. Every output path is checked before any work,
the cases run in lockstep with progress on stderr, then the table, the JSON and the report are
written and the exit code decided (`results.exit_code`). A multi-rank run (`--island
forced_comm --tp N`) goes to `comm.run_forced_comm` and shares the table and the verdicts."""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from kernels import registry

from .. import comm
from ..errors import BadInput
from ..graphs import make_provider
from ..io import check_distinct, check_output_file, emit, streamed, wrap, write_json
from ..islands import Model, check_island
from ..knobs import hazards as hz
from ..knobs.control import Control
from ..knobs.control import check as check_control
from ..upstream.paths import control_json, ready
from ..model.tiny import default_checkpoint
from ..progress import for_cases
from ..report import OUTPUTS as REPORT_FILES
from ..report import check_output as check_report_dir
from ..report import write_report
from ..scheduler.prefix import check_block_size
from ..scheduler.sequence import Sequence, load_sequence
from ..job.cases import check_knobs, default_sequence, plan, run_case
from ..job.results import device_name, exit_code, format_table, verdict
from ..job.triggers import needs


DEFAULT_STEPS = 200
TRACELESS = ("moe", "forced_comm")  # islands whose runs write no trace lines


@dataclass(frozen=True)
class RunConfig:
    """What `repro run` needs, typed (the command line builds it; Python callers may too)."""

    command: str = "repro run"  # the command line, recorded in the JSON
    model: Path | None = None  # None: the embedded tiny checkpoint (in `cache`)
    device: str = "auto"
    island: str = "all"
    layer: int | None = None
    mode: str | None = None
    hazards: tuple[str, ...] = ()
    repairs: tuple[str, ...] = ()
    steps: int | None = None  # None: DEFAULT_STEPS (given with `sequence`, it is refused)
    seed: int | None = None  # None: 0 (given with `sequence`, it is refused)
    stack: str | None = None  # the stack profile every case starts from (`knobs.stacks`); None: the sequence
    # file's own (a hunt's), else "fixed"; a file found on another stack refuses it
    spec_tokens: int | None = None  # None: the plan's own (K=0 and K=2 rows, each hazard's K); given: every case's
    block_size: int | None = None  # prefix caching's block size for every case (None: mode "none")
    sentinel: int = 0
    sequence: Path | None = None
    baseline: bool = False  # the baseline rows only: no hazard planted
    trace: Path | None = None
    json: Path | None = None
    report: Path | None = None
    force: bool = False
    strict: bool = False
    amplify: bool = True
    reference_every: int | None = None
    tp: int = 1
    cache: Path | None = None  # None: `io.cache_dir`'s default
    kill: tuple | None = None  # forced_comm supervisor test hook: (rank, step, "kill" | "hang")
    comm_backend: str | None = None  # forced_comm process-group backend; None: the device's
    control: str = "mirror"  # where the control decisions come from (`knobs.control`): mirror, vllm, vllm-v2
    patches: tuple[str, ...] = ()  # patch files applied to the installed vLLM (`upstream.patches`)


def _explain(r, v: str) -> str:
    label = f"{r.case.island} {r.case.mode} {','.join(r.case.hazards) or 'baseline'}"
    if r.case.repairs:
        label += f" +{','.join(r.case.repairs)}"
    f = r.failure
    if f is not None:
        what = f.where() + (f" ({f.reason})" if f.reason else "")
    elif r.findings:
        what = f"{r.findings[0]['kind']}: {r.findings[0]['detail']}"
    elif v == "not triggered":
        what = f"the {r.steps} steps never reached it ({needs(r.case.hazards, r.case.repairs)}); try more --steps"
    else:
        what = f"nothing in {r.steps} steps"
    return f"{label}: {v}: {what}"


def _refuse_ignored(c: RunConfig, comm_run: bool) -> Control:
    """Options that would do nothing here are refused, not silently ignored. Returns the control source."""
    check_knobs(c.hazards, c.repairs)
    ctl = Control(c.control, tuple(c.patches))
    if comm_run and ctl.upstream:
        raise BadInput(f"--control {ctl.source}: island forced_comm has no control path (its ranks run the TP slice)")
    check_control(ctl, c.stack or "fixed", c.hazards, c.repairs, c.sentinel)
    ready(ctl)
    if c.force and not c.report:
        raise BadInput("--force: only with --report (it lets a report replace what repro wrote in DIR before)")
    if c.sequence and c.steps is not None:
        raise BadInput(f"--steps {c.steps}: --sequence {c.sequence} gives the steps (leave --steps out, or cut the file)")
    if c.sequence and c.seed is not None:
        raise BadInput(f"--seed {c.seed}: --sequence {c.sequence} gives the sequence (the seed makes a generated one)")
    if c.trace and (comm_run or c.island in TRACELESS):
        island = "forced_comm" if comm_run else c.island
        raise BadInput(f"--trace: island {island} writes no trace lines (only the chain islands do); leave --trace out")
    if comm_run and c.block_size is not None:
        raise BadInput(f"--block-size {c.block_size}: island forced_comm holds no GDN state to cache")
    if comm_run and c.mode:
        raise BadInput(f"--mode {c.mode}: island forced_comm has no capture mode to choose (its comm mode follows "
                       "the hazards and repairs)")
    if c.baseline and (c.hazards or c.repairs or comm_run):
        what = "--hazard" if c.hazards else "--repair" if c.repairs else "island forced_comm"
        raise BadInput(f"--baseline: not with {what} (the baseline rows plant no hazard and apply no repair"
                       + ("; forced_comm runs its own plan)" if comm_run else ")"))
    return ctl


def _stack(c: RunConfig, recorded: str | None) -> str:
    """The stack the cases start from: --stack, else the sequence file's own, else fixed. A file
    records the stack it was found on (a hunt's result, a report's sequence.json) as it records its
    spec_tokens and block size: replayed on another, the rules that made it fail are gone and the run
    would call it clean. A fix is applied with --repair, on the file's stack."""
    if c.stack and recorded and c.stack != recorded:
        raise BadInput(f"--stack {c.stack}: --sequence {c.sequence} was found on stack {recorded} (the file gives the "
                       "stack; leave --stack out, and apply a fix with --repair)")
    return c.stack or recorded or "fixed"


def run_command(c: RunConfig) -> int:
    """`repro run`: returns the exit code (0 clean, 1 divergence or missed hazard)."""
    if c.island not in ("all", "chain"):
        check_island(c.island)
    comm_run = c.tp > 1 or c.island == "forced_comm"
    ctl = _refuse_ignored(c, comm_run)
    report = _check_outputs(c)
    if comm_run:
        _refuse_for_comm(c, report)
        return _forced_comm(c)
    if c.tp != 1:
        raise BadInput(f"--tp {c.tp}: only island forced_comm runs on several ranks")

    seq, recorded = load_sequence(c.sequence) if c.sequence else (None, None)
    stack = _stack(c, recorded)
    if seq is not None:
        _refuse_beside_sequence(c, seq)
    provider = make_provider(c.device)
    # a sequence file gives every case its K: the plan's extra K rows would be copies of its own
    cases = plan(c.island, c.mode, c.hazards, c.repairs, provider.supports_streams,
                 seq.spec_tokens if seq is not None else c.spec_tokens, stack, c.block_size, ctl, baseline=c.baseline)
    if seq is None:
        check_block_size(c.block_size, max(case.spec_tokens for case in cases), ("--block-size", "--spec-tokens"))
    path = c.model or default_checkpoint(c.cache)
    model = Model(path, provider.device, c.layer, island="moe" if c.island == "moe" else "submod0")
    for flag in model.ckpt.stats.flags:  # loadable but suspicious (e.g. zero weight scales)
        print(f"repro: warning: {path}: {flag}", file=sys.stderr)
    if seq is not None:
        seq.check_fits(model.cfg.vocab_size, hz.options_for(c.hazards).sentinel(c.sentinel), f"--sequence {c.sequence}")
        cases = [replace(k, spec_tokens=seq.spec_tokens, data_parallel=seq.data_parallel, block_size=seq.block_size)
                 for k in cases]
    sequences = {}  # (K, data_parallel) -> the seeded sequence of that shape

    def sequence_for(case):
        if seq is not None:
            return seq
        key = (case.spec_tokens, case.data_parallel, case.block_size)
        if key not in sequences:
            sequences[key] = default_sequence(c.seed or 0, c.steps or DEFAULT_STEPS, vocab=model.cfg.vocab_size,
                                              spec_tokens=key[0], data_parallel=key[1], block_size=key[2])
        return sequences[key]
    t0 = time.perf_counter()
    results = _run_cases(c, model, provider, cases, sequence_for)
    emit(format_table(results))
    first = sequence_for(cases[0])
    _emit_summary(results, first, provider, t0)
    doc = {"command": c.command, "device": device_name(provider), "graph_provider": provider.name,
           "torch": torch.__version__, "checkpoint": str(path), "seed": None if c.sequence else c.seed or 0,
           "sentinel": c.sentinel, "layer": model.layer, "kernels": {op: registry.selected(op) for op in registry.ops()},
           "plugins": registry.plugins(), "stack": stack, **control_json(ctl), "sequence": _seq(first, ctl),
           "results": [_row(r, sequence_for(r.case), first, ctl) for r in results]}
    if c.json:
        write_json(c.json, doc)
    if report:
        write_report(doc, report, command=c.command, layer=c.layer, sentinel=c.sentinel, force=c.force,
                     what="--report")
        emit(f"report: {report}/REPORT.md")
    explicit = bool(c.hazards)
    _explain_each(results, explicit)
    return exit_code(results, explicit)


def _check_outputs(c: RunConfig):
    """The output paths, checked before any work (`repro/io.py`); returns the report folder, or None."""
    check_distinct([("--json", c.json), ("--trace", c.trace)], [("--report", c.report, REPORT_FILES)])
    check_output_file(c.json, "--json")
    check_output_file(c.trace, "--trace")
    return check_report_dir(c.report, c.force, "--report") if c.report else None


def _explain_each(results: list, explicit: bool) -> None:
    """A line on stderr for each run that diverged or missed its hazard (and, with hazards named, each
    that caught one or did not trigger it)."""
    for r in results:
        v = verdict(r)
        if v in ("DIVERGED", "MISSED") or (explicit and (r.detected or v == "not triggered")):
            print(f"repro: {_explain(r, v)}", file=sys.stderr)


def _refuse_for_comm(c: RunConfig, report) -> None:
    """What a forced_comm / `--tp` run cannot take."""
    if not c.amplify:
        raise BadInput("--no-amplify: forced_comm runs always amplify (not wired through its ranks yet)")
    if c.reference_every is not None:
        raise BadInput("--reference-every: forced_comm runs have no third copy (it runs on the chain islands)")
    if report:
        raise BadInput("--report: forced_comm / --tp runs have no report yet (write --json and see its rows)")


def _refuse_beside_sequence(c: RunConfig, seq: Sequence) -> None:
    """A sequence file gives the drafts and the block size: a flag that says otherwise is refused."""
    if c.spec_tokens is not None and c.spec_tokens != seq.spec_tokens:
        raise BadInput(f"--spec-tokens {c.spec_tokens}: --sequence {c.sequence} has spec_tokens {seq.spec_tokens} "
                       "(the file gives the drafts; leave --spec-tokens out)")
    if c.block_size is not None and c.block_size != seq.block_size:
        raise BadInput(f"--block-size {c.block_size}: --sequence {c.sequence} has block_size {seq.block_size} "
                       "(the file gives the block size; leave --block-size out)")


def _run_cases(c: RunConfig, model, provider, cases: list, sequence_for) -> list:
    """Each case over its sequence, one progress line each, the trace streamed to `--trace`."""
    results = []
    progress = for_cases(len(cases))
    with streamed(c.trace, "--trace") as trace:
        try:
            for case in cases:
                step_cb = progress.start(f"{case.island} {case.mode} {','.join(case.hazards) or 'baseline'}"
                                         + (f" +{','.join(case.repairs)}" if case.repairs else ""))
                r = run_case(model, provider, case, sequence_for(case), sentinel=c.sentinel, trace=trace, progress=step_cb,
                             strict=c.strict, amplify=c.amplify, reference_every=c.reference_every)
                results.append(r)
                progress.finish(verdict(r))
        finally:
            progress.clear()
    return results


def _emit_summary(results: list, first: Sequence, provider, t0: float) -> None:
    """The lines under the table: runs, steps, seconds, the provider, and the most of its bound the
    rounding used against the third copy."""
    lines = [f"{len(results)} runs, {len(first.batches())} steps each at most, {time.perf_counter() - t0:.1f} s, "
             f"provider {provider.name} on {device_name(provider)} (replay speed: `repro bench`)"]
    used = [(v, k, r) for r in results for k, v in r.bound_usage.items()]
    if used:
        v, k, r = max(used, key=lambda u: u[0])
        lines.append(f"against the third copy, rounding used at most {v:.3g} of its bound ({k}, {r.case.island} "
                     f"{r.case.mode}{' ' + ','.join(r.case.hazards) if r.case.hazards else ''}); per tensor: --json")
    for line in lines:  # the table's width
        emit("\n".join(wrap(line)))


def _seq(seq: Sequence, ctl: Control) -> dict:
    """A sequence as a result records it: with the mirror's steps, or under a vLLM source without
    them (vLLM's scheduler makes them again from the requests: `job.steps`), unless they were given."""
    d = seq.to_json()
    if ctl.upstream and not seq.steps:
        del d["steps"]
    return d


def _row(r, seq: Sequence, first: Sequence, ctl: Control) -> dict:
    """A result row; one whose sequence is not the document's (other drafts, dummy steps) carries its own."""
    d = r.to_json()
    if seq is not first:
        d["sequence"] = _seq(seq, ctl)
    return d


def _forced_comm(c: RunConfig) -> int:
    if c.island not in ("forced_comm", "all"):
        raise BadInput(f"--tp {c.tp}: only island forced_comm runs on several ranks, not {c.island}")
    batches = Sequence.load(c.sequence).batches() if c.sequence else None
    res = comm.run_forced_comm(c.model or default_checkpoint(c.cache), tp=c.tp, device=c.device,
                               hazards=list(c.hazards), repairs=list(c.repairs), steps=c.steps or DEFAULT_STEPS,
                               seed=c.seed or 0,
                               layer=c.layer or 0, timeout=600.0, batches=batches, kill_rank=c.kill,
                               backend=c.comm_backend)
    emit(comm.format_table(res))
    for r in res["results"]:
        if r["verdict"] in ("DIVERGED", "MISSED") or (c.hazards and r["diverged"]):
            print(f"repro: forced_comm {','.join(r['hazards']) or 'baseline'}: {r['verdict']}", file=sys.stderr)
    if c.json:
        res["command"] = c.command
        write_json(c.json, res)
    return comm.exit_code(res, bool(c.hazards))
