"""`repro` command line. Exit codes: 0 clean, 1 divergence found, 2 bad input."""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from .errors import BadInput


def _write_json(path: str, obj) -> None:
    """Atomic: a reader never sees half a file."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=p.name + ".", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")
    os.replace(tmp, p)


def _env(a) -> int:
    from .env import environment, format_env
    d = environment()
    print(json.dumps(d, indent=2) if a.json else format_env(d))
    return 0


def _make_tiny(a) -> int:
    from .tiny import make_tiny
    path = make_tiny(a.dir, seed=a.seed, preset=a.preset, quantised=a.quantised, naming=a.naming,
                     experts=a.experts)
    print(f"wrote {path}")
    return 0


def _inspect(a) -> int:
    from .inspect import format_inspect, inspect
    d = inspect(a.model)
    print(json.dumps(d, indent=2) if a.json else format_inspect(d))
    return 2 if d.get("problems") else 0


def _model_path(a) -> Path:
    if a.model:
        return Path(a.model)
    from .tiny import default_checkpoint
    return default_checkpoint()


def _run(a) -> int:
    import torch

    from .graphs import make_provider
    from .islands import Model, check_island
    from .job import default_sequence, device_name, format_table, plan, progress_bar, run_case
    from .sequence import Sequence

    if a.island != "all":
        check_island(a.island)
    if a.tp > 1 or a.island == "forced_comm":
        if a.report:
            raise BadInput("--report: forced_comm / --tp runs have no report yet (write --json and see its rows)")
        from .comm import run_forced_comm_cli
        return run_forced_comm_cli(a)
    provider = make_provider(a.device)
    cases = plan(a.island, a.mode, a.hazard, a.repair, provider.supports_streams)
    path = _model_path(a)
    model_island = "moe" if a.island == "moe" else "submod0"
    model = Model(path, provider.device, a.layer, island=model_island)
    seq = Sequence.load(a.sequence) if a.sequence else default_sequence(a.seed, a.steps, vocab=model.cfg.vocab_size)
    trace = open(a.trace, "w") if a.trace else None
    results = []
    t0 = time.perf_counter()
    try:
        for i, case in enumerate(cases):
            label = f"[{i + 1}/{len(cases)}] {case.island} {case.mode} {','.join(case.hazards) or 'baseline'}"
            results.append(run_case(model, provider, case, seq, sentinel=a.sentinel, trace=trace,
                                    progress=progress_bar(label)))
    finally:
        if trace:
            trace.close()
    print(format_table(results))
    print(f"{len(results)} runs, {len(seq.batches())} steps each at most, {time.perf_counter() - t0:.1f} s, "
          f"provider {provider.name} on {device_name(provider)}")
    from .job import verdict
    bad = [r for r in results if verdict(r) in ("DIVERGED", "MISSED")]
    unexpected_div = [r for r in results if r.case.expect == "clean" and r.detected]
    doc = {"device": device_name(provider), "graph_provider": provider.name,
           "torch": torch.__version__, "checkpoint": str(path), "seed": a.seed,
           "sequence": seq.to_json(), "results": [r.to_json() for r in results]}
    if a.json:
        _write_json(a.json, doc)
    if a.report:
        from .report import report_hook
        report_hook(doc, a)
    for r in bad:
        print(f"{r.case.island} {r.case.mode} {','.join(r.case.hazards) or 'baseline'}: {verdict(r)}", file=sys.stderr)
    if any(r.diverged for r in results if r.case.expect == "clean") or unexpected_div:
        return 1
    if a.hazard and any(r.detected for r in results):
        return 1
    return 0


def _hunt(a) -> int:
    from .hunt import hunt_cli
    return hunt_cli(a)


def _bench(a) -> int:
    from .bench import bench_cli
    return bench_cli(a)


def _report(a) -> int:
    from .report import report_cli
    return report_cli(a)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="repro", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)

    s = sub.add_parser("env", help="torch, devices, graph providers, optional packages")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=_env)

    s = sub.add_parser("make-tiny", help="write a small checkpoint in the real Quark W8A8 layout")
    s.add_argument("dir")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--preset", default="tiny", help="tiny | real-layer | qwen3.6-35b-a3b")
    s.add_argument("--quantised", default="production", choices=["production", "experts", "none"])
    s.add_argument("--naming", default="split", choices=["split", "fused"])
    s.add_argument("--experts", default="per_expert", choices=["per_expert", "fused"])
    s.set_defaults(fn=_make_tiny)

    s = sub.add_parser("inspect", help="layers, types, quant scheme, tensor check")
    s.add_argument("model")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=_inspect)

    def common(s):
        s.add_argument("--model", help="checkpoint directory (default: the embedded tiny checkpoint)")
        s.add_argument("--device", default="auto", help="auto | cpu | cuda | xpu")
        s.add_argument("--island", default="all", help="all | submod0 | gdn_core | submod1 | moe | forced_comm")
        s.add_argument("--layer", type=int, default=None, help="layer index (default: the first of the right type)")
        s.add_argument("--mode", choices=["piecewise", "full"], default=None, help="default: both")
        s.add_argument("--hazard", action="append", default=[], help="plant a hazard (repeatable)")
        s.add_argument("--repair", action="append", default=[], help="apply a repair (repeatable)")
        s.add_argument("--seed", type=int, default=0)
        s.add_argument("--sentinel", type=int, choices=[-1, 0], default=0, help="the kernels' pad sentinel")
        s.add_argument("--tp", type=int, default=1, help="tensor-parallel ranks (forced_comm)")
        s.add_argument("--json", help="write results here")
        s.add_argument("--report", metavar="DIR",
                       help="also write a bug report here (REPORT.md, env.txt, repro_standalone.py)")

    s = sub.add_parser("run", help="the main job: lockstep eager vs replay, baseline and hazards")
    common(s)
    s.add_argument("--steps", type=int, default=200)
    s.add_argument("--sequence", help="replay this request sequence (JSON, e.g. from `repro hunt`)")
    s.add_argument("--trace", help="write per-step digests here (JSON lines)")
    s.set_defaults(fn=_run)

    s = sub.add_parser("hunt", help="Hypothesis search for a minimal diverging sequence")
    common(s)
    s.add_argument("--max-examples", type=int, default=60)
    s.add_argument("--profile", default=None, help="ci | dev | soak")
    s.add_argument("--save", help="where to save the minimal sequence (default: the cache dir)")
    s.set_defaults(fn=_hunt)

    s = sub.add_parser("report", help="REPORT.md, env.txt and a standalone script from a result JSON")
    s.add_argument("result", help="a `repro run --json` or `repro hunt` result file")
    s.add_argument("-o", "--output", required=True, metavar="DIR", help="the report directory (written atomically)")
    s.add_argument("--case", type=int, default=None, help="which result row (default: the first divergence)")
    s.add_argument("--layer", type=int, default=None, help="the --layer the result was run with (default: first GDN)")
    s.add_argument("--sentinel", type=int, choices=[-1, 0], default=None, help="the --sentinel the result was run with")
    s.add_argument("--seed", type=int, default=0, help="seed of the standalone script's random weights")
    s.add_argument("--weights", choices=["auto", "seed", "embed"], default="auto",
                   help="standalone weights: seeded if that reproduces (auto), always seeded, or embedded")
    s.add_argument("--no-verify", action="store_true", help="do not run the standalone script here")
    s.add_argument("--force", action="store_true",
                   help="write into a non-empty DIR, replacing only what repro wrote there before")
    s.set_defaults(fn=_report)

    s = sub.add_parser("bench", help="eager vs replay, repair costs, the bandwidth floor")
    s.add_argument("--model", help="checkpoint directory (default: a synthetic one of --preset)")
    s.add_argument("--preset", default="tiny", choices=["tiny", "real-layer"],
                   help="synthetic checkpoint when no --model: tiny (embedded) or real-layer (real dimensions)")
    s.add_argument("--device", default="auto", help="auto | cpu | cuda | xpu")
    s.add_argument("--island", default="all", help="all | chain | submod0 | gdn_core | submod1 | moe")
    s.add_argument("--mode", choices=["piecewise", "full"], default=None, help="chain capture mode (default: both)")
    s.add_argument("--batches", default="1,8,32", help="decode batch sizes, comma-separated")
    s.add_argument("--iters", type=int, default=50, help="timed samples per measurement (median)")
    s.add_argument("--warmup", type=int, default=5, help="untimed calls before the samples")
    s.add_argument("--kernels", default=None, help="kernel providers, e.g. all=triton (as $REPRO_KERNELS)")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--no-repairs", action="store_true", help="skip the repair-cost rows")
    s.add_argument("--no-tiny-rates", action="store_true",
                   help="skip the CPU tiny checkpoint's lockstep steps/s and Hypothesis examples/s")
    s.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    s.add_argument("--profile", type=int, default=0, metavar="N",
                   help="also profile N replays of each chain row: where the time goes, kernel by kernel")
    s.add_argument("--json", help="write results here")
    s.add_argument("--plot", help="write a PNG of replay/eager and replay/floor here (needs matplotlib)")
    s.set_defaults(fn=_bench)

    return p


def main(argv=None) -> int:
    a = parser().parse_args(argv)
    a.argv = list(sys.argv[1:] if argv is None else argv)
    try:
        return a.fn(a)
    except BadInput as e:
        print(f"repro: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
