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

from repro.cli.app import main
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
               "--steps", "24", "--seed", "4", "--json", str(res), "--report", str(rep)])
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
    assert re.search(r"repro run --model \S+ --device cpu --mode full --hazard stale-pad --steps 24 --seed 4", md)  # what ran
    assert f"step {fd['step']}: `gdn_core.{fd['tensor']}`" in md
    assert "padded rows' state indices" in md  # the microscope's context
    assert re.search(r"\| `sanitize-pad` \| yes \| [\d,]+ \| [\d,]+ \| [\d.]+x \|", md), md  # clears it, at a cost
    assert "regenerated from seed 0" in md
    assert "[vLLM #37728](https://github.com/vllm-project/vllm/issues/37728)" in md
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
    assert "num_actual_tokens" in md and "PyTorch #114844" in md
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


# -------------------------------------------------------------------------- what a person sees

def _run_json(tiny_path, tmp_path, *args, name="r.json"):
    res = tmp_path / name
    main(["run", "--model", tiny_path, "--device", "cpu", *args, "--json", str(res)])
    return res


def test_counts_agree_with_their_nouns(tiny_path, tmp_path):
    """A one-step run says "1 step" and "1 request", never "1 steps"."""
    res = _run_json(tiny_path, tmp_path, "--mode", "full", "--hazard", "stale-pad", "--steps", "1")
    rep = tmp_path / "rep"
    assert main(["report", str(res), "-o", str(rep), "--no-verify"]) == 0
    md = (rep / "REPORT.md").read_text()
    assert "1 step" in md
    assert not re.search(r"\b1 (steps|requests)\b", md), re.findall(r".*\b1 (?:steps|requests)\b.*", md)


def test_a_hunt_report_states_the_hunts_step_count_and_what_it_shows(tiny_path, tmp_path):
    """The hunt printed its minimal sequence's length; the report names that same number and says
    why it shows fewer steps (those up to the first divergence), instead of contradicting it."""
    from repro.scheduler.sequence import Sequence
    res = _run_json(tiny_path, tmp_path, "--mode", "full", "--hazard", "stale-pad", "--steps", "24", "--seed", "4")
    doc = json.loads(res.read_text())
    seq = doc.pop("sequence")
    seq["steps"] = [b.to_json() for b in Sequence.from_json(seq).batches()]
    doc["minimal_sequence"] = seq
    total, k = len(seq["steps"]), doc["results"][0]["first_divergence"]["step"]
    assert k + 1 < total  # the test needs steps after the divergence
    hunt = tmp_path / "hunt.json"
    hunt.write_text(json.dumps(doc))
    assert main(["report", str(hunt), "-o", str(tmp_path / "rep"), "--no-verify"]) == 0
    md = (tmp_path / "rep" / "REPORT.md").read_text()
    assert f"Shrunk by `repro hunt` to a sequence of {total} steps" in md
    assert f"the first divergence is at step {k}, so the {k + 1} steps up to and including it" in md


def test_repair_costs_compare_runs_of_the_same_steps():
    """A diverging run stops early: its per-step time is never the denominator. The file's healthy
    row is, when it ran as many steps as the repaired one; otherwise no cost is given."""
    from repro.report.repairs import RepairRow, repair_rows
    h = next(x for x in hz_names() if x[1])
    name, rep = h

    def row(hazards, repairs, steps, us, diverged=False):
        return {"island": "chain", "mode": "full", "hazards": hazards, "repairs": repairs, "steps": steps,
                "diverged": diverged, "first_divergence": {"step": steps - 1} if diverged else None,
                "replay_us": us}
    doc = {"results": [row([], [], 30, 100.0), row([name], [], 1, 9000.0, True), row([name], [rep], 30, 120.0)]}
    rows = repair_rows(doc, doc["results"][1], [], {}, None, 0)
    got = next(x for x in rows if x.repair == rep)
    assert got.baseline_us == 100.0 and abs(got.cost - 1.2) < 1e-9
    doc["results"][0]["steps"] = 12
    got = next(x for x in repair_rows(doc, doc["results"][1], [], {}, None, 0) if x.repair == rep)
    assert got.cost is None and "12" in got.why_no_cost
    assert RepairRow("x", False, 50.0, 10.0, "file", steps=1, baseline_steps=30).cost is None


def hz_names():
    from repro.knobs import hazards as hz
    return [(h.name, h.repairs[0] if h.repairs else None) for h in hz.HAZARDS.values()
            if h.islands == ("chain",) and not h.device_only]


def test_the_replay_command_has_no_local_checkpoint_path(tiny_path, tmp_path):
    res = _run_json(tiny_path, tmp_path, "--mode", "full", "--hazard", "stale-pad", "--steps", "6")
    assert main(["report", str(res), "-o", str(tmp_path / "rep"), "--no-verify"]) == 0
    md = (tmp_path / "rep" / "REPORT.md").read_text()
    block = md.split("Replay exactly this case")[1].split("```")[1]
    assert "repro run --model CHECKPOINT --device cpu" in block and str(tiny_path) not in block
    assert "`CHECKPOINT`: your copy of the checkpoint" in md
    assert str(Path(tiny_path).parent) not in md.split("## Environment")[0]  # the summary table neither


