"""`repro bench`: argparse values to `BenchConfig`, then `repro.commands.bench.bench_command`."""
from __future__ import annotations

from pathlib import Path

from . import environ


def _path(v):
    return Path(v) if v else None


def bench(a) -> int:
    from ..commands.bench import BenchConfig, bench_command
    return bench_command(BenchConfig(
        model=_path(a.model), preset=a.preset, device=a.device, island=a.island, mode=a.mode, batches=a.batches,
        iters=a.iters, warmup=a.warmup, kernels=a.kernels, seed=a.seed, no_repairs=a.no_repairs,
        no_tiny_rates=a.no_tiny_rates, quiet=a.quiet, profile=a.profile or 0, json=_path(a.json), plot=_path(a.plot),
        lockstep_rates=a.lockstep_rates, lockstep_steps=a.lockstep_steps, hunt_examples=a.hunt_examples,
        reference_every=a.reference_every, stack=a.stack, spec_tokens=a.spec_tokens, hunt_rates=a.hunt_rates,
        block_size=a.block_size, control=a.control, patches=tuple(a.patch),
        cache=environ.cache()))
