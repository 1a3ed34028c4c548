"""The standalone script from one source: its math is the suite's reference kernels (copied in
at generation, not kept by hand), it names no hazard itself (the table writes its knobs in), and
for every hazard the table marks `standalone` it finds the same first divergence as the suite."""
import inspect
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from repro.knobs import hazards as hz
from repro.cli.app import main
from repro.report import SCRIPT, load_result, write_report
from repro.report.script import knobs
from repro.report.standalone.generate import ROOTS, math_source, script_options, template

STANDALONE = [h.name for h in hz.HAZARDS.values() if h.standalone]
ROOT = Path(__file__).resolve().parents[1]


def test_the_generated_math_is_the_suites_reference_code():
    """Each root kernel is copied verbatim, and the copy, run with nothing but torch in scope,
    computes what the suite's function computes, bit for bit."""
    import importlib
    src, names = math_source()
    space = {"torch": torch, "F": torch.nn.functional, "math": __import__("math")}
    exec(compile("from __future__ import annotations\n" + src, "generated", "exec"), space)
    for module, name in ROOTS:
        fn = getattr(importlib.import_module(module), name)
        assert inspect.getsource(fn).strip() in src, name
        assert name in names and callable(space[name])
    from kernels.norms.reference import rms_norm_gated_reference
    g = torch.Generator().manual_seed(0)
    x, z, w = (torch.randn(5, 4, 16, generator=g).bfloat16() for _ in range(3))
    assert torch.equal(space["rms_norm_gated_reference"](x, z, w[0, 0], 1e-6), rms_norm_gated_reference(x, z, w[0, 0], 1e-6))


def test_the_template_keeps_no_copy_of_the_kernels():
    """The hand-written template defines no kernel of its own: a kernel name defined there would be
    a second copy that can drift."""
    _, names = math_source()
    defined = set(re.findall(r"^def (\w+)", template(), re.M))
    assert not defined & set(names), defined & set(names)


def test_the_template_rebuilds_every_control_rule():
    """Each rule of `ControlRules` is a `control.*` option of the template, at the fixed form's value,
    so the stack profile a result ran on reaches the script whole (`report.script.rules`)."""
    from dataclasses import fields

    from repro.knobs.options import ControlRules
    from repro.report.script import rules
    opts = script_options()
    fixed = rules({"stack": "fixed"})
    names = {f.name for f in fields(ControlRules)}
    assert {k.partition(".")[2] for k in opts if k.startswith("control.")} == names == set(fixed)
    assert all(opts[f"control.{n}"] == v for n, v in fixed.items()), (opts, fixed)


def test_standalone_rows_set_only_options_the_template_rebuilds():
    k = knobs()
    assert sorted(k["hazards"]) == sorted(STANDALONE) and STANDALONE
    opts = set(script_options())
    for table in k.values():
        for row in table.values():
            assert set(row["sets"]) <= opts


def test_no_hazard_or_repair_name_is_written_by_hand_in_the_report_or_the_template():
    """Names live in repro/knobs/hazards.py; the report and the script get them from the table."""
    names = list(hz.HAZARDS) + list(hz.REPAIRS)
    report = ROOT / "repro" / "report"
    files = sorted(report.rglob("*.py")) + sorted(report.rglob("*.py.in"))  # the template's parts too
    assert (report / "standalone" / "generate.py") in files and len([f for f in files if f.suffix == ".in"]) > 1
    for f in files:
        text = f.read_text()
        for n in names:
            assert not re.search(r"[\"'`]" + re.escape(n) + r"[\"'`]", text), f"{n} in {f.name}"


def _clean_env():
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")}


@pytest.mark.parametrize("hazard", STANDALONE)
def test_the_script_and_the_suite_find_the_same_first_divergence(hazard, tiny_path, tmp_path):
    """Same step, island and tensor, on the CPU, over ~40 steps of the embedded tiny checkpoint (seed 3;
    stale-pad on seed 4, whose first padded FULL replay over rows an earlier decode staged is at step
    17)."""
    mode = hz.HAZARDS[hazard].modes[-1]
    res = tmp_path / "r.json"
    assert main(["run", "--model", tiny_path, "--device", "cpu", "--mode", mode, "--hazard", hazard,
                 "--steps", "40", "--seed", "4" if hazard == "stale-pad" else "3", "--json", str(res)]) == 1
    fd = json.loads(res.read_text())["results"][0]["first_divergence"]
    rep = write_report(load_result(res), tmp_path / "rep", verify=False)
    p = subprocess.run([sys.executable, SCRIPT, "--device", "cpu"], cwd=rep, env=_clean_env(),
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 1, p.stdout + p.stderr
    got = json.loads([x for x in p.stdout.splitlines() if x.startswith("RESULT ")][-1][len("RESULT "):])
    assert (got["step"], got["island"], got["tensor"]) == (fd["step"], fd["island"], fd["tensor"]), (got, fd)