def test_the_default_row_is_one_the_standalone_script_rebuilds():
    """A default run's first divergence may be a hazard the script cannot rebuild; the report then
    takes the first divergence it can, so the report comes with a script."""
    from repro.knobs import hazards as hz
    from repro.report import pick
    no = next(h for h in hz.HAZARDS.values() if not h.standalone and h.detected_as == "divergence")
    yes = next(h for h in hz.HAZARDS.values() if h.standalone)

    def row(h, diverged, expect):
        return {"island": "chain", "mode": "piecewise", "hazards": [h] if h else [], "repairs": [],
                "diverged": diverged, "first_divergence": {"step": 3} if diverged else None, "expect": expect}
    doc = {"results": [row(None, False, "clean"), row(no.name, True, "diverged"), row(yes.name, True, "diverged")]}
    assert pick(doc) == 2
    doc["results"][0] = row(None, True, "clean")  # an unexpected divergence still comes first
    assert pick(doc) == 0
    assert pick(doc, 1) == 1


def test_embedded_weights_say_torch_and_safetensors(tiny_path, tmp_path):
    res = _run_json(tiny_path, tmp_path, "--mode", "full", "--hazard", "stale-pad", "--steps", "6")
    rep = tmp_path / "rep"
    assert main(["report", str(res), "-o", str(rep), "--no-verify", "--weights", "embed"]) == 0
    md, script = (rep / "REPORT.md").read_text(), (rep / SCRIPT).read_text()
    assert (rep / "repro_weights.safetensors").exists()
    assert "Or with torch and safetensors" in md and "It needs torch and safetensors" in md
    assert "nothing but torch" not in md and "only torch" not in md
    assert "It needs torch and safetensors" in script
    seeded = tmp_path / "seeded"
    assert main(["report", str(res), "-o", str(seeded), "--no-verify"]) == 0
    assert "Or with only torch" in (seeded / "REPORT.md").read_text()
    assert "It needs only torch" in (seeded / SCRIPT).read_text()


# -------------------------------------------------------------------------- data loss

