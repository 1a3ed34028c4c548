"""The command line contract: exit codes, JSON results, hunting to a minimal sequence."""
import json
import shutil

import pytest

from repro.cli.app import main


def test_run_baseline_exits_0_and_writes_the_json_contract(tiny_path, tmp_path, capsys):
    out = tmp_path / "r.json"
    rc = main(["run", "--model", tiny_path, "--device", "cpu", "--island", "submod0", "--steps", "24",
               "--json", str(out)])
    assert rc == 0
    d = json.loads(out.read_text())
    assert {"device", "graph_provider", "torch", "checkpoint", "results", "command"} <= set(d)
    assert d["command"].startswith("repro run ") and "--steps 24" in d["command"]
    r = d["results"][0]
    assert {"island", "hazards", "repairs", "steps", "diverged", "first_divergence", "eager_us", "replay_us"} <= set(r)
    assert r["diverged"] is False and r["steps"] > 0
    # the third copy checked every step: how close rounding came to each bound (0: the same bits)
    assert "submod0.qkv" in r["bound_usage"] and all(0 <= v <= 1 for v in r["bound_usage"].values())
    out = capsys.readouterr().out
    assert "result" in out and "rounding used at most" in out


def test_run_with_a_planted_hazard_exits_1(tiny_path, tmp_path):
    out = tmp_path / "r.json"
    rc = main(["run", "--model", tiny_path, "--device", "cpu", "--mode", "full", "--hazard", "stale-pad",
               "--json", str(out)])
    assert rc == 1
    fd = json.loads(out.read_text())["results"][0]["first_divergence"]
    assert fd["island"] == "gdn_core" and fd["slot"] is not None


@pytest.mark.parametrize("argv, message", [
    (["run", "--island", "nope"], "unknown island"),
    (["run", "--hazard", "nope"], "unknown hazard"),
    (["run", "--mode", "piecewise", "--hazard", "stale-pad"], "needs full graphs"),
    (["run", "--device", "cpu", "--hazard", "async-output-copy", "--mode", "piecewise"], "streams"),
    (["run", "--island", "submod0", "--layer", "3"], "full_attention layer"),
    (["run", "--island", "submod0", "--layer", "99"], "out of range"),
    (["inspect", "/no/such/dir"], "/no/such/dir"),
])
def test_bad_input_exits_2_with_a_message(argv, message, tiny_path, capsys):
    if argv[0] == "run":
        argv = argv + ["--model", tiny_path, "--steps", "6"] + ([] if "--device" in argv else ["--device", "cpu"])
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_a_device_that_is_not_there_exits_2(capsys):
    import torch
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    assert main(["run", "--device", "cuda", "--steps", "4"]) == 2
    assert "cuda" in capsys.readouterr().err


def test_inspect_a_corrupted_checkpoint_exits_2(tiny_path, tmp_path, capsys):
    bad = tmp_path / "bad"
    shutil.copytree(tiny_path, bad)
    (bad / "config.json").unlink()
    assert main(["inspect", str(bad)]) == 2
    assert "config.json" in capsys.readouterr().err


@pytest.mark.parametrize("hazard", ["stale-pad", "frozen-python-state"])
def test_hunt_shrinks_to_a_small_replayable_sequence(hazard, tiny_path, tmp_path, capsys):
    save = tmp_path / "min.json"
    # the bound covers the shrinking too: enough for the shrinker to get the sequence this small
    rc = main(["hunt", "--model", tiny_path, "--device", "cpu", "--hazard", hazard, "--max-examples", "150",
               "--profile", "ci", "--save", str(save)])
    assert rc == 1
    seq = json.loads(save.read_text())["minimal_sequence"]
    # stale-pad's smallest: four prompts, a decode of the four that stages four rows, then three
    # padded to size 4 over the fourth's stale row (3 steps; sizes 1, 2, 4, ...: fewer requests are
    # never padded); the bound of 150 sequences leaves the shrinker a step or two short of it
    assert len(seq["requests"]) <= 4 and len(seq["steps"]) <= 5
    out = capsys.readouterr().out
    assert "repro run" in out and "--sequence" in out
    # the saved sequence replays to the same divergence
    mode = "full" if hazard == "stale-pad" else "piecewise"
    assert main(["run", "--model", tiny_path, "--device", "cpu", "--mode", mode, "--hazard", hazard,
                 "--sequence", str(save)]) == 1


def test_the_main_job_with_no_arguments_is_clean_and_detects_every_hazard(tmp_path):
    out = tmp_path / "main.json"
    assert main(["run", "--device", "cpu", "--json", str(out)]) == 0
    results = json.loads(out.read_text())["results"]
    assert len(results) >= 20
    for r in results:
        if r["expect"] == "clean":
            assert not r["diverged"], r
        elif r["expect"] == "diverged":
            assert r["diverged"], r
        else:
            assert any(f["kind"] == "undeclared-mutation" for f in r["findings"]), r
