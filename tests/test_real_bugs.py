"""`docs/real-bugs.md` is generated (`tools/real_bugs.py`) from the hazard table, the stack profiles
and the `hunt_rates` section of a `repro bench --hunt-rates --json` result."""
import json
import subprocess
import sys
from pathlib import Path

from kernels.gdn.xpu_rules import RULES, UNKNOWN
from repro.knobs.hazards import HAZARDS
from repro.report.real_bugs import markdown

ROOT = Path(__file__).resolve().parents[1]
SEQ = {"requests": [{"rid": 0, "prompt_len": 3, "decode_steps": 0, "arrive": 0}], "spec_tokens": 2,
       "data_parallel": False, "steps": [{"step": 0}]}
FD = {"step": 0, "island": "gdn_core", "tensor": "core_out", "line": "step 0: gdn_core.core_out"}
RATES = {"device": "cpu", "graph_provider": "cpu-tape", "torch": "x",
         "command": "repro bench --device cpu --hunt-rates --hunt-examples 60 --json /tmp/x.json",
         "hunt_rates_bound": {"examples": 60, "profile": "ci"},
         "hunt_rates": {
             "shape-only-uniform-decode": {
                 "told": {"found": True, "first_s": 0.29, "minimal_s": 2.57, "examples": 11, "minimal_steps": 1,
                          "first_divergence": FD, "minimal_sequence": SEQ},
                 "blind": {"stack": "vllm-0.33-mrv1", "found": True, "first_s": 0.41, "minimal_s": 3.23, "examples": 11,
                           "minimal_steps": 1, "first_divergence": FD, "minimal_sequence": SEQ,
                           "rule": ["uniform_decode"], "upstream": "vLLM #53051", "hazards": []}},
             "fresh-alloc-split-op": {
                 "told": {"found": False, "first_s": None, "minimal_s": None, "examples": 60},
                 "blind": None, "blind_why": "n/a: no stack profile sets it (it is no control rule)"}}}


def test_the_page_has_each_record_bug_and_the_hunts_figures():
    md = markdown(RATES)
    for h in (h for h in HAZARDS.values() if h.record):
        assert f"`{h.name}`" in md
    row = next(x for x in md.splitlines() if x.startswith("| vLLM #53051"))
    assert "1 request (prompt 3), k=2; 1 step" in row and "step 0, `gdn_core.core_out`" in row
    times = next(x for x in md.splitlines() if x.startswith("| `shape-only-uniform-decode`"))
    assert "| 0.29 | 2.57 |" in times and "vllm-0.33-mrv1 | 0.41 | 3.23 | `uniform_decode`: vLLM #53051" in times
    assert "not found in 60" in md and "no stack profile sets it" in md
    assert "--json RATES.json" in md and "/tmp/x.json" not in md
    found = md.split("## Found by this suite", 1)[1]
    assert "vLLM PR #53059" in found and "tests/test_resumed_recompute.py" in found  # the suite's own finding


def test_the_tool_renders_the_table_alone_from_this_tree():
    out = subprocess.run([sys.executable, str(ROOT / "tools" / "real_bugs.py")], capture_output=True, text=True,
                         check=True, cwd="/").stdout
    assert out == markdown(None) and "## Time to a reproducer" not in out


def _with_damage(fd, blocks, live):
    return {**fd, "damage": {"blocks": blocks, "live_blocks": [b for b in blocks if b], "null": 0,
                             "null_written": 0 if 0 in blocks else None, "live": live}}


def test_a_result_under_the_fused_core_is_a_column_and_its_differences_a_section():
    """Each further result (the bench under `--kernels gdn=xpu_semantics`) adds a column: first
    divergence, the state blocks apart there (the null block marked), whether a live request is
    hurt; the B70 section lists the rules read (with their sources), what is unknown, the hazard the
    core refuses, and each record hazard whose outcome differs."""
    base = json.loads(json.dumps(RATES))
    base["kernels"] = {"gdn_attention": "reference"}
    told = base["hunt_rates"]["shape-only-uniform-decode"]["told"]
    told["first_divergence"] = _with_damage(FD, [1, 2], True)
    xpu = json.loads(json.dumps(base))
    xpu["kernels"] = {"gdn_attention": "xpu_semantics"}
    xpu["hunt_rates"]["shape-only-uniform-decode"]["told"]["first_divergence"] = _with_damage(FD, [0, 1, 2], True)
    xpu["hunt_rates"]["pad-sentinel-mismatch"] = {"skipped": "refused by the fused GDN core: ...", "told": None,
                                                  "blind": None}
    md = markdown(base, xpu)
    assert "live hurt: default providers |" in md and "live hurt: `xpu_semantics` |" in md
    row = next(x for x in md.splitlines() if x.startswith("| vLLM #53051"))
    assert "blocks apart: 1, 2; live request hurt: yes" in row and "blocks apart: 0 (null), 1, 2; live" in row
    assert "refused (below)" in next(x for x in md.splitlines() if x.startswith("| vLLM #35431"))
    section = md.split("## The B70's GDN kernel", 1)[1].split("## What the rebuild cannot express")[0]
    assert all(where in section for _, where in RULES) and all(u in section for u in UNKNOWN)
    assert "`pad-sentinel-mismatch`" in section and "ssm_state[-1]" in section
    assert "`shape-only-uniform-decode` differs under `xpu_semantics`" in section
    assert "RATES-1.json" in md and "## Time to a reproducer: `xpu_semantics`" in md
