"""`repro` command line. Exit codes: 0 clean, 1 divergence found (or a planted hazard missed),
2 bad input (one line on stderr, never a traceback).

This is the edge: arguments are parsed, checked and turned into plain values here (the argparse
Namespace goes no further), environment variables are read here, and every output path is
checked before any work starts, so a long run never ends by losing its results."""
from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from pathlib import Path

from ..errors import BadInput
from ..io import check_output_file, install_dir, prepare_output_dir, staging_dir, write_json

MAX_STEPS = 10_000  # --steps above this is refused: a run that long belongs in a --sequence file
KILL_ENV = "REPRO_FORCED_COMM_KILL"  # rank:step[:hang], a test hook of the forced_comm supervisor
REPORT_NAMES = ("REPORT.md", "env.txt", "sequence.json", "result.json", "repro_standalone.py",
                "repro_weights.safetensors")


class _Parser(argparse.ArgumentParser):
    """Usage errors as one line on stderr and exit 2, like every other bad input."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


def _count(lo: int, hi: int | None = None):
    def parse(s: str) -> int:
        try:
            v = int(s)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{s!r} is not an integer") from None
        if v < lo or (hi is not None and v > hi):
            raise argparse.ArgumentTypeError(f"{v} is out of range {lo}..{hi if hi is not None else ''}")
        return v
    return parse


def _counts(lo: int):
    """A comma-separated list of integers >= `lo` (at least one)."""
    one = _count(lo)

    def parse(s: str) -> tuple[int, ...]:
        items = [x.strip() for x in s.split(",")]
        if not s.strip() or not all(items):
            raise argparse.ArgumentTypeError(f"{s!r} is not a comma-separated list of integers")
        return tuple(one(x) for x in items)
    return parse


def _model_path(model) -> Path:
    if model:
        return Path(model)
    from ..model.tiny import default_checkpoint
    return default_checkpoint()


def _command(argv) -> str:
    return "repro " + " ".join(shlex.quote(x) for x in argv)


def _env(a) -> int:
    import json
    from ..env import environment, format_env
    d = environment()
    print(json.dumps(d, indent=2) if a.json else format_env(d))
    return 0


def _make_tiny(a) -> int:
    from ..model.tiny import make_tiny
    path = make_tiny(a.dir, seed=a.seed, preset=a.preset, quantised=a.quantised, naming=a.naming,
                     experts=a.experts, shards=a.shards)
    print(f"wrote {path}")
    return 0


def _inspect(a) -> int:
    import json
    from ..model.inspect import format_inspect, inspect
    d = inspect(a.model)
    print(json.dumps(d, indent=2) if a.json else format_inspect(d))
    return 2 if d.get("problems") else 0


def _write_report(doc: dict, out: Path, *, command=None, **kw) -> Path:
    """The report module writes a fresh directory; it is built in a scratch folder inside `out`
    and moved in entry by entry, so what the user keeps in `out` is never replaced."""
    import shutil

    from ..report import write_report
    created = not out.exists()
    stage = staging_dir(out)
    try:
        built = write_report(doc, stage / "report", command=command, **kw)
        install_dir(built, out)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
        if created and out.is_dir() and not any(out.iterdir()):
            out.rmdir()  # a failed first report leaves no empty folder behind
    return out


def _explain(r, v: str) -> str:
    label = f"{r.case.island} {r.case.mode} {','.join(r.case.hazards) or 'baseline'}"
    if r.case.repairs:
        label += f" +{','.join(r.case.repairs)}"
    f = r.failure
    if f is not None:
        what = f.where() + (f" ({f.reason})" if f.reason else "")
    elif r.findings:
        what = f"{r.findings[0]['kind']}: {r.findings[0]['detail']}"
    else:
        what = f"nothing in {r.steps} steps"
    return f"{label}: {v}: {what}"


def _run(a) -> int:
    if a.island != "all":
        from ..islands import check_island
        check_island(a.island)
    check_output_file(a.json, "--json")
    check_output_file(a.trace, "--trace")
    report = prepare_output_dir(a.report, a.force, "--report", REPORT_NAMES) if a.report else None
    if a.tp > 1 or a.island == "forced_comm":
        if a.no_amplify:
            raise BadInput("--no-amplify: forced_comm runs always amplify (not wired through its ranks yet)")
        if a.reference_every is not None:
            raise BadInput("--reference-every: forced_comm runs have no third copy (it runs on the chain islands)")
        if report:
            raise BadInput("--report: forced_comm / --tp runs have no report yet (write --json and see its rows)")
        return _forced_comm(a)
    if a.tp != 1:
        raise BadInput(f"--tp {a.tp}: only island forced_comm runs on several ranks")
    import torch

    from ..graphs import make_provider
    from ..search.hunt import kernel_sentinel
    from ..islands import Model
    from ..job.cases import default_sequence, plan, run_case
    from ..job.results import device_name, format_table, verdict
    from ..job.results import exit_code
    from ..progress import for_cases
    from ..scheduler.sequence import Sequence

    seq = Sequence.load(a.sequence) if a.sequence else None
    provider = make_provider(a.device)
    cases = plan(a.island, a.mode, a.hazard, a.repair, provider.supports_streams)
    path = _model_path(a.model)
    model = Model(path, provider.device, a.layer, island="moe" if a.island == "moe" else "submod0")
    for flag in model.ckpt.stats.flags:  # loadable but suspicious (e.g. zero weight scales)
        print(f"repro: warning: {path}: {flag}", file=sys.stderr)
    if seq is not None:
        seq.check_fits(model.cfg.vocab_size, kernel_sentinel(a.hazard, a.sentinel), f"--sequence {a.sequence}")
    else:
        seq = default_sequence(a.seed, a.steps, vocab=model.cfg.vocab_size)
    results = []
    t0 = time.perf_counter()
    progress = for_cases(len(cases))
    with open(a.trace, "w") if a.trace else _nothing() as trace:
        try:
            for case in cases:
                step_cb = progress.start(f"{case.island} {case.mode} {','.join(case.hazards) or 'baseline'}"
                                         + (f" +{','.join(case.repairs)}" if case.repairs else ""))
                r = run_case(model, provider, case, seq, sentinel=a.sentinel, trace=trace, progress=step_cb,
                             strict=a.strict, amplify=not a.no_amplify, reference_every=a.reference_every)
                results.append(r)
                progress.finish(verdict(r))
        finally:
            progress.clear()
    print(format_table(results))
    print(f"{len(results)} runs, {len(seq.batches())} steps each at most, {time.perf_counter() - t0:.1f} s, "
          f"provider {provider.name} on {device_name(provider)}")
    used = [(v, k, r) for r in results for k, v in r.bound_usage.items()]
    if used:
        v, k, r = max(used, key=lambda u: u[0])
        print(f"against the third copy, rounding used at most {v:.3g} of its bound ({k}, {r.case.island} "
              f"{r.case.mode}{' ' + ','.join(r.case.hazards) if r.case.hazards else ''}); per tensor: --json")
    from kernels import registry  # imported and checked by `_kernels` before the run
    doc = {"command": _command(a.argv), "device": device_name(provider), "graph_provider": provider.name,
           "torch": torch.__version__, "checkpoint": str(path), "seed": a.seed, "sentinel": a.sentinel,
           "layer": model.layer, "kernels": {op: registry.selected(op) for op in registry.ops()},
           "plugins": registry.plugins(), "sequence": seq.to_json(), "results": [r.to_json() for r in results]}
    if a.json:
        write_json(a.json, doc)
    if report:
        out = _write_report(doc, report, command=doc["command"], layer=a.layer, sentinel=a.sentinel)
        print(f"report: {out}/REPORT.md")
    explicit = bool(a.hazard)
    for r in results:
        v = verdict(r)
        if v in ("DIVERGED", "MISSED") or (explicit and r.detected):
            print(f"repro: {_explain(r, v)}", file=sys.stderr)
    return exit_code(results, explicit)


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def parse_kill(value: str | None):
    """`$REPRO_FORCED_COMM_KILL` = rank:step[:kill|hang] (read here, at the edge, only)."""
    if not value:
        return None
    parts = value.split(":")
    try:
        return (int(parts[0]), int(parts[1]), *(parts[2:3] or ["kill"]))
    except (ValueError, IndexError):
        raise BadInput(f"{KILL_ENV}={value!r}: expected rank:step[:hang]") from None


def _forced_comm(a) -> int:
    from .. import comm
    from ..scheduler.sequence import Sequence
    if a.island not in ("forced_comm", "all"):
        raise BadInput(f"--tp {a.tp}: only island forced_comm runs on several ranks, not {a.island}")
    batches = Sequence.load(a.sequence).batches() if a.sequence else None
    res = comm.run_forced_comm(a.model, tp=a.tp, device=a.device, hazards=list(a.hazard), repairs=list(a.repair),
                               steps=a.steps, seed=a.seed, layer=a.layer or 0, timeout=600.0, batches=batches,
                               kill_rank=parse_kill(os.environ.get(KILL_ENV)),
                               backend=os.environ.get("REPRO_COMM_BACKEND") or None)
    print(comm.format_table(res))
    for r in res["results"]:
        if r["verdict"] in ("DIVERGED", "MISSED") or (a.hazard and r["diverged"]):
            print(f"repro: forced_comm {','.join(r['hazards']) or 'baseline'}: {r['verdict']}", file=sys.stderr)
    if a.json:
        res["command"] = _command(a.argv)
        write_json(a.json, res)
    return comm.exit_code(res, bool(a.hazard))


def _hunt(a) -> int:
    from ..search.hunt import HuntOptions, hunt_cli
    report = prepare_output_dir(a.report, a.force, "--report", REPORT_NAMES) if a.report else None
    o = HuntOptions(checkpoint=_model_path(a.model), model=a.model, device=a.device,
                    island="chain" if a.island in ("all", "chain") else a.island, layer=a.layer, mode=a.mode,
                    hazards=tuple(a.hazard), repairs=tuple(a.repair), sentinel=a.sentinel,
                    max_examples=a.max_examples, profile=a.profile, save=a.save, json=a.json)
    from ..search.hunt import FlakyHunt
    try:
        rc, doc = hunt_cli(o)
    except FlakyHunt as e:
        print(f"repro: {e}", file=sys.stderr)
        return 1
    if report and doc is not None:
        out = _write_report(doc, report, command=_command(a.argv), layer=a.layer, sentinel=a.sentinel)
        print(f"report: {out}/REPORT.md")
    return rc


def _bench(a) -> int:
    check_output_file(a.json, "--json")
    check_output_file(a.plot, "--plot")
    from ..bench.output import bench_cli
    return bench_cli(a)


def _report(a) -> int:
    from ..report import SCRIPT, WEIGHTS, load_result
    out = prepare_output_dir(a.output, a.force, "-o", REPORT_NAMES)
    doc = load_result(a.result)
    _write_report(doc, out, result_path=a.result, index=a.case, layer=a.layer, sentinel=a.sentinel,
                  verify=not a.no_verify, seed=a.seed, weights=a.weights)
    print(f"wrote {out}/REPORT.md, env.txt, sequence.json" + (f", {SCRIPT}" if (out / SCRIPT).exists() else "")
          + (f", {WEIGHTS}" if (out / WEIGHTS).exists() else ""))
    return 0


def knobs_help() -> str:
    """The hazard and repair names with one line each, from the one table (for `run --help`)."""
    from ..knobs import hazards as hz
    lines = ["hazards (--hazard, repeatable):"]
    lines += [f"  {h.name:24} {h.mechanism}" for h in hz.HAZARDS.values()]
    lines.append("repairs (--repair, repeatable):")
    lines += [f"  {r.name:24} {r.what}" for r in hz.REPAIRS.values()]
    lines.append("exit codes: 0 baseline clean and every planted hazard detected; 1 a divergence, a finding "
                 "on a clean case, a MISSED hazard, or (with --hazard) the hazard detected; 2 bad input.")
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="repro", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=_Parser)
    raw = argparse.RawDescriptionHelpFormatter

    s = sub.add_parser("env", help="torch, devices, graph providers, optional packages")
    s.add_argument("--json", action="store_true", help="print JSON instead of text")

    s = sub.add_parser("make-tiny", help="write a small checkpoint in the real Quark W8A8 layout")
    s.add_argument("dir", help="a new or empty directory")
    s.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    s.add_argument("--preset", default="tiny", choices=["tiny", "real-layer", "qwen3.6-35b-a3b"],
                   help="tiny (runs in ms on a CPU), real-layer (real dimensions, 4 layers, 4096 vocab) or the "
                        "full qwen3.6-35b-a3b text model (tens of GiB: refused when memory is short)")
    s.add_argument("--quantised", default="production", choices=["production", "experts", "none"],
                   help="production: every linear W8A8 but the routers and lm_head; experts: routed experts only; "
                        "none: BF16")
    s.add_argument("--naming", default="split", choices=["split", "fused"],
                   help="GDN projections split (Qwen3.5/3.6) or fused qkvz/ba (Qwen3-Next)")
    s.add_argument("--experts", default="per_expert", choices=["per_expert", "fused"],
                   help="routed experts one tensor each, or fused gate_up_proj/down_proj stacks")
    s.add_argument("--shards", type=_count(1), default=1, help="safetensors files (an index when > 1)")

    s = sub.add_parser("inspect", help="layers, types, quant scheme, tensor check")
    s.add_argument("model", help="checkpoint directory")
    s.add_argument("--json", action="store_true", help="print JSON instead of the table")

    def common(s):
        s.add_argument("--model", help="checkpoint directory (default: the embedded tiny checkpoint)")
        s.add_argument("--device", default="auto", help="auto | cpu | cuda | xpu")
        s.add_argument("--layer", type=_count(0), default=None,
                       help="layer index (default: the first of the right type)")
        s.add_argument("--mode", choices=["piecewise", "full"], default=None, help="capture mode (default: both)")
        s.add_argument("--hazard", action="append", default=[], help="plant a hazard (repeatable; listed below)")
        s.add_argument("--repair", action="append", default=[], help="apply a repair (repeatable; listed below)")
        s.add_argument("--seed", type=int, default=0, help="seed of the request sequence")
        s.add_argument("--sentinel", type=int, choices=[-1, 0], default=0,
                       help="the pad sentinel the kernels skip: 0 (slot 0 is a null block, vLLM's default) or -1")
        s.add_argument("--json", help="write the result (strict JSON) here")
        s.add_argument("--report", metavar="DIR",
                       help="also write a bug report here (REPORT.md, env.txt, repro_standalone.py)")
        s.add_argument("--force", action="store_true",
                       help="--report into a non-empty DIR: replace what repro wrote there before, keep the rest")
        plugin(s)

    def plugin(s):
        s.add_argument("--plugin", action="append", default=[], metavar="MODULE",
                       help="import MODULE first: it registers kernel providers that $REPRO_KERNELS / "
                       "--kernels can then select (repeatable; also $REPRO_PLUGINS=mod1,mod2)")

    s = sub.add_parser("run", help="the main job: lockstep eager vs replay, baseline and hazards",
                       formatter_class=raw, epilog=knobs_help())
    common(s)
    s.add_argument("--island", default="all", help="all | submod0 | gdn_core | submod1 | moe | forced_comm")
    s.add_argument("--tp", type=_count(1, 64), default=1, help="tensor-parallel ranks (island forced_comm only)")
    s.add_argument("--steps", type=_count(1, MAX_STEPS), default=200,
                   help=f"scheduler steps of the seeded sequence (1..{MAX_STEPS}; more belongs in a --sequence file)")
    s.add_argument("--sequence", help="replay this request sequence (JSON, e.g. from `repro hunt --save`)")
    s.add_argument("--trace", help="write per-step digests here (JSON lines)")
    s.add_argument("--strict", action="store_true",
                   help="batch variance and kernel nondeterminism fail the run too (default: reported, exit 0)")
    s.add_argument("--no-amplify", action="store_true", help="leave stream races to their natural timing "
                   "(default: poison what an early read sees and delay the producer, so they happen every step)")
    s.add_argument("--reference-every", type=_count(0), default=None, metavar="N",
                   help="step the independent third copy (own weights, reference kernels) every N steps, and at "
                        "every step where eager and replay differ; it names the copy that departed and finds faults "
                        "both copies share (default: 1 on the CPU, 16 on a GPU; 0: off)")

    s = sub.add_parser("hunt", help="Hypothesis search for a minimal diverging sequence",
                       formatter_class=raw, epilog=knobs_help())
    common(s)
    s.add_argument("--island", default="all", help="all (the chain) | submod0 | gdn_core | submod1 | moe")
    s.add_argument("--max-examples", type=_count(1), default=None,
                   help="sequences to try (default: the profile's, or 60 without --profile)")
    s.add_argument("--profile", default=None, choices=["ci", "dev", "soak"],
                   help="ci: 25 derandomised; dev: 150; soak: 5000 (database under $REPRO_CACHE)")
    s.add_argument("--save", help="where to save the minimal sequence (default: $REPRO_CACHE/hunts/"
                                  "ISLAND-HAZARD-MODE.json)")

    s = sub.add_parser("report", help="REPORT.md, env.txt and a standalone script from a result JSON")
    s.add_argument("result", help="a `repro run --json` or `repro hunt` result file")
    s.add_argument("-o", "--output", required=True, metavar="DIR",
                   help="the report directory: new or empty (or one repro wrote, with --force)")
    s.add_argument("--force", action="store_true", help="replace what repro wrote in DIR before, keep the rest")
    s.add_argument("--case", type=_count(0), default=None, help="which result row (default: the first divergence)")
    s.add_argument("--layer", type=_count(0), default=None,
                   help="the --layer the result was run with (default: first GDN)")
    s.add_argument("--sentinel", type=int, choices=[-1, 0], default=None, help="the --sentinel the result was run with")
    s.add_argument("--seed", type=int, default=0, help="seed of the standalone script's random weights")
    s.add_argument("--weights", choices=["auto", "seed", "embed"], default="auto",
                   help="standalone weights: seeded if that reproduces (auto), always seeded, or embedded")
    s.add_argument("--no-verify", action="store_true", help="do not run the standalone script here")

    s = sub.add_parser("bench", help="eager vs replay, repair costs, the bandwidth floor")
    s.add_argument("--model", help="checkpoint directory (default: a synthetic one of --preset)")
    s.add_argument("--preset", default="tiny", choices=["tiny", "real-layer"],
                   help="synthetic checkpoint when no --model: tiny (embedded) or real-layer (real dimensions)")
    s.add_argument("--device", default="auto", help="auto | cpu | cuda | xpu")
    plugin(s)
    s.add_argument("--island", default="all", help="all | chain | submod0 | gdn_core | submod1 | moe")
    s.add_argument("--mode", choices=["piecewise", "full"], default=None, help="chain capture mode (default: both)")
    s.add_argument("--batches", default="1,8,32", help="decode batch sizes, comma-separated")
    s.add_argument("--iters", type=_count(1), default=50, help="timed samples per measurement (median)")
    s.add_argument("--warmup", type=_count(0), default=5, help="untimed calls before the samples")
    s.add_argument("--kernels", default=None, help="kernel providers, e.g. all=triton (as $REPRO_KERNELS)")
    s.add_argument("--seed", type=int, default=0, help="seed of the inputs")
    s.add_argument("--no-repairs", action="store_true", help="skip the repair-cost rows")
    s.add_argument("--no-tiny-rates", action="store_true",
                   help="skip the CPU tiny checkpoint's lockstep steps/s and Hypothesis examples/s")
    s.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    s.add_argument("--profile", type=_count(0), default=0, metavar="N",
                   help="also profile N replays of each chain row: where the time goes, kernel by kernel")
    s.add_argument("--json", help="write results here")
    s.add_argument("--plot", help="write a PNG of replay/eager and replay/floor here (needs matplotlib)")
    s.add_argument("--lockstep-rates", action="store_true",
                   help="also: checked lockstep steps/s per island (whole-state and weight checks on), the two "
                        "copies with nothing checked (the floor), hunt examples/s at this checkpoint and device, "
                        "and where a step's time goes")
    s.add_argument("--lockstep-steps", type=_count(1), default=400, help="steps a lockstep-rates case (default 400)")
    s.add_argument("--hunt-examples", type=_count(0), default=20, help="Hypothesis examples for the hunt rate")
    s.add_argument("--reference-every", type=_counts(1), default=None, metavar="N[,N...]",
                   help="the lockstep-rates' third-copy rows at these cadences, one row each, so a cadence's cost "
                        "is read off one run (default: the device's, 1 on the CPU and 16 on a GPU)")
    return p


def _kernels(plugins) -> None:
    """Import this project's `kernels` (refusing another package of that name in one line; a bad
    $REPRO_KERNELS or $REPRO_PLUGINS is refused there), then the --plugin modules."""
    from ..env import project_kernels
    kernels = project_kernels()
    if plugins:
        kernels.registry.load_plugins(plugins)


def _bad_kernels(e: Exception) -> bool:
    """Bad input about kernels: a selection or plugin `kernels` refused (its own error class: it
    imports nothing of repro's), or another package shadowing this project's `kernels`."""
    if type(e).__module__ == "kernels.errors":
        return True
    from ..env import KernelsShadowed
    return isinstance(e, KernelsShadowed)


def main(argv=None) -> int:
    try:
        a = parser().parse_args(argv)
    except SystemExit as e:  # usage errors (one line, see _Parser) and --help: a return code in-process
        return e.code if isinstance(e.code, int) else 2
    a.argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if a.cmd in ("run", "hunt", "bench"):
            _kernels(a.plugin)
        return {"env": _env, "make-tiny": _make_tiny, "inspect": _inspect, "run": _run, "hunt": _hunt,
                "bench": _bench, "report": _report}[a.cmd](a)
    except BadInput as e:
        print(f"repro: error: {e}", file=sys.stderr)
        return 2
    except (ValueError, ImportError) as e:
        if not _bad_kernels(e):
            raise
        print(f"repro: error: {e}", file=sys.stderr)
        return 2
    except MemoryError:
        print("repro: error: out of memory (try a smaller preset, fewer steps, or another --device)", file=sys.stderr)
        return 2
    except RuntimeError as e:
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(e, getattr(torch, "OutOfMemoryError", ())):
            print(f"repro: error: out of memory on the device ({str(e).splitlines()[0][:160]})", file=sys.stderr)
            return 2
        raise
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
