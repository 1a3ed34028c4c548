"""`repro report RESULT.json -o DIR`: a bug report an upstream maintainer can act on.

DIR gets `REPORT.md` (what ran where, expected vs actual, the minimal request sequence, the
first divergence under the microscope, which repairs clear it and what they cost, public cases),
`env.txt` (this machine: torch build, devices and drivers, IPEX, oneCCL/XCCL, Triton, FLA, OS,
Python), `sequence.json` (replayable with `repro run --sequence`), `result.json` (the input) and,
where the hazard table says the script rebuilds the case, `repro_standalone.py`: one script that
imports nothing of this suite (torch only, or torch and safetensors when the layer's tensors are
embedded beside it as `repro_weights.safetensors`) and reproduces the divergence (exit 1) or not
(exit 0).

DIR is checked before any work: a non-empty one is refused unless `force`, and then only what the
suite wrote there before is replaced (`repro.io`). The files are built in a scratch folder inside
DIR and moved into place only when complete.

Modules: `load` (the result file and its steps), `repairs` (the only re-runs, for fresh repair
figures), `standalone` (the script's spec, weights and check), `cases` (citations and the
mechanism's explanation), `markdown` (REPORT.md by section), `envtext` (env.txt).
"""
from __future__ import annotations

import shlex
import shutil
from pathlib import Path

from ..knobs import hazards as hz
from ..knobs.stacks import stack as what_stack
from ..errors import BadInput
from ..io import cache_dir, dumps, install_dir, prepare_output_dir, staging_dir
from ..model.tiny import DEFAULT_NAME
from .cases import blame_of
from .envtext import environment_text
from .load import check_layer, check_result, kernel_sentinel, load_result, pick, recorded_steps, steps_that_ran
from .markdown import Facts, render_markdown
from .repairs import RepairRow, repair_rows
from .kernel import INPUTS as KERNEL_INPUTS
from .kernel import SCRIPT as KERNEL_SCRIPT
from .kernel import make_kernel_script
from .script import SCRIPT, WEIGHTS, make_standalone, standalone_gap
from ..islands import Model

OUTPUTS = ("REPORT.md", "env.txt", "sequence.json", "result.json", SCRIPT, WEIGHTS, KERNEL_SCRIPT, KERNEL_INPUTS)

__all__ = ["OUTPUTS", "SCRIPT", "WEIGHTS", "RepairRow", "check_layer", "check_output", "check_result", "load_result",
           "pick", "repair_rows", "standalone_gap", "steps_that_ran", "write_report"]


def check_output(path, force: bool = False, what: str = "-o") -> Path:
    """Refuse, before any work, a report directory the suite must not write into (one line, exit
    2): not empty without `force`, or holding a file of the user's under one of our names. The CLI
    calls this before a run whose `--report` it is."""
    return prepare_output_dir(path, force, what, names=OUTPUTS)


def _title(doc, r) -> str:
    what = ", ".join(r["hazards"]) or "baseline"
    prov = str(doc.get("graph_provider", "?"))
    if doc.get("device") not in (None, "cpu"):
        prov += f" on {doc['device']}"
    if r["diverged"]:
        fd = r["first_divergence"]
        return (f"Graph replay diverges from eager ({what}): {r['island']} {fd['island']}.{fd['tensor']} at step "
                f"{fd['step']}, {r['mode']} mode, {prov}")
    rep = f" + {', '.join(r['repairs'])}" if r["repairs"] else ""
    return f"Graph replay equals eager ({what}{rep}): {r['island']}, {r['mode']} mode, {prov}"


def _checkpoint(doc, cache=None) -> tuple[str, bool]:
    """(how the report names the checkpoint, whether it is the embedded tiny one). A local path
    means nothing to a maintainer and tells them about the reporter's disk, so only its last
    component is shown."""
    ck = doc.get("checkpoint")
    if not ck:
        return "unknown", False
    if Path(ck).expanduser().resolve() == (cache_dir(cache) / DEFAULT_NAME).resolve():
        return "the embedded tiny checkpoint (the suite's default)", True
    return f"`{Path(ck).name}`", False


