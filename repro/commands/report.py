"""`repro report RESULT.json -o DIR` from its typed config: the report directory from a result file
(`repro.report.write_report`)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..io import emit
from ..report import SCRIPT, WEIGHTS, check_layer, check_output, load_result, write_report


@dataclass(frozen=True)
class ReportConfig:
    """What `repro report` needs (`write_report`'s options, and the result file to read)."""

    result: Path
    output: Path
    force: bool = False
    case: int | None = None
    layer: int | None = None
    sentinel: int | None = None
    seed: int = 0
    weights: str = "auto"
    verify: bool = True
    stack: str | None = None  # None: the result's own stack profile, else fixed
    cache: Path | None = None  # None: `io.cache_dir`'s default


def report_command(c: ReportConfig) -> int:
    """`repro report`: the report directory from a result file; says what it wrote."""
    out = check_output(c.output, c.force, "-o")
    doc = load_result(c.result)
    check_layer(doc, c.layer)
    write_report(doc, out, result_path=str(c.result), index=c.case, layer=c.layer, sentinel=c.sentinel,
                 verify=c.verify, seed=c.seed, weights=c.weights, force=c.force, cache=c.cache, stack=c.stack)
    emit(f"wrote {out}/REPORT.md, env.txt, sequence.json" + (f", {SCRIPT}" if (out / SCRIPT).exists() else "")
          + (f", {WEIGHTS}" if (out / WEIGHTS).exists() else ""))
    return 0
