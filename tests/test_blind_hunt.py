"""The blind hunt: `repro hunt --stack S` with no hazard searches the stack profile as a release
has it, shrinks what it finds and names the rule at fault and its upstream issue (vLLM #53051 for
vLLM 0.33's V1 runner at K=2); the fixed stack gives nothing to find."""
import contextlib
import io
import json

import pytest

from repro.cli.app import main
from repro.graphs import make_provider
from repro.islands import Model
from repro.job.cases import Case, run_case
from repro.knobs.options import ControlRules
from repro.knobs.stacks import STACKS
from repro.scheduler.sequence import Request, Sequence
from repro.search.blame import fixed_form

MRV1 = "vllm-0.33-mrv1"


@pytest.fixture(scope="module")
def blind(tiny_path, tmp_path_factory):
    """One blind hunt of vLLM 0.33's V1 runner at K=2 (derandomised, bounded), shared by the tests."""
    d = tmp_path_factory.mktemp("blind")
    save, out = d / "min.json", d / "out.json"
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        rc = main(["hunt", "--model", tiny_path, "--device", "cpu", "--stack", MRV1, "--spec-tokens", "2",
                   "--profile", "ci", "--max-examples", "40", "--save", str(save), "--json", str(out)])
    return rc, stdout.getvalue(), json.loads(out.read_text()), save


def test_the_blind_hunt_names_uniform_decode_and_vllm_53051(blind):
    rc, out, doc, _ = blind
    assert rc == 1
    blame_line = next(x for x in out.splitlines() if x.startswith("blame"))
    assert "uniform_decode" in blame_line and "vLLM #53051" in blame_line, out
    # the minimal sequence: one request whose prompt is one decode's shape, 1+K tokens
    seq = doc["minimal_sequence"]
    assert [r["prompt_len"] for r in seq["requests"]] == [3] and len(seq["steps"]) <= 2, seq
    lines = out.splitlines()
    assert json.loads(lines[lines.index(blame_line) + 1]) == seq  # the sequence, one line
    assert any(x.startswith("first divergence: step 0") for x in lines), out
    replay = next(x for x in lines if x.startswith("replay: "))
    assert f"--stack {MRV1}" in replay and "--sequence" in replay
    # no --mode: every mode the profile runs was searched, and the one that found it is named
    assert doc["mode"] in ("full_and_piecewise", "full_decode_only") and f"mode: {doc['mode']}" in lines
    assert f"--mode {doc['mode']}" in replay and doc["results"][0]["mode"] == doc["mode"]


def test_a_blind_hunt_searches_every_mode_of_its_profile_and_a_told_one_its_hazards():
    from repro.commands.hunt import HuntConfig, default_mode
    from repro.search.blind import hunt_modes
    every = ("full_and_piecewise", "piecewise", "full_decode_only")
    assert hunt_modes(HuntConfig(stack=MRV1), "piecewise") == STACKS[MRV1].modes == every
    assert hunt_modes(HuntConfig(), "piecewise") == every  # the fixed stack's blind hunt too
    assert hunt_modes(HuntConfig(stack=MRV1, mode="piecewise"), "x") == ("piecewise",)
    told = ("shape-only-uniform-decode",)
    assert hunt_modes(HuntConfig(hazards=told), default_mode(told)) == ("full",)  # its FULL graph


def test_the_saved_json_records_the_stack_k_and_the_blame(blind):
    _, _, doc, save = blind
    assert json.loads(save.read_text()) == doc
    assert doc["stack"] == MRV1 and doc["spec_tokens"] == 2 and doc["data_parallel"] is False
    b = doc["blame"]
    assert "uniform_decode" in b["rules"] and "shape-only-uniform-decode" in b["hazards"]
    assert "vLLM #53051" in b["upstream"] and b["tried"] >= len(b["rules"])
    assert doc["results"][0]["diverged"] and doc["minimal_sequence"]["spec_tokens"] == 2