def _replay_command(doc, r, layer, sentinel, cache=None, stack: str = "fixed") -> tuple[str, list[str]]:
    """(command, notes): `repro run` for exactly this case (one row: its island, mode, hazards and
    repairs, or `--baseline`) on its stack profile, with a placeholder for a local checkpoint."""
    cmd, notes = ["repro", "run"], []
    shown, default = _checkpoint(doc, cache)
    if doc.get("checkpoint") and not default:
        cmd += ["--model", "CHECKPOINT"]
        notes.append(f"`CHECKPOINT`: your copy of the checkpoint ({shown} here)")
    prov = str(doc.get("graph_provider", ""))
    cmd += ["--device", "cuda" if prov == "cuda" else "xpu" if "xpu" in prov else "cpu"]
    cmd += ["--island", r["island"], "--mode", r["mode"]]
    if stack != "fixed":
        cmd += ["--stack", stack]
    if not r["hazards"] and not r["repairs"]:
        cmd.append("--baseline")  # this case alone, not the hazard rows a run adds without --hazard
    for h in r["hazards"]:
        cmd += ["--hazard", h]
    for x in r["repairs"]:
        cmd += ["--repair", x]
    if layer is not None:
        cmd += ["--layer", str(layer)]
    if sentinel == -1 and hz.options_for(r["hazards"]).kernel_sentinel is None:
        cmd += ["--sentinel", "-1"]  # the run's own choice, not a hazard's
    cmd += ["--sequence", "sequence.json"]
    return " ".join(c if c == "CHECKPOINT" else shlex.quote(c) for c in cmd), notes


def _model(doc, layer):
    ck = doc.get("checkpoint")
    if not ck or not Path(ck).is_dir():
        return None
    try:
        return Model(ck, "cpu", layer)
    except BadInput:
        return None


def write_report(doc: dict, out_dir, *, command: str | None = None, result_path: str | None = None,
                 index: int | None = None, layer: int | None = None, sentinel: int | None = None,
                 verify: bool = True, seed: int = 0, weights: str = "auto", force: bool = False,
                 what: str = "-o", cache=None, stack: str | None = None) -> Path:
    """Write the report directory; returns its path. Nothing in DIR changes unless all is written.
    `stack`: the stack profile the report states and replays on (None: the result's own, else fixed)."""
    check_result(doc)
    check_layer(doc, layer)
    out = check_output(out_dir, force, what)
    idx = pick(doc, index)
    stk = stack or doc["results"][idx].get("stack") or doc.get("stack") or "fixed"
    what_stack(stk)  # a result file naming an unknown profile is refused in one line
    r = {**doc["results"][idx], "stack": stk}
    blame = blame_of(doc, idx, stk)
    if blame:
        r["blame"] = blame  # the rule a blind hunt named: the report's fix, citations and `--repair`
    ks = kernel_sentinel(r, sentinel)
    steps, seqj, source = steps_that_ran(doc, r, sentinel)
    seqj = {**seqj, "stack": stk}  # sequence.json replays on the stack it failed on (`repro run --sequence`)
    notes: list[str] = []
    model = _model(doc, layer)
    if model is None:
        notes.append(f"the checkpoint ({_checkpoint(doc, cache)[0]}) is not readable here: the standalone script uses the "
                     "tiny preset's shapes and the repairs were not run")
    title = _title(doc, r)
    created = not out.exists()
    stage = staging_dir(out)
    try:
        rows = repair_rows(doc, r, steps, seqj, model, sentinel)
        (stage / "result.json").write_text(dumps(doc))
        (stage / "sequence.json").write_text(dumps(seqj))
        (stage / "env.txt").write_text(environment_text(doc))
        sa = make_standalone(stage, doc, r, steps, seqj, model, sentinel, title, verify, seed, weights)
        kernel = make_kernel_script(stage, doc, r, steps, seqj, layer, sentinel, title)
        replay_cmd, replay_notes = _replay_command(doc, r, layer, ks, cache, stk)
        facts = Facts(doc, r, idx, steps, seqj, source, rows, sa, title, ks, replay_cmd, replay_notes,
                      command=command or doc.get("command"), result_path=result_path, layer=layer,
                      model_here=model is not None, checkpoint=_checkpoint(doc, cache)[0],
                      hunt_steps=recorded_steps(doc), notes=notes, kernel=kernel, stack=stk)
        (stage / "REPORT.md").write_text(render_markdown(facts))
        install_dir(stage, out)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        if created:
            try:
                out.rmdir()
            except OSError:
                pass
        raise
    return out
