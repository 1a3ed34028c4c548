"""`repro run` and `repro hunt`: argparse values to `RunConfig` / `HuntConfig` (the options they
share are read once, here), then the one library call each."""
from __future__ import annotations

import shlex
from pathlib import Path

from . import environ


def _path(v):
    return Path(v) if v else None


def command_line(argv) -> str:
    """The command as typed, quoted, for the result files."""
    return "repro " + " ".join(shlex.quote(x) for x in argv)


def run(a) -> int:
    from ..commands.run import RunConfig, run_command
    return run_command(RunConfig(
        command=command_line(a.argv), model=_path(a.model), device=a.device, island=a.island, layer=a.layer,
        mode=a.mode, hazards=tuple(a.hazard), repairs=tuple(a.repair), steps=a.steps, seed=a.seed,
        stack=a.stack, spec_tokens=a.spec_tokens, block_size=a.block_size, sentinel=a.sentinel,
        sequence=_path(a.sequence), baseline=a.baseline,
        trace=_path(a.trace), json=_path(a.json),
        report=_path(a.report), force=a.force, strict=a.strict, amplify=not a.no_amplify,
        reference_every=a.reference_every, tp=a.tp, cache=environ.cache(), kill=environ.kill(),
        comm_backend=environ.comm_backend(), control=a.control, patches=tuple(a.patch)))


def hunt(a) -> int:
    from ..commands.hunt import HuntConfig, hunt_command
    return hunt_command(HuntConfig(
        model=a.model, device=a.device, island="chain" if a.island in ("all", "chain") else a.island,
        layer=a.layer, mode=a.mode, hazards=tuple(a.hazard), repairs=tuple(a.repair), sentinel=a.sentinel,
        stack=a.stack or "fixed", spec_tokens=a.spec_tokens, block_size=a.block_size,
        max_examples=a.max_examples, profile=a.profile, save=a.save, json=a.json, report=_path(a.report),
        force=a.force, command=command_line(a.argv), cache=environ.cache(), control=a.control,
        patches=tuple(a.patch), coverage=a.coverage))