def test_the_rules_replaced_clear_the_failure(tiny_path):
    """The blame's rerun: the same case and sequence, with the stack's rules or with uniform
    decode in its fixed form (vLLM PR #53059)."""
    provider = make_provider("cpu")
    model = Model(tiny_path, provider.device, None, island="submod0")
    seq = Sequence([Request(0, 3, 0)], num_slots=16, max_tokens=16, spec_tokens=2)
    case = Case("chain", "full_and_piecewise", spec_tokens=2, stack=MRV1)
    assert run_case(model, provider, case, seq).diverged
    cleared = run_case(model, provider, case, seq, rules=fixed_form(STACKS[MRV1].rules, ["uniform_decode"]))
    assert not cleared.diverged and not cleared.detected
    assert not run_case(model, provider, case, seq, rules=ControlRules()).diverged


def test_a_blind_hunt_of_the_fixed_stack_finds_nothing(tiny_path, tmp_path, capsys):
    rc = main(["hunt", "--model", tiny_path, "--device", "cpu", "--stack", "fixed", "--spec-tokens", "2",
               "--mode", "full", "--profile", "ci", "--max-examples", "4", "--save", str(tmp_path / "m.json")])
    assert rc == 0 and "nothing found" in capsys.readouterr().out
    assert not (tmp_path / "m.json").exists()


def test_the_report_states_the_stack_and_replays_on_it(blind, tmp_path):
    """`repro report` on a blind hunt's result: the profile is the result's own unless --stack says
    otherwise, and the `repro run` replay line names it when it is not the fixed one."""
    _, _, _, save = blind
    assert main(["report", str(save), "-o", str(tmp_path / "own"), "--no-verify"]) == 0
    md = (tmp_path / "own" / "REPORT.md").read_text()
    assert f"| stack profile | `{MRV1}`" in md and "| rule at fault | `uniform_decode`" in md
    replay = next(x for x in md.splitlines() if x.startswith("repro run") and "sequence.json" in x)
    assert f"--stack {MRV1}" in replay
    assert main(["report", str(save), "-o", str(tmp_path / "fixed"), "--no-verify", "--stack", "fixed"]) == 0
    md = (tmp_path / "fixed" / "REPORT.md").read_text()
    replay = next(x for x in md.splitlines() if x.startswith("repro run") and "sequence.json" in x)
    assert "| stack profile | `fixed`" in md and "--stack" not in replay


def test_a_stack_carrying_a_rule_both_copies_share_runs_the_third_copy_every_step():
    """vllm-0.26 classes a one-token first chunk as a decode (vLLM #51565): eager and replay go
    wrong alike, so only the third copy sees it, and a blind hunt of that stack must run it every
    step, not at a GPU's thinned default. The fixed stack and vLLM 0.33 carry no such rule."""
    from repro.knobs.hazards import HAZARDS, reference_cadence
    assert reference_cadence((), "vllm-0.26") == HAZARDS["first-chunk-as-decode"].reference_every == 1
    assert reference_cadence((), "fixed") is None and reference_cadence((), MRV1) is None
    assert reference_cadence(("first-chunk-as-decode",), "fixed") == 1


def test_the_blind_case_of_vllm_026_sees_51565_at_a_gpus_cadence(tiny_path, monkeypatch):
    """The case a blind hunt runs, with the device's default cadence set as a GPU's (every 16th
    step): a 1-token prompt in the slot a finished 1-token prompt left is wrong in both copies at
    step 1, and the third copy still judges that step."""
    from repro.job import cases
    monkeypatch.setattr(cases, "default_every", lambda device: 16)
    provider = make_provider("cpu")
    model = Model(tiny_path, provider.device, None, island="submod0")
    seq = Sequence([Request(0, 1, 0), Request(1, 1, 0, 1)], num_slots=16, max_tokens=16)
    r = run_case(model, provider, Case("chain", "full_and_piecewise", stack="vllm-0.26"), seq)
    assert r.diverged and r.first_divergence["step"] == 1, r.to_json()
    assert not run_case(model, provider, Case("chain", "full_and_piecewise"), seq).diverged
