"""`repro bench` from its typed config: outputs checked first, then the replay rows, the lockstep
rates and the hunt rates, the table and the files; and the command line that reproduces a run."""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from kernels import registry

from ..bench.output import format_profiles, format_table, plot, pyplot
from ..bench.replay import CHOICES, BENCH_ISLANDS, MODES, checkpoint_for, parse_batches, run_bench
from ..errors import BadInput
from ..graphs import make_provider
from ..knobs.modes import Runtime, parse_mode
from ..io import check_distinct, check_output_file, emit, write_json
from .control_rates import control_rates, format_control_rates
from .hunt_rates import format_hunt_rates, hunt_rates
from ..knobs.control import Control
from ..upstream.paths import ready


@dataclass(frozen=True)
class BenchConfig:
    """What `repro bench` needs (the command line builds it; every option in `repro bench --help`)."""

    model: Path | None = None  # None: the synthetic checkpoint of `preset`
    preset: str = "tiny"
    device: str = "auto"
    island: str = "all"
    mode: str | None = None
    batches: str = "1,8,32"
    iters: int = 50
    warmup: int = 5
    kernels: str | None = None
    seed: int = 0
    no_repairs: bool = False
    no_tiny_rates: bool = False
    quiet: bool = False
    profile: int = 0
    json: Path | None = None
    plot: Path | None = None
    lockstep_rates: bool = False
    lockstep_steps: int = 400
    hunt_examples: int = 20
    reference_every: tuple[int, ...] | None = None
    stack: str = "fixed"  # --hunt-rates: the only profile its blind hunts search ("fixed": each hazard's own)
    spec_tokens: int | None = None  # --hunt-rates: the drafts a decode of every hunt (None: each hazard's own K)
    block_size: int | None = None  # --hunt-rates: prefix caching's block size in every hunt (None: mode "none")
    hunt_rates: bool = False
    cache: Path | None = None  # None: `io.cache_dir`'s default
    control: str = "mirror"  # --hunt-rates: a vLLM source's blind hunt beside the mirror's (`control_rates`)
    patches: tuple[str, ...] = ()  # ... with these patch files applied to vLLM


def command_line(a: BenchConfig) -> str:
    """The `repro bench` line equivalent to the parsed options (for the JSON and the docs)."""
    parts = ["repro", "bench", "--device", a.device, "--island", a.island, "--batches", a.batches,
             "--iters", str(a.iters), "--warmup", str(a.warmup)]
    parts += ["--model", str(a.model)] if a.model else ["--preset", a.preset]
    for flag, v in (("--mode", a.mode), ("--kernels", a.kernels), ("--json", a.json), ("--plot", a.plot)):
        if v:
            parts += [flag, str(v)]
    parts += [f for f, on in (("--no-repairs", a.no_repairs), ("--no-tiny-rates", a.no_tiny_rates)) if on]
    if a.profile:
        parts += ["--profile", str(a.profile)]
    if getattr(a, "lockstep_rates", False):
        parts += ["--lockstep-rates", "--lockstep-steps", str(a.lockstep_steps), "--hunt-examples",
                  str(a.hunt_examples)]
        if getattr(a, "reference_every", None):
            parts += ["--reference-every", ",".join(map(str, a.reference_every))]
    if getattr(a, "hunt_rates", False):
        parts += ["--hunt-rates", "--hunt-examples", str(a.hunt_examples)]
        if a.stack != "fixed":
            parts += ["--stack", a.stack]
        if a.spec_tokens is not None:
            parts += ["--spec-tokens", str(a.spec_tokens)]
        if getattr(a, "block_size", None) is not None:
            parts += ["--block-size", str(a.block_size)]
        if getattr(a, "control", "mirror") != "mirror":
            parts += ["--control", a.control] + [x for p in a.patches for x in ("--patch", p)]
    return " ".join(parts)


