"""`repro report`: argparse values to `ReportConfig`, then `repro.commands.report.report_command`."""
from __future__ import annotations

from pathlib import Path

from . import environ


def report(a) -> int:
    from ..commands.report import ReportConfig, report_command
    return report_command(ReportConfig(Path(a.result), Path(a.output), force=a.force, case=a.case, layer=a.layer,
                                       sentinel=a.sentinel, seed=a.seed, weights=a.weights, verify=not a.no_verify,
                                       stack=a.stack, cache=environ.cache(), control=a.control,
                                       patches=None if a.patch is None else tuple(a.patch)))
