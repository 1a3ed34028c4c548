"""Long lockstep runs: every baseline over K x mode, and every public-record hazard under each of
its repairs, each over one seeded sequence of `--steps` scheduler steps with the third copy
stepped every step. A row is `clean` when replay equals eager bit for bit at every step, the third
copy agrees, and the run reached its last step; anything else is named. A repair that turns its
bug into a loud error (vLLM PR #55123's replay-side assertion) is expected to stop its run with
that error instead. Exit 1 if a row is not as expected.

    python tools/long_runs.py --device cpu --steps 1000
    python tools/long_runs.py --device cuda --steps 1000 --kernels all=triton

A baseline row at K > 0 draws spec decodes with seeded acceptance and 1+K-token prompts; a row
with a block size (`--block-sizes`) runs prefix caching, with prompts near multiples of the block
and shared prefixes (prefix hits); `--dp`
adds an idle data-parallel rank's dummy steps to the baselines. A repair row runs the sequence its
hazard needs (its K, its dummy steps: `repro.job.cases.sequence_needs`). `--control vllm` or
`vllm-v2` (and `--patch FILE`) runs the baselines on the installed vLLM's own scheduler and runner
decisions (`repro.knobs.control`; needs vLLM: `tox -e vllm033`), with no repair rows (the record's
hazards are control rules, which vLLM's code decides there).
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass

from kernels import registry
from repro.bench.replay import checkpoint_for
from repro.knobs.modes import MODES, mode_name
from repro.graphs import make_provider
from repro.islands import Model
from repro.job.cases import Case, case_sequence, run_case, sequence_needs
from repro.job.steps import case_steps
from repro.knobs import hazards as hz
from repro.knobs.control import Control
from repro.upstream.paths import ready


@dataclass
class Row:
    what: str
    mode: str
    k: int
    dp: bool
    steps: int  # steps the run reached
    planned: int  # steps of its sequence
    failure: str | None  # None: clean
    seconds: float
    expect: str = "clean"  # `hz.expectation`: a repair that turns the bug into a loud error expects "finding"

    @property
    def clean(self) -> bool:
        return self.failure is None and self.steps == self.planned

    @property
    def ok(self) -> bool:
        return self.clean if self.expect == "clean" else self.failure is not None


def cases(ks, modes, dp: bool, repairs: bool, block_sizes=(), plain: bool = True,
          control: Control = Control()) -> list[Case]:
    """Baselines at each K and mode (`plain`), then with prefix caching at each block size wider
    than K (`check_block_size`), then each record hazard under each repair (not under a vLLM control
    source)."""
    out = [Case("chain", m, spec_tokens=k, data_parallel=dp, control=control) for k in ks for m in modes] if plain else []
    out += [Case("chain", m, spec_tokens=k, data_parallel=dp, block_size=b, control=control)
            for b in block_sizes for k in ks if k < b for m in modes]
    if repairs and not control.upstream:
        for h in hz.HAZARDS.values():
            if not h.record or "chain" not in h.islands:
                continue
            for m in [m for m in modes if hz.home(m) in h.modes]:
                for rep in h.repairs:
                    k, need_dp = sequence_needs((h.name,), None)
                    out.append(Case("chain", m, (h.name,), (rep,), spec_tokens=k, data_parallel=need_dp))
    return out


def run(model, provider, case: Case, steps: int, seed: int) -> Row:
    seq = case_sequence(case, seed, steps)
    t0 = time.perf_counter()
    r = run_case(model, provider, case, seq, reference_every=1)
    failure = None
    if r.detected:
        failure = (r.failure.where() if r.failure is not None
                   else ", ".join(sorted({f['kind'] for f in r.findings})) or "detected")
    what = " + ".join(case.hazards + case.repairs) or "baseline"
    if case.block_size:
        what += f" block {case.block_size}"
    if case.control.upstream:
        what += f" on {case.control.label()}"
    return Row(what, case.mode, case.spec_tokens, case.data_parallel, r.steps, len(case_steps(case, seq)), failure,
               time.perf_counter() - t0, hz.expectation(case.hazards, case.repairs))


def line(r: Row) -> str:
    if r.expect != "clean":
        verdict = f"loud, as its repair intends: {r.failure}" if r.ok else "NOT LOUD: the repair's error never came"
    else:
        verdict = "clean" if r.clean else f"NOT CLEAN: {r.failure or f'stopped at step {r.steps}'}"
    return (f"{r.what:48} {r.mode:18} K={r.k} dp={int(r.dp)} {r.steps:5}/{r.planned} steps  {verdict}  "
            f"({r.seconds:.1f} s)")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--kernels", default="default", help="default, or OP=PROVIDER[,...] (e.g. all=triton)")
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--spec-tokens", default="0,1,2,3", help="the baselines' K values, comma separated")
    ap.add_argument("--modes", default=",".join(MODES).lower(),
                    help="comma separated, vLLM's names (FULL resolves to FULL_AND_PIECEWISE for GDN: run once)")
    ap.add_argument("--block-sizes", default="", help="prefix caching's block sizes, comma separated: each adds "
                    "the baselines of every K below it (default: none)")
    ap.add_argument("--dp", action="store_true", help="baselines with an idle data-parallel rank's dummy steps")
    ap.add_argument("--no-repairs", action="store_true", help="baselines only")
    ap.add_argument("--no-baselines", action="store_true",
                    help="no baselines without a block size (the repair rows, and those of --block-sizes)")
    ap.add_argument("--control", default="mirror", choices=["mirror", "vllm", "vllm-v2"],
                    help="where the control decisions come from (repro run --control)")
    ap.add_argument("--patch", action="append", default=[], help="a patch file for vLLM (repro run --patch)")
    ap.add_argument("--shard", default="0/1", help="I/N: run rows I, I+N, ... of the plan (N processes share a "
                    "machine whose steps are host-bound)")
    a = ap.parse_args(argv)
    control = Control(a.control, tuple(a.patch))
    ready(control)
    sel = {} if a.kernels == "default" else dict(kv.split("=") for kv in a.kernels.split(","))
    provider = make_provider(a.device)
    model = Model(checkpoint_for(a.preset, provider.device), provider.device)
    ks = [int(k) for k in a.spec_tokens.split(",")]
    modes = list(dict.fromkeys(mode_name(m) for m in a.modes.split(",")))
    i, n = (int(x) for x in a.shard.split("/"))
    blocks = [int(b) for b in a.block_sizes.split(",") if b]
    todo = cases(ks, modes, a.dp, not a.no_repairs, blocks, plain=not a.no_baselines, control=control)[i::n]
    print(f"# {len(todo)} runs of {a.steps} steps, seed {a.seed}, {a.preset}, kernels {a.kernels}, "
          f"{provider.name} on {provider.device}, control {control.label()}", flush=True)
    bad = 0
    t0 = time.perf_counter()
    with registry.using(**sel):
        for c in todo:
            r = run(model, provider, c, a.steps, a.seed)
            bad += not r.ok
            print(line(r), flush=True)
    print(f"# {len(todo) - bad} of {len(todo)} as expected in {time.perf_counter() - t0:.0f} s", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