def test_a_non_empty_report_dir_is_refused_and_kept(tiny_path, tmp_path, capsys):
    res = _run_json(tiny_path, tmp_path, "--mode", "full", "--hazard", "stale-pad", "--steps", "4")
    rep = tmp_path / "rep"
    (rep / "sub").mkdir(parents=True)
    (rep / "notes.txt").write_text("mine\n")
    (rep / "sub" / "data").write_text("mine too\n")
    capsys.readouterr()
    assert main(["report", str(res), "-o", str(rep), "--no-verify"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not empty" in err and "--force" in err and "Traceback" not in err
    assert sorted(p.name for p in rep.iterdir()) == ["notes.txt", "sub"]
    assert (rep / "sub" / "data").read_text() == "mine too\n"
    # --force writes the report beside the user's files and keeps them
    assert main(["report", str(res), "-o", str(rep), "--no-verify", "--force"]) == 0
    assert (rep / "notes.txt").read_text() == "mine\n" and (rep / "sub" / "data").read_text() == "mine too\n"
    assert (rep / "REPORT.md").exists()


def test_force_removes_only_what_the_suite_wrote_before(tiny_path, tmp_path):
    res = _run_json(tiny_path, tmp_path, "--mode", "full", "--hazard", "stale-pad", "--steps", "4")
    rep = tmp_path / "rep"
    assert main(["report", str(res), "-o", str(rep), "--no-verify", "--weights", "embed"]) == 0
    assert (rep / "repro_weights.safetensors").exists()
    (rep / "mine.txt").write_text("keep\n")
    assert main(["report", str(res), "-o", str(rep), "--no-verify", "--force"]) == 0  # seeded this time
    assert not (rep / "repro_weights.safetensors").exists()  # the suite's old file, not written again
    assert (rep / "mine.txt").read_text() == "keep\n"


def test_force_never_overwrites_a_users_file_under_a_report_name(tiny_path, tmp_path, capsys):
    res = _run_json(tiny_path, tmp_path, "--mode", "full", "--hazard", "stale-pad", "--steps", "4")
    rep = tmp_path / "rep"
    rep.mkdir()
    (rep / "REPORT.md").write_text("my own notes\n")
    assert main(["report", str(res), "-o", str(rep), "--no-verify", "--force"]) == 2
    assert "not written by repro" in capsys.readouterr().err
    assert (rep / "REPORT.md").read_text() == "my own notes\n"


def test_dot_as_the_output_dir(tiny_path, tmp_path, monkeypatch, capsys):
    """`-o .` writes into an empty current directory, and refuses a non-empty one in one line."""
    res = _run_json(tiny_path, tmp_path, "--mode", "full", "--hazard", "stale-pad", "--steps", "4")
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    assert main(["report", str(res), "-o", ".", "--no-verify"]) == 0
    assert (here / "REPORT.md").exists()
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "x").write_text("x")
    monkeypatch.chdir(busy)
    capsys.readouterr()
    assert main(["report", str(res), "-o", ".", "--no-verify"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert sorted(os.listdir(busy)) == ["x"]


def test_run_report_into_a_non_empty_dir_is_refused(tiny_path, tmp_path, capsys):
    rep = tmp_path / "rep"
    rep.mkdir()
    (rep / "keep.txt").write_text("k")
    rc = main(["run", "--model", tiny_path, "--device", "cpu", "--mode", "full", "--hazard", "stale-pad",
               "--steps", "4", "--report", str(rep)])
    assert rc == 2 and "not empty" in capsys.readouterr().err
    assert sorted(os.listdir(rep)) == ["keep.txt"]


def test_repairs_rerun_at_the_results_draft_tokens(tiny_path, tmp_path):
    """A result at K = 2 (vLLM #53051's hazard) re-runs its repairs with K = 2 copies over its own
    steps, which carry the drafts: each fixed form of the uniform-decode rule clears it, and the
    replay-side assertion turns it into the loud finding it is meant to be."""
    from repro.islands import Model
    from repro.report import load_result, repair_rows, steps_that_ran
    res = tmp_path / "r.json"
    assert main(["run", "--model", tiny_path, "--device", "cpu", "--mode", "full_and_piecewise",
                 "--hazard", "shape-only-uniform-decode", "--steps", "12", "--json", str(res)]) == 1
    doc = load_result(res)
    r = doc["results"][0]
    assert r["spec_tokens"] == 2 and r["diverged"]
    steps, seqj, _ = steps_that_ran(doc, r, None)
    rows = {x.repair: x for x in repair_rows(doc, r, steps, seqj, Model(tiny_path, "cpu"), None)}
    assert rows["past-prompt-uniform"].diverged is False and rows["no-hybrid-prefill"].diverged is False
    assert rows["past-prompt-uniform"].comparable
    assert rows["replay-assert"].diverged is True  # the loud error: detected, not clean


def test_drafts_dummy_steps_and_a_block_size_all_get_a_script():
    """The generated script drives steps with draft tokens or none, an idle rank's dummy steps and
    prefix caching's block size; an island it does not rebuild gets none, and the reason says so."""
    from repro.report import standalone_gap
    base = {"island": "chain", "hazards": [], "repairs": []}
    for extra in ({}, {"spec_tokens": 2}, {"data_parallel": True},
                  {"block_size": 4, "spec_tokens": 2, "data_parallel": True}):
        assert standalone_gap({**base, **extra}) is None, extra
    assert "island moe is not rebuilt" in standalone_gap({**base, "island": "moe"})


def test_a_record_hazard_without_a_generated_script_names_its_hand_written_one():
    from repro.report import standalone_gap
    why = standalone_gap({"island": "chain", "hazards": ["first-chunk-as-decode"], "repairs": []})
    assert "repro/report/standalone/vllm_51565.py (vLLM #51565)" in why and "vllm_53051" not in why


def test_a_fault_both_copies_share_gets_no_generated_script(tiny_path, tmp_path):
    """vLLM #51565 under vllm-0.26's rules: a one-token first chunk continues the state its block
    held, in eager and replay alike, so only the third copy departs. The generated script compares
    eager with replay and would call it clean, so the report writes none and names the hand-written
    reproducer of #51565 instead."""
    from repro.report import SCRIPT, load_result, write_report
    seq = {"requests": [{"rid": i, "prompt_len": 1, "decode_steps": 0, "arrive": i, "preempt_after": None,
                         "accept": None} for i in (0, 1)], "num_slots": 1, "max_tokens": 16, "vocab": 512, "seed": 0,
           "steps": [{"step": i, "request_ids": [i], "slots": [1], "query_lens": [1], "has_initial_state": [False],
                      "token_ids": [105 + i], "num_computed": [0], "prompt_lens": [1]} for i in (0, 1)]}
    (tmp_path / "s.json").write_text(json.dumps(seq))
    res = tmp_path / "r.json"
    assert main(["run", "--model", tiny_path, "--device", "cpu", "--sequence", str(tmp_path / "s.json"),
                 "--stack", "vllm-0.26", "--island", "gdn_core", "--json", str(res)]) == 1
    doc = load_result(res)
    assert doc["results"][0]["microscope"]["departed"] == "both"
    rep = write_report(doc, tmp_path / "rep", verify=False)
    assert not (rep / SCRIPT).exists()
    assert "vllm_51565.py" in (rep / "REPORT.md").read_text()
