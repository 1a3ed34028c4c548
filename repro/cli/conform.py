"""`repro conform`: argparse values to `ConformConfig`, then `repro.commands.conform.conform_command`."""
from __future__ import annotations


def conform(a) -> int:
    from ..commands.conform import ConformConfig, conform_command
    from . import environ
    return conform_command(ConformConfig(stack=a.stack, cases=a.cases, sequences=a.sequences, seed=a.seed,
                                         json=a.json, quiet=a.quiet, cache=environ.cache(), argv=tuple(a.argv)))
