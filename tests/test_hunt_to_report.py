"""From a blind hunt to an upstream report, as a new user walks it: `repro hunt --stack
vllm-0.33-mrv1` finds vLLM #53051, `repro report` writes it up naming the rule the hunt blamed,
its upstream issue and its fix, the hunt's own command and a replay line for that one case; the
generated script's `--repair` applies that fix; a hunt file replays on the stack it was found on;
and a result file is checked field by field before a report is written from it."""
import contextlib
import io
import json
import shlex
from pathlib import Path

import pytest

from refusals import refused
from repro.cli.app import main
from repro.report import SCRIPT
from scripts import run_script

MRV1 = "vllm-0.33-mrv1"


@pytest.fixture(scope="module")
def found(tiny_path, tmp_path_factory):
    """A blind hunt of vLLM 0.33's V1 runner (derandomised, bounded) and its verified report."""
    d = tmp_path_factory.mktemp("found")
    save, rep = d / "HUNT.json", d / "rep"
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["hunt", "--model", tiny_path, "--device", "cpu", "--stack", MRV1, "--spec-tokens", "2",
                     "--profile", "ci", "--max-examples", "40", "--save", str(save)]) == 1
        assert main(["report", str(save), "-o", str(rep)]) == 0
    return save, rep, (rep / "REPORT.md").read_text()


def _section(md: str, title: str) -> str:
    return md.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


def test_the_report_of_a_blind_finding_names_the_rule_its_issue_and_its_fix(found):
    _, _, md = found
    for needle in ("`uniform_decode`", "vLLM #53051", "vLLM PR #53059", "`past-prompt-uniform`"):
        assert needle in md, needle
    repairs = _section(md, "Repairs")
    assert "`past-prompt-uniform`" in repairs and "vLLM PR #53059" in repairs
    for wrong in ("sanitize-pad", "clone-outputs", "private-pool", "copy-inputs"):  # not the fix of this rule
        assert wrong not in repairs, repairs
    row = next(x for x in repairs.splitlines() if x.startswith("| `past-prompt-uniform`"))
    assert "| yes |" in row, row  # run here: the fix clears it
    cases = _section(md, "Public cases")
    assert "vLLM #53051" in cases and "vLLM PR #53059" in cases and "PyTorch #122192" not in cases


def test_the_scripts_repair_with_no_name_applies_the_fix_the_hunt_named(found):
    _, rep, md = found
    p, res = run_script(rep)
    assert p.returncode == 1 and res["diverged"], p.stdout + p.stderr
    p, res = run_script(rep, "--repair")
    assert p.returncode == 0 and not res["diverged"], p.stdout + p.stderr
    assert "repair past-prompt-uniform" in p.stdout
    assert f"python {SCRIPT} --repair   # with past-prompt-uniform" in md


def test_the_report_shows_the_hunts_own_command_and_replays_that_one_case(found, tiny_path, tmp_path, monkeypatch):
    save, rep, md = found
    ran = _section(md, "What was run")
    command = ran.split("```sh\n", 1)[1].split("\n```", 1)[0]
    assert command.startswith("repro hunt ") and f"--stack {MRV1} --spec-tokens 2" in command, command
    replay = next(x for x in ran.splitlines() if x.startswith("repro run"))
    argv = [tiny_path if x == "CHECKPOINT" else x for x in shlex.split(replay)][1:]
    monkeypatch.chdir(rep)  # the line names sequence.json beside REPORT.md
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(argv + ["--json", str(tmp_path / "r.json")]) == 1
    rows = json.loads((tmp_path / "r.json").read_text())["results"]
    assert len(rows) == 1, [(r["island"], r["mode"], r["hazards"], r["repairs"]) for r in rows]
    assert rows[0]["diverged"] and rows[0]["hazards"] == [] and rows[0]["stack"] == MRV1


def test_a_hunt_file_replays_on_the_stack_it_was_found_on(found, tiny_path, tmp_path, capsys):
    save, rep, _ = found
    for seq in (save, rep / "sequence.json"):
        out = tmp_path / f"{seq.stem}.json"
        assert main(["run", "--model", tiny_path, "--device", "cpu", "--island", "gdn_core", "--sequence", str(seq),
                     "--json", str(out)]) == 1, capsys.readouterr()
        doc = json.loads(out.read_text())
        assert doc["stack"] == MRV1 and doc["results"][0]["diverged"]
    capsys.readouterr()
    refused(capsys, ["run", "--model", tiny_path, "--device", "cpu", "--island", "gdn_core", "--sequence", str(save),
                     "--stack", "fixed"], "--stack fixed", MRV1)


def test_the_summary_states_k_and_the_block_size_and_a_block_size_run_has_its_script(tiny_path, tmp_path):
    rep = tmp_path / "rep"
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["run", "--model", tiny_path, "--device", "cpu", "--steps", "2", "--block-size", "4", "--island",
                     "gdn_core", "--report", str(rep)]) == 0
    md = (rep / "REPORT.md").read_text()
    assert "| block size (prefix caching) | 4 |" in md and "| draft tokens a decode (K) | 0 |" in md
    assert (rep / SCRIPT).is_file()
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    assert "report has no generated script" not in readme


EDITS = {  # a hand edit of a hunt result -> what the refusal names
    "island 5": (lambda d: d["results"][0].update(island=5), "results[0].island"),
    "unknown island": (lambda d: d["results"][0].update(island="submod9"), "results[0].island"),
    "step x": (lambda d: d["results"][0].update(first_divergence={"step": "x"}), "results[0].first_divergence"),
    "mode weird": (lambda d: d["results"][0].update(mode="weird"), "results[0].mode"),
    "stack": (lambda d: d.update(stack="vllm-9.9"), "stack"),
    "row stack": (lambda d: d["results"][0].update(stack="vllm-9.9"), "results[0].stack"),
    "spec_tokens": (lambda d: d.update(spec_tokens="two"), "spec_tokens"),
    "kernel_sentinel": (lambda d: d.update(kernel_sentinel=3), "kernel_sentinel"),
    "steps": (lambda d: d["results"][0].update(steps=-4), "results[0].steps"),
    "diverged": (lambda d: d["results"][0].update(diverged="yes"), "results[0].diverged"),
    "hazards": (lambda d: d["results"][0].update(hazards="stale-pad"), "results[0].hazards"),
    "blame": (lambda d: d["blame"].update(rules=["no_such_rule"]), "blame.rules"),
    "max_abs": (lambda d: d["results"][0]["first_divergence"].update(max_abs="big"), "max_abs"),
}


@pytest.mark.parametrize("edit", list(EDITS))
def test_a_hand_edited_result_is_refused_field_by_field(found, tmp_path, capsys, edit):
    save, _, _ = found
    doc = json.loads(save.read_text())
    change, field = EDITS[edit]
    change(doc)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    refused(capsys, ["report", str(bad), "-o", str(tmp_path / "out"), "--no-verify"], str(bad), field)
    assert not (tmp_path / "out").exists()
