"""`docs/conformance.md` is generated (`tools/conformance_doc.py`) from the `repro conform --json`
results kept beside it (`docs/conformance/*.json`), and `repro conform`'s table spells out each rule's
first difference. Torch only: rendering reads results, never vLLM."""
import json
import subprocess
import sys
from pathlib import Path

from repro.knobs.modes import Runtime
from repro.knobs.stacks import STACKS
from repro.conform.explain import EXPLAINED, NOT_RUN
from repro.conform.result import RuleResult
from repro.conform.table import markdown, text

ROOT = Path(__file__).resolve().parents[1]
RESULTS = sorted((ROOT / "docs" / "conformance").glob("*.json"))


def test_the_page_is_the_tools_rendering_of_the_kept_results():
    out = subprocess.run([sys.executable, str(ROOT / "tools" / "conformance_doc.py"), *map(str, RESULTS)],
                         capture_output=True, text=True, check=True, cwd="/").stdout
    assert out == (ROOT / "docs" / "conformance.md").read_text()
    assert out == markdown([json.loads(p.read_text()) for p in RESULTS])


def test_the_kept_results_run_each_profile_against_its_release_and_each_family_10000_calls():
    docs = [json.loads(p.read_text()) for p in RESULTS]
    claimed = {d["stack"]: d for d in docs if d["claimed"] == d["vllm"]}
    assert set(claimed) == {"vllm-0.33-mrv1", "vllm-0.26"}
    for d in claimed.values():
        assert d["differences"] == 0 and d["unwritten_replays"] == 0
        assert all(f["calls"] >= 10_000 for f in d["families"].values()), d["families"]
    assert all(d["differences"] > 0 for d in docs if d["claimed"] != d["vllm"])  # the negative controls


def test_the_page_says_measured_or_read_for_every_profile_and_rule():
    page = (ROOT / "docs" / "conformance.md").read_text()
    header = next(line for line in page.splitlines() if line.startswith("| rule | vLLM function |"))
    assert all(f"`{s}`" in header for s in STACKS)
    for rule in NOT_RUN:
        assert f"| {rule} |" in page
    for key in EXPLAINED:
        assert f"**{key}**" in page


def _doc(results, vllm="0.33.0", stack="vllm-0.33-mrv1"):
    return {"vllm": vllm, "stack": stack, "claimed": "0.33.0", "seed": 0, "command": "repro conform",
            "budget": {"cases": 1, "sequences": 1}, "differences": sum(r.unexplained for r in results),
            "unwritten_replays": 0, "families": {"dispatch": {"calls": 1, "seconds": 0.0}},
            "rules": [{"family": "dispatch", **r.to_json()} for r in results]}


def test_a_difference_is_counted_and_the_first_spelled_out_unless_explained():
    r = RuleResult("dispatch", "v1/cudagraph_dispatcher.py: CudagraphDispatcher.dispatch", "mirror")
    assert r.compare("dispatch(5)", {"runtime": ("FULL", "FULL")})
    assert not r.compare("dispatch(6)", {"runtime": (Runtime.NONE, Runtime.PIECEWISE), "key": (1, 1)})
    r.compare("dispatch(7)", {"runtime": ("NONE", "FULL")})
    r.compare(lambda: "dispatch(8)", {"runtime": (1, 2)}, lambda f, v, m: "padded decode tokens")
    assert (r.calls, r.unexplained, dict(r.explained)) == (4, 2, {"padded decode tokens": 1})
    table = text(_doc([r]))
    assert "[1] dispatch(6): runtime is NONE in vLLM, PIECEWISE in the mirror" in table
    assert "vllm/v1/cudagraph_dispatcher.py: CudagraphDispatcher.dispatch" in table
    assert "2 unexplained difference(s)" in table