def bench_command(a: BenchConfig) -> int:
    """`repro bench`: outputs checked first, then the measurements, the table and the files."""
    check_distinct([("--json", a.json), ("--plot", a.plot)])
    check_output_file(a.json, "--json")
    check_output_file(a.plot, "--plot")
    if a.mode and parse_mode(a.mode).decode is Runtime.NONE:  # the decode batch bench replays would run eagerly
        raise BadInput(f"--mode {a.mode}: runs a decode batch eagerly, and bench times graph replay (leave --mode "
                       f"out for {' and '.join(MODES)}, or name a mode with decode graphs)")
    if a.island not in CHOICES:
        raise BadInput(f"unknown island {a.island!r} for bench (choose from {', '.join(CHOICES)})")
    batches = parse_batches(a.batches)
    if a.stack != "fixed" and not a.hunt_rates:
        raise BadInput("--stack: only with --hunt-rates (the replay and lockstep rows run the fixed stack)")
    if a.spec_tokens is not None and not (a.hunt_rates or a.lockstep_rates):
        raise BadInput("--spec-tokens: only with --hunt-rates or --lockstep-rates (the replay rows run at K=0)")
    if a.block_size is not None and not a.hunt_rates:
        raise BadInput("--block-size: only with --hunt-rates (the replay and lockstep rows run without prefix caching)")
    if a.hunt_rates and a.hunt_examples < 1:
        raise BadInput("--hunt-examples 0: each --hunt-rates hunt needs at least one sequence")
    ctl = Control(a.control, tuple(a.patches))
    if ctl.upstream and not a.hunt_rates:
        raise BadInput(f"--control {ctl.source}: only with --hunt-rates (the replay rows time the islands, not the "
                       "control path)")
    if ctl.upstream and (a.stack != "fixed" or a.block_size is not None):
        raise BadInput(f"--control {ctl.source}: its hunt rates compare one blind hunt on vLLM with the mirror's "
                       "profile of the same runner (leave --stack and --block-size out)")
    ready(ctl)
    if a.plot:
        pyplot()  # fail before the work, not after
    with registry.using(**registry.parse(a.kernels or "")):
        return _bench(a, batches)


def _bench(a: BenchConfig, batches) -> int:
    provider = make_provider(a.device)
    path = Path(a.model) if a.model else checkpoint_for(a.preset, provider.device, a.cache)
    modes = (a.mode,) if a.mode else MODES
    islands = BENCH_ISLANDS if a.island == "all" else ((a.island,) if a.island in BENCH_ISLANDS else ())
    chain = a.island in ("all", "chain")
    log = (lambda s: print(s, file=sys.stderr, flush=True)) if not a.quiet else None
    res = run_bench(path, provider, islands=islands, chain=chain, repairs=chain and not a.no_repairs,
                    batches=batches, modes=modes, iters=a.iters, warmup=a.warmup, seed=a.seed,
                    rates=not a.no_tiny_rates, log=log, profile=a.profile,
                    lockstep_steps=a.lockstep_steps if a.lockstep_rates else 0, hunt_examples=a.hunt_examples,
                    reference_every=a.reference_every, cache=a.cache, spec_tokens=a.spec_tokens or 0)
    emit(format_table(res))
    if a.profile:
        emit(format_profiles(res))
    rates = None
    ctl = Control(a.control, tuple(a.patches))
    if a.hunt_rates and ctl.upstream:
        if log:
            log(f"hunt rates: a blind hunt on --control {ctl.label()} and on the mirror, at most {a.hunt_examples} "
                "sequences each")
        rates = control_rates(str(path), a.device, ctl, a.hunt_examples, a.spec_tokens, quiet=a.quiet, log=log,
                              cache=a.cache)
        print(format_control_rates(rates))
    elif a.hunt_rates:
        if log:
            log(f"hunt rates: each record hazard told and blind, at most {a.hunt_examples} sequences a hunt")
        rates = hunt_rates(str(path), a.device, a.hunt_examples, a.stack, a.spec_tokens, provider.supports_streams,
                           quiet=a.quiet, log=log, cache=a.cache, block_size=a.block_size)
        emit(format_hunt_rates(rates))
    if a.json:
        doc = res.to_json()
        if rates is not None and ctl.upstream:
            doc["control_rates"] = rates
            doc["hunt_rates_bound"] = {"examples": a.hunt_examples, "profile": "ci"}
        elif rates is not None:
            doc["hunt_rates"] = rates
            doc["hunt_rates_bound"] = {"examples": a.hunt_examples, "profile": "ci"}
        doc["command"] = command_line(a)
        doc["preset"] = None if a.model else a.preset
        write_json(a.json, doc)
    if a.plot:
        plot(res, a.plot)
        emit(f"wrote {a.plot}")
    return 0
