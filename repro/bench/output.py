"""`repro bench` from the command line, and what it prints and draws: the table, the per-kernel
profiles, the PNG, and the command line that reproduces a run."""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from kernels import registry

from .replay import (BENCH_ISLANDS, CHOICES, MODES, TARGET_FLOOR_RATIO, TARGET_SPEEDUP, BenchResult, checkpoint_for,
                     parse_batches, run_bench, targets)
from ..errors import BadInput
from ..graphs import make_provider
from ..io import check_output_file, write_json, write_with
from .lockrates import format_rates
from .hunt_rates import format_hunt_rates, hunt_rates


def _f(v, fmt="{:.1f}"):
    return "-" if v is None else fmt.format(v)


def format_table(res: BenchResult) -> str:
    head = ("island", "mode", "B", "repair", "eager us", "replay us", "eager/replay", "floor us", "replay/floor",
            "repair cost")
    rows = [head]
    for r in res.rows:
        rows.append((r.island, r.mode or "-", str(r.batch), r.repair or "-", _f(r.eager_us), _f(r.replay_us),
                     _f(r.speedup, "{:.2f}"), _f(r.floor_us, "{:.2f}"), _f(r.floor_ratio, "{:.2f}"),
                     _f(r.repair_cost, "{:.3f}")))
    widths = [max(len(x[i]) for x in rows) for i in range(len(head))]
    lines = ["  ".join(c.rjust(w) if i >= 2 else c.ljust(w) for i, (c, w) in enumerate(zip(x, widths))).rstrip()
             for x in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines.append(f"copy bandwidth {res.bandwidth / 1e9:.1f} GB/s (read + write), {res.iters} samples a median, "
                 f"provider {res.graph_provider} on {res.device}")
    t = targets(res.rows)["chain_full_b1"]
    if t:
        lines.append(f"target chain full B=1: replay/floor {t['replay_over_floor']:.2f} (<= {TARGET_FLOOR_RATIO:g}: "
                     f"{'met' if t['within_5x_of_floor'] else 'NOT met'}), eager/replay {t['eager_over_replay']:.1f} "
                     f"(>= {TARGET_SPEEDUP:g}: {'met' if t['replay_10x_faster_than_eager'] else 'NOT met'})")
    if res.lockstep_rates:
        lines.append(format_rates(res.lockstep_rates))
    if res.tiny_rates:
        r = res.tiny_rates
        lines.append(f"CPU tiny: lockstep {r['lockstep_piecewise_steps_per_s']} steps/s piecewise, "
                     f"{r['lockstep_full_and_piecewise_steps_per_s']} steps/s full_and_piecewise; "
                     f"Hypothesis {r['hypothesis_examples_per_s']} examples/s ({r['hypothesis_examples']} examples)")
    return "\n".join(lines)


def format_profiles(res: BenchResult, top: int = 15) -> str:
    """The --profile breakdowns of the chain rows, one block each."""
    out = []
    for r in res.rows:
        p = r.profile
        if not p:
            continue
        unit = "ops" if p["what"].startswith("CPU") else "launches"
        out.append(f"profile chain {r.mode} B={r.batch}: {p['what']}, {p['total_us_per_replay']:.1f} us and "
                   f"{p['launches_per_replay']:g} {unit} per replay ({p['replays']} replays; replay timed "
                   f"{r.replay_us:.1f} us)")
        for k in p["kernels"][:top]:
            share = k["us_per_replay"] / p["total_us_per_replay"] if p["total_us_per_replay"] else 0.0
            out.append(f"  {k['us_per_replay']:9.2f} us  {share:6.1%}  x{k['calls_per_replay']:<5g} {k['name'][:90]}")
    return "\n".join(out)


def pyplot():
    """matplotlib's pyplot on the Agg backend, or BadInput saying how to get it."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise BadInput("--plot needs matplotlib, which is not installed here: pip install matplotlib "
                       "(or pip install -e '.[plot]'), or leave --plot out") from None
    return plt


def plot(res: BenchResult, path) -> None:
    """Two panels: replay/eager and replay/floor, one group per island (chain per mode), one bar
    per batch size."""
    plt = pyplot()
    rows = [r for r in res.rows if r.repair is None]
    groups = []
    for r in rows:
        key = r.island if r.mode is None else f"chain {r.mode}"
        if key not in groups:
            groups.append(key)
    batches = sorted({r.batch for r in rows})
    fig, axes = plt.subplots(1, 2, figsize=(max(8, 2.2 * len(groups) + 3), 4.2))
    width = 0.8 / max(1, len(batches))
    for ax, (title, value) in zip(axes, (("replay / eager (lower is better)", lambda r: r.replay_us / r.eager_us),
                                         ("replay / bandwidth floor (1 = at the floor)", lambda r: r.floor_ratio))):
        for j, b in enumerate(batches):
            xs, ys = [], []
            for i, gname in enumerate(groups):
                r = next((r for r in rows if r.batch == b and (r.island if r.mode is None else f"chain {r.mode}") == gname),
                         None)
                if r is not None and value(r) is not None:
                    xs.append(i + (j - (len(batches) - 1) / 2) * width)
                    ys.append(value(r))
            ax.bar(xs, ys, width, label=f"B={b}")
        ax.set_xticks(range(len(groups)))
        ax.set_xticklabels(groups, rotation=20, ha="right")
        ax.set_yscale("log")
        ax.set_title(title, fontsize=10)
        ax.grid(axis="y", which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"repro bench: {res.device}, {res.graph_provider}", fontsize=10)
    fig.tight_layout()
    try:
        write_with(path, lambda tmp: fig.savefig(tmp, dpi=110, format="png"), "--plot", ".png")
    finally:
        plt.close(fig)


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
    return " ".join(parts)


def bench_command(a: BenchConfig) -> int:
    """`repro bench`: outputs checked first, then the measurements, the table and the files."""
    check_output_file(a.json, "--json")
    check_output_file(a.plot, "--plot")
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
    print(format_table(res))
    if a.profile:
        print(format_profiles(res))
    rates = None
    if a.hunt_rates:
        if log:
            log(f"hunt rates: each record hazard told and blind, at most {a.hunt_examples} sequences a hunt")
        rates = hunt_rates(str(path), a.device, a.hunt_examples, a.stack, a.spec_tokens, provider.supports_streams,
                           quiet=a.quiet, log=log, cache=a.cache, block_size=a.block_size)
        print(format_hunt_rates(rates))
    if a.json:
        doc = res.to_json()
        if rates is not None:
            doc["hunt_rates"] = rates
            doc["hunt_rates_bound"] = {"examples": a.hunt_examples, "profile": "ci"}
        doc["command"] = command_line(a)
        doc["preset"] = None if a.model else a.preset
        write_json(a.json, doc)
    if a.plot:
        plot(res, a.plot)
        print(f"wrote {a.plot}")
    return 0
