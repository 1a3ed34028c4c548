"""`repro report` of a finding made on the installed vLLM's own decisions (`--control vllm`): a report
addressed to vLLM's maintainers, with what their code decided at each step and a script that needs
only torch and vLLM.

DIR gets `REPORT.md` (the minimal request stream, each step's decisions with the vLLM function that
made each: the scheduler's chunk, the uniform-decode decision, the graph key, the GDN builder's
branch and whether it staged the rows the FULL graph reads; what clears it), `decisions.json` (the
trace, `upstream.trace.decisions`), `sequence.json`, `result.json` and `repro_vllm_decisions.py`
(`standalone/vllm_decisions.py` with the stream, the model's config, the suite's CPU loader of
vLLM's control classes and the patch applied filled in): it exits 1 where a FULL replay reads rows
the builder did not stage, 0 under the V2 runner's rule (`--rule v2`). With `verify`, the script is
run here both ways and its output kept in the report.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from ..control.shape import StepShape
from ..io import dumps, install_dir, staging_dir
from ..job.results import Case
from ..job.steps import case_steps
from ..knobs.control import Control
from ..knobs.modes import parse_mode
from ..scheduler.sequence import Sequence
from ..upstream import v0_33
from ..upstream.patches import read
from ..upstream.paths import VllmPaths
from ..upstream.trace import FUNCTIONS, decisions, first_inconsistent

SCRIPT = "repro_vllm_decisions.py"
OUTPUTS = ("REPORT.md", "decisions.json", "sequence.json", "result.json", SCRIPT)
TEMPLATE = Path(__file__).with_name("standalone") / "vllm_decisions.py"
PR53059 = Path(__file__).resolve().parents[2] / "patches" / "vllm_pr53059.py"
MARKERS = {"SETTINGS": "SETTINGS = None  # @SETTINGS@ (filled in by `repro report`)",
           "STEPS": "STEPS = None  # @STEPS@",
           "MODEL_CONFIG": "MODEL_CONFIG = None  # @CONFIG@",
           "LOADER": "LOADER = None  # @LOADER@ (the suite's CPU loader of vLLM's control classes)",
           "PATCH": "PATCH = None  # @PATCH@ (vLLM PR #53059's hunk, as the suite ships it)"}


def is_upstream(doc: dict) -> bool:
    return doc.get("control") in ("vllm", "vllm-v2")


def control_of(doc: dict) -> Control:
    return Control(doc["control"], tuple(p["path"] for p in doc.get("patches", [])))


def stream_of(doc: dict) -> dict:
    """The request stream a report shows: a hunt's minimal sequence, or a run's sequence cut after the
    first divergence of its first diverged row (vLLM's scheduler makes its steps from the requests)."""
    if doc.get("minimal_sequence"):
        return doc["minimal_sequence"]
    r = next((r for r in doc["results"] if r.get("diverged")), doc["results"][0])
    seq = r.get("sequence", doc["sequence"])
    step = (r.get("first_divergence") or {}).get("step")
    if step is None:
        return seq
    return {**seq, "steps": seq["steps"][:step + 1]} if seq.get("steps") else {**seq, "max_steps": step + 1}


def trace_of(doc: dict) -> tuple[list[dict], Sequence]:
    """The decision trace of the result's request stream (`stream_of`) under its control source: the
    steps vLLM's scheduler makes of it (or its recorded ones), through the case's runner path."""
    seq = Sequence.from_json(stream_of(doc))
    r = next((r for r in doc["results"] if r.get("diverged")), doc["results"][0])
    ctl = control_of(doc)
    steps = case_steps(Case("chain", r["mode"], spec_tokens=seq.spec_tokens, control=ctl), seq)
    with VllmPaths(ctl, Path(doc["checkpoint"]), seq.block_size) as paths:
        path = paths.graph(parse_mode(r["mode"]), StepShape.of(seq), "cpu", 0, 0)
        return decisions(path, steps), seq


def script_text(trace: list[dict], seq: Sequence, doc: dict) -> str:
    """The standalone script (module docstring): the template with its markers filled in."""
    hunk = read(str(PR53059))  # the shipped hunk the script applies by default
    settings = {"spec_tokens": seq.spec_tokens, "mode": parse_mode(doc["results"][0]["mode"]).name,
                "max_num_seqs": seq.num_slots, "budget": seq.max_tokens, "anchors": list(v0_33.DRAFT_BOOKKEEPING)}
    values = {"SETTINGS": settings, "STEPS": [{"step": e["step"], "requests": e["requests"]} for e in trace],
              "MODEL_CONFIG": json.loads((Path(doc["checkpoint"]) / "config.json").read_text()),
              "LOADER": Path(v0_33.__file__).read_text(), "PATCH": Path(hunk.path).read_text()}
    text = TEMPLATE.read_text()
    for name, marker in MARKERS.items():
        assert text.count(marker) == 1, marker
        v = values[name]
        code = repr(v) if isinstance(v, str) else f"json.loads({json.dumps(json.dumps(v))})"
        text = text.replace(marker, f"{name} = {code}")
    return text


def run_script(path: Path, rule: str) -> tuple[int, str]:
    out = subprocess.run([sys.executable, str(path), "--rule", rule], capture_output=True, text=True, timeout=600)
    tail = [x for x in (out.stdout + out.stderr).splitlines() if x.startswith(("step", "INCONSISTENT", "consistent",
                                                                                "vLLM", "cannot"))]
    return out.returncode, "\n".join(tail)


def _kind(bad: dict | None) -> str:
    phases = {r["phase"] for r in (bad or {}).get("requests", [])}
    if "recompute past its prompt" in phases:
        return ("a preempted request's recompute, its last chunk 1+k tokens past its prompt, replays the FULL decode "
                "graph the GDN builder did not stage")
    if "prompt" in phases:
        return "a prefill chunk of the uniform-decode shape replays the FULL decode graph the GDN builder did not stage"
    return "a FULL replay reads rows the GDN builder did not stage for its step"


def _decision_rows(trace: list[dict], runner: str) -> list[str]:
    rows = ["| step | requests (rid: query, computed/prompt/prefill, phase) | dispatch (uniform?) | builder "
            "(prefills, decodes, spec decodes) | staged | the FULL graph reads / the step's rows |",
            "| --- | --- | --- | --- | --- | --- |"]
    for e in trace:
        reqs = "; ".join(f"{r['rid']}: {r['query']}, {r['computed']}/{r['prompt']}/{r['prefill']}, {r['phase']}"
                         for r in e["requests"]) or "dummy"
        b = e.get("builder") or {}
        counts = f"{b.get('num_prefills')}, {b.get('num_decodes')}, {b.get('num_spec_decodes')}" if b else ""
        reads = f"{e['graph_reads']} / {e['own_rows']}" if "graph_reads" in e else ""
        mark = "" if e.get("consistent", True) else " **inconsistent**"
        rows.append(f"| {e['step']} | {reqs} | {e.get('runtime', e.get('refused', ''))} {e.get('key', '')}"
                    f"{' (uniform)' if e.get('uniform') else ''} | {counts} | {e.get('staged', '')}{mark} | {reads} |")
    fn = FUNCTIONS[runner]
    rows += ["", "Where each column comes from (vLLM 0.33.0, the installed wheel's own code):", "",
             f"- chunk: {fn['schedule']};", f"- uniform decode: {fn['uniform']};", f"- graph key: {fn['dispatch']};",
             f"- builder branch: {fn['builder']};", f"- staged: {fn['staging']};",
             "- the FULL graph reads the builder's persistent state-index rows (`spec_state_indices_tensor`, or "
             "`non_spec_state_indices_tensor` without drafts) up to the key's request count."]
    return rows


def markdown(doc: dict, trace: list[dict], verified: dict) -> str:
    ctl = control_of(doc)
    bad = first_inconsistent(trace)
    patches = doc.get("patches", [])
    applied = ", ".join(p["title"].rstrip(".") for p in patches) or "no patch (vLLM as released)"
    about = next((p["title"].split(":")[0] for p in patches), "vLLM's V1 model runner")
    seq = stream_of(doc)
    lines = [f"# {about}: {_kind(bad)}", "",
             f"The request stream of `{doc.get('command', 'repro hunt')}`, run through vLLM {doc.get('vllm')}'s own "
             f"control code on a CPU (this suite's `--control {ctl.source}`), with {applied}. "
             f"K = {seq['spec_tokens']} draft tokens a decode, graph mode {doc['results'][0]['mode'].upper()}.", ""]
    if bad is not None:
        lines += [f"At step {bad['step']} the dispatcher replays the FULL decode graph ({bad['key']}), but the GDN "
                  "metadata builder classes the batch as holding a prefill and does not stage its rows: the graph "
                  f"reads {bad['graph_reads']} (what the capture or an earlier step left in the persistent buffer), "
                  f"not the step's own state rows {bad['own_rows']}, and the GDN kernels skip or misdirect the "
                  "request's state writes (vLLM #53051's mechanism). Every later token of that request reads the "
                  "wrong state.", ""]
    blame = doc.get("blame", {})
    if blame.get("patches"):
        clears = [Path(p).stem for p in blame["patches"]["clears"]]
        lines += [f"Shipped patches tried on top: {', '.join(Path(p).stem for p in blame['patches']['tried'])}; "
                  f"clear it: {', '.join(clears) or 'none'}; the V2 runner's decisions (vLLM PR #51865's rule) "
                  f"{'clear' if blame.get('v2_clears') else 'do not clear'} it.", ""]
    lines += ["## The minimal request stream", "", "| rid | prompt | decode steps | preempted after | arrives |",
              "| --- | --- | --- | --- | --- |"]
    lines += [f"| {r['rid']} | {r['prompt_len']} | {r['decode_steps']} | {r.get('preempt_after')} | {r['arrive']} |"
              for r in seq["requests"]]
    lines += ["", f"Steps: `sequence.json` (replay: `repro run --sequence sequence.json --control {ctl.source}"
              + "".join(f" --patch {p['path']}" for p in patches) + "`).", "",
              "## Each decision, with the vLLM function that made it", ""]
    lines += _decision_rows(trace, ctl.runner)
    lines += ["", "## The script", "", f"`{SCRIPT}` needs torch (CPU) and vLLM 0.33.0, no GPU: it loads vLLM's control "
              "classes on the CPU, applies PR #53059's hunk, replays the stream's decisions through vLLM's own "
              "functions and exits 1 at a FULL replay the builder did not stage; `--rule v2` takes the V2 runner's "
              "uniform decision and exits 0; `--rule shape` is 0.33.0 as released."]
    for rule, (rc, out) in verified.items():
        lines += ["", f"Run here with `--rule {rule}`: exit {rc}", "", "```", out, "```"]
    return "\n".join(lines) + "\n"


def write_upstream_report(doc: dict, out: Path, verify: bool = True) -> list[str]:
    """The report directory (module docstring); `out` was checked by `check_output`. Returns the
    files written."""
    trace, seq = trace_of(doc)
    stage = staging_dir(out)
    (stage / "decisions.json").write_text(dumps(trace))
    (stage / "sequence.json").write_text(dumps(stream_of(doc)))
    (stage / "result.json").write_text(dumps(doc))
    script = stage / SCRIPT
    script.write_text(script_text(trace, seq, doc))
    verified = {rule: run_script(script, rule) for rule in ("pr53059", "v2")} if verify else {}
    (stage / "REPORT.md").write_text(markdown(doc, trace, verified))
    return install_dir(stage, out)
