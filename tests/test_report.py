"""`repro report` and `--report DIR`: the bug report of a planted divergence on the CPU, and its
standalone script run the way a maintainer would (its own folder, no PYTHONPATH, nothing of this
suite importable from there): exit 1 where the divergence reproduces, 0 with the repair."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from repro.cli import main
from repro.report import SCRIPT


def run_standalone(folder: Path, *args) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")}
    return subprocess.run([sys.executable, SCRIPT, "--device", "cpu", *args], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=300)


def result_line(p: subprocess.CompletedProcess) -> dict:
    lines = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
    assert lines, p.stdout + p.stderr
    return json.loads(lines[-1][len("RESULT "):])


def check_self_contained(folder: Path) -> None:
    src = (folder / SCRIPT).read_text()
    imports = set(re.findall(r"^\s*(?:import|from)\s+([\w.]+)", src, re.M))
    roots = {m.split(".")[0] for m in imports}
    assert roots <= {"__future__", "argparse", "json", "math", "os", "sys", "torch", "safetensors",
                     "intel_extension_for_pytorch"}, roots
    compile(src, SCRIPT, "exec")


def test_stale_pad_report_and_its_standalone_script(tiny_path, tmp_path):
    res, rep = tmp_path / "r.json", tmp_path / "report"
    rc = main(["run", "--model", tiny_path, "--device", "cpu", "--mode", "full", "--hazard", "stale-pad",
               "--steps", "24", "--json", str(res), "--report", str(rep)])
    assert rc == 1
    fd = json.loads(res.read_text())["results"][0]["first_divergence"]
    assert {p.name for p in rep.iterdir()} >= {"REPORT.md", "env.txt", SCRIPT, "sequence.json", "result.json"}
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".report.")]  # no temp dir left behind

    md = (rep / "REPORT.md").read_text()
    title = md.splitlines()[0]
    assert title.startswith("# ") and "stale-pad" in title and "cpu-tape" in title and "gdn_core" in title
    for section in ("## Environment", "## What was run", "## Expected vs actual", "## Minimal request sequence",
                    "## First divergence", "## Repairs", "## Standalone reproducer", "## Public cases"):
        assert section in md, section
    assert re.search(r"repro run --model \S+ --device cpu --mode full --hazard stale-pad --steps 24", md)  # what ran
    assert f"step {fd['step']}: `gdn_core.{fd['tensor']}`" in md
    assert "padded rows' state indices" in md  # the microscope's context
    assert re.search(r"\| `sanitize-pad` \| yes \| [\d,]+ \| [\d,]+ \| [\d.]+x \|", md), md  # clears it, at a cost
    assert "regenerated from seed 0" in md
    assert "[vLLM 37728](https://github.com/vllm-project/vllm/issues/37728)" in md
    env = (rep / "env.txt").read_text()
    for word in ("torch", "python", "intel_extension_for_pytorch", "oneccl", "xccl", "triton", "fla", "cpu "):
        assert word in env, word

    check_self_contained(rep)
    bad = run_standalone(rep)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    got = result_line(bad)
    assert (got["step"], got["island"], got["tensor"], got["slot"]) == \
        (fd["step"], "gdn_core", fd["tensor"], fd["slot"])
    assert "regenerated from seed 0" in bad.stdout
    good = run_standalone(rep, "--repair")
    assert good.returncode == 0, good.stdout + good.stderr
    assert "sanitize-pad" in good.stdout and result_line(good)["diverged"] is False


def test_frozen_python_state_report_from_a_result_file(tiny_path, tmp_path, capsys):
    res, rep = tmp_path / "r.json", tmp_path / "report"
    assert main(["run", "--model", tiny_path, "--device", "cpu", "--mode", "piecewise", "--hazard",
                 "frozen-python-state", "--steps", "24", "--json", str(res)]) == 1
    # the script is checked below by the test itself, so the report need not run it
    assert main(["report", str(res), "-o", str(rep), "--no-verify"]) == 0
    assert "REPORT.md" in capsys.readouterr().out
    md = (rep / "REPORT.md").read_text()
    assert "frozen-python-state" in md.splitlines()[0]
    assert "num_actual_tokens" in md and "PyTorch 114844" in md
    assert re.search(r"\| `recapture` \| yes \|", md) and re.search(r"\| `eager-family=moe` \| yes \|", md)

    check_self_contained(rep)
    fd = json.loads(res.read_text())["results"][0]["first_divergence"]
    bad = run_standalone(rep)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert result_line(bad)["step"] == fd["step"] and result_line(bad)["island"] == "submod1"
    good = run_standalone(rep, "--repair")
    assert good.returncode == 0, good.stdout + good.stderr
    assert "recapture" in good.stdout


def test_a_hazard_without_a_standalone_script_says_so(tiny_path, tmp_path):
    res, rep = tmp_path / "r.json", tmp_path / "report"
    main(["run", "--model", tiny_path, "--device", "cpu", "--mode", "piecewise", "--hazard", "output-alias",
          "--steps", "6", "--json", str(res)])
    assert main(["report", str(res), "-o", str(rep), "--no-verify"]) == 0
    assert not (rep / SCRIPT).exists()
    assert "No standalone script is generated" in (rep / "REPORT.md").read_text()


@pytest.mark.parametrize("content, message", [
    (None, "does not exist"),
    ("{not json", "not JSON"),
    ('{"results": []}', "non-empty `results`"),
    ('{"results": [{"island": "chain"}]}', "lacks"),
])
def test_a_missing_or_malformed_result_exits_2_and_writes_nothing(content, message, tmp_path, capsys):
    res, rep = tmp_path / "r.json", tmp_path / "report"
    if content is not None:
        res.write_text(content)
    assert main(["report", str(res), "-o", str(rep)]) == 2
    assert message in capsys.readouterr().err
    assert not rep.exists()


def test_a_failure_midway_leaves_no_half_written_report(tiny_path, tmp_path, monkeypatch):
    """Even with --force, a report that fails while it is written leaves the previous one whole:
    everything is built in a scratch folder and moved in only at the end."""
    import repro.report as report
    res, rep = tmp_path / "r.json", tmp_path / "report"
    main(["run", "--model", tiny_path, "--device", "cpu", "--mode", "full", "--hazard", "stale-pad",
          "--steps", "6", "--json", str(res)])
    report.write_report(report.load_result(res), rep, verify=False)
    before = {p.name: p.read_bytes() for p in rep.iterdir()}

    def boom(*a, **k):
        raise RuntimeError("disk full")
    monkeypatch.setattr(report, "repair_rows", boom)
    monkeypatch.setattr(report, "make_standalone", boom)
    with pytest.raises(RuntimeError):
        report.write_report(report.load_result(res), rep, verify=False, force=True)
    assert {p.name: p.read_bytes() for p in rep.iterdir()} == before  # untouched, no scratch folder left
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json", "report"]
