"""The race amplifier's GPU matrix: every chain stream hazard, per checkpoint and kernel
selection, 10 runs detected (first divergent step) and 10 runs cleared by each repair, amplifier
on; then each baseline over `--baseline-steps` amplified steps. One line per cell; exit 1 if a
cell falls short.

    python tools/race_matrix.py --device cuda --preset tiny --kernels all=triton
    python tools/race_matrix.py --device cuda --preset real-layer --kernels default

`tests/test_race.py` runs the tiny/default cell in the GPU suite; this covers the others.
"""
import argparse
import sys
import time

from kernels import registry
from repro.knobs import hazards as hz
from repro.bench.replay import checkpoint_for
from repro.graphs import make_provider
from repro.islands import Model
from repro.job.cases import Case, default_sequence, run_case


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--kernels", default="default", help="default, or OP=PROVIDER[,...] (e.g. all=triton)")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--steps", type=int, default=12, help="steps of each detection/repair run")
    ap.add_argument("--baseline-steps", type=int, default=1000)
    a = ap.parse_args()
    sel = {} if a.kernels == "default" else dict(kv.split("=") for kv in a.kernels.split(","))
    provider = make_provider(a.device)
    model = Model(checkpoint_for(a.preset, provider.device), provider.device)
    cells = sorted((h.name, m) for h in hz.HAZARDS.values() if h.stream and "chain" in h.islands for m in h.modes)
    seq = default_sequence(seed=1, steps=a.steps)
    short = 0
    with registry.using(**sel):
        print(f"# {a.preset} {a.kernels} on {provider.describe() if hasattr(provider, 'describe') else a.device}")
        for hazard, mode in cells:
            t0 = time.perf_counter()
            steps = [run_case(model, provider, Case("chain", mode, (hazard,)), seq).first_divergence
                     for _ in range(a.runs)]
            firsts = [fd["step"] if fd else None for fd in steps]
            ok = all(s is not None and s <= 2 for s in firsts)
            short += not ok
            print(f"{hazard:20} {mode:9} detected {sum(s is not None for s in firsts)}/{a.runs}, "
                  f"first steps {firsts} {'ok' if ok else 'SHORT'} ({time.perf_counter() - t0:.1f} s)", flush=True)
            for repair in hz.HAZARDS[hazard].repairs:
                t0 = time.perf_counter()
                rs = [run_case(model, provider, Case("chain", mode, (hazard,), (repair,)), seq) for _ in range(a.runs)]
                clean = sum(not r.detected and r.steps == len(seq.batches()) for r in rs)
                short += clean < a.runs
                print(f"{hazard:20} {mode:9} +{repair:17} clean {clean}/{a.runs} "
                      f"({time.perf_counter() - t0:.1f} s)", flush=True)
        long = default_sequence(seed=7, steps=a.baseline_steps)
        for mode in ("piecewise", "full"):
            t0 = time.perf_counter()
            r = run_case(model, provider, Case("chain", mode), long)
            ok = not r.detected and r.steps == len(long.batches())
            short += not ok
            print(f"baseline {mode:9} amplified: {r.steps} steps, {'clean' if ok else r.first_divergence} "
                  f"({time.perf_counter() - t0:.1f} s)", flush=True)
    return 1 if short else 0


if __name__ == "__main__":
    sys.exit(main())
