"""`repro report RESULT.json -o DIR` from its typed config: the report directory from a result file
(`repro.report.write_report`)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..io import emit, prepare_output_dir
from ..report import SCRIPT, WEIGHTS, check_layer, check_output, load_result, write_report
from ..report import upstream
from ..knobs.control import Control
from ..upstream.paths import control_json, ready


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
    control: str | None = None  # None: the result's own source; vllm / vllm-v2: an upstream report through it
    patches: tuple[str, ...] | None = None  # None: the result's own patch files


def report_command(c: ReportConfig) -> int:
    """`repro report`: the report directory from a result file; says what it wrote. A finding made on
    the installed vLLM's own decisions (`--control vllm`), or one `control` names a vLLM source for
    (a mirror's finding judged through vLLM's code), gets the upstream report (`report.upstream`)."""
    doc = load_result(c.result)
    if c.control is not None or c.patches is not None:  # the finding's stream judged through another source
        ctl = Control(c.control or doc.get("control", "mirror"),
                      tuple(c.patches) if c.patches is not None else tuple(p["path"] for p in doc.get("patches", [])))
        ready(ctl)
        doc = {**{k: v for k, v in doc.items() if k not in ("control", "vllm", "patches")}, **control_json(ctl)}
    if upstream.is_upstream(doc):
        ready(upstream.control_of(doc))
        out = prepare_output_dir(c.output, c.force, "-o", names=upstream.OUTPUTS)
        written = upstream.write_upstream_report(doc, out, verify=c.verify)
        print(f"wrote {out}/" + ", ".join(n for n in upstream.OUTPUTS if n in written))
        return 0
    out = check_output(c.output, c.force, "-o")
    check_layer(doc, c.layer)
    write_report(doc, out, result_path=str(c.result), index=c.case, layer=c.layer, sentinel=c.sentinel,
                 verify=c.verify, seed=c.seed, weights=c.weights, force=c.force, cache=c.cache, stack=c.stack)
    emit(f"wrote {out}/REPORT.md, env.txt, sequence.json" + (f", {SCRIPT}" if (out / SCRIPT).exists() else "")
          + (f", {WEIGHTS}" if (out / WEIGHTS).exists() else ""))
    return 0
