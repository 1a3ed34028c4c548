"""Checked lockstep steps/s (device check, or `--check`) of one tree, to compare two trees on one
machine in one call (GPU machines differ by 1.3-1.7x, so figures from two calls do not compare):
how docs/BENCH.md ("Decisions") measures a change, as the ratio of the two; not a test.

    git archive OLD kernels repro | tar -x -C /tmp/old     # the other tree's packages
    python tools/ab_rates.py old --tree /tmp/old
    python tools/ab_rates.py new
    python tools/ab_rates.py new-old-prefill \
        --kernels all=triton,causal_conv1d_fn=torch,gated_delta_rule_prefill=reference

Each case (`repro.bench.lockrates.CASES`, real-layer checkpoint) runs once untimed (compiles,
autotunes), then `--reps` times timed. `--spec-tokens 0,2` runs the chain cases at each K in turn
within a rep (the K > 0 sequence as `repro bench --lockstep-rates --spec-tokens` builds it), so the
K = 2 / K = 0 ratio comes from interleaved rows; `--islands chain` keeps those cases alone.

    python tools/ab_rates.py k2 --kernels "" --islands chain --spec-tokens 0,2 --steps 400 --reps 3
"""
import argparse
import os
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("tag")
    ap.add_argument("--tree", help="a folder holding the `kernels` and `repro` packages to measure")
    ap.add_argument("--kernels", default="all=triton")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--check", default="device", help="device, host or reference (`lockrates.CHECKS`)")
    ap.add_argument("--spec-tokens", default="0", help="comma-separated K for the chain cases")
    ap.add_argument("--islands", default="", help="comma-separated islands to keep (default: every case)")
    a = ap.parse_args()
    sys.path.insert(0, os.path.abspath(a.tree or os.path.join(os.path.dirname(__file__), "..")))
    import kernels
    import repro
    from kernels import registry
    from repro.bench.replay import checkpoint_for
    from repro.graphs import make_provider
    from repro.islands import Model
    from repro.job.cases import default_sequence
    from repro.bench.lockrates import CASES, run_checked
    try:
        from repro.bench.lockrates import host_us_per_op
    except ImportError:  # a tree from before it existed
        host_us_per_op = None

    with registry.using(**registry.parse(a.kernels)):
        provider = make_provider(a.device)
        model = Model(checkpoint_for("real-layer", provider.device), provider.device)
        seq = default_sequence(0, a.steps, vocab=model.cfg.vocab_size)
        seqs = {k: seq if k == 0 else default_sequence(0, a.steps, vocab=model.cfg.vocab_size, spec_tokens=k,
                                                         max_tokens=seq.max_tokens * (1 + k))
                for k in map(int, a.spec_tokens.split(","))}
        keep = set(filter(None, a.islands.split(",")))
        runs = [(island, mode, k) for island, mode in CASES if not keep or island in keep
                for k in (seqs if island == "chain" else (0,))]
        for island, mode, k in runs:
            run_checked(model, provider, island, mode, seqs[k], a.check)
        for rep in range(a.reps):
            for island, mode, k in runs:
                t = time.perf_counter()
                r = run_checked(model, provider, island, mode, seqs[k], a.check)
                dt = time.perf_counter() - t
                print(f"{a.tag} rep{rep} {island:8} {mode:9} K={k} {a.check} steady "
                      f"{r.phases.get('steady_steps_per_s')} steps/s, run {r.steps / dt:.1f}; "
                      f"us/step {r.phases.get('us_per_step')}", flush=True)
    speed = f", host {host_us_per_op(a.device)} us per small op" if host_us_per_op else ""
    print(a.tag, os.path.dirname(kernels.__file__), os.path.dirname(repro.__file__) + speed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
