"""The command line as a new user meets it: bad input refused in one line (exit 2) before any work,
never a traceback nor a silent no-op; a closed stdout and SIGINT handled the same way by every
command; nothing written into the working directory; help that says what each command is for and
names only options the command has; output that fits the terminal it is printed on."""
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from refusals import refused
from repro.cli.app import main

ROOT = Path(__file__).resolve().parent.parent
QUICK_BENCH = ["bench", "--island", "submod0", "--iters", "1", "--warmup", "0", "--no-repairs", "--no-tiny-rates",
               "--quiet"]
QUICK_RUN = ["run", "--island", "submod0", "--steps", "2"]


def _env(tmp_path, **extra):
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    return {**env, "PYTHONPATH": str(ROOT), "REPRO_CACHE": str(tmp_path / "cache"), **extra}


def test_bench_mode_none_is_refused_not_a_traceback(tiny_path, capsys):
    refused(capsys, ["bench", "--model", tiny_path, "--device", "cpu", "--mode", "none", "--iters", "1", "--batches",
                     "1", "--no-repairs", "--no-tiny-rates"], "--mode none")


@pytest.mark.parametrize("argv, needles", [
    (["--island", "submod0", "--hazard", "shared-pool-weakref"], ["submod0", "submod1"]),
    (["--island", "submod1", "--hazard", "output-alias"], ["submod1", "submod0"]),
    (["--island", "submod0", "--hazard", "fresh-alloc-split-op"], ["submod0", "submod1"]),
    (["--island", "submod1", "--hazard", "escaped-capture"], ["submod1", "submod0"]),
    (["--island", "submod0", "--mode", "FULL"], ["--mode full_and_piecewise", "island submod0", "piecewise"]),
    (["--island", "gdn_core", "--mode", "piecewise"], ["--mode piecewise", "island gdn_core"]),
    (["--island", "submod0", "--hazard", "comm-noop-capture"], ["not submod0"]),
])
def test_a_hazard_or_mode_the_island_cannot_show_is_refused(tiny_path, capsys, argv, needles):
    refused(capsys, ["run", "--model", tiny_path, "--device", "cpu", "--steps", "2", *argv], *needles)


def test_a_refusal_names_the_mode_the_island_runs_in_not_an_option_never_given(tiny_path, capsys):
    err = refused(capsys, ["run", "--model", tiny_path, "--device", "cpu", "--island", "submod0", "--hazard",
                           "stale-pad", "--steps", "2"], "island submod0")
    assert "--mode" not in err.split("(")[0], err
    err = refused(capsys, ["run", "--model", tiny_path, "--device", "cpu", "--island", "moe", "--hazard", "stale-pad",
                           "--steps", "2"], "moe")
    assert "--mode piecewise" not in err, err


def test_a_hazard_the_isolated_island_can_show_still_runs(tiny_path, capsys):
    assert main(["run", "--model", tiny_path, "--device", "cpu", "--island", "submod1", "--hazard",
                 "fresh-alloc-split-op", "--steps", "4"]) == 1
    assert "detected" in capsys.readouterr().out


@pytest.mark.parametrize("backend, needle", [("foo", "'foo'"), ("nccl", "nccl")])
def test_a_comm_backend_that_cannot_run_here_is_one_line(tiny_path, capsys, monkeypatch, backend, needle):
    import torch
    if backend == "nccl" and torch.cuda.is_available():
        pytest.skip("NCCL can run here (a CUDA device): the refusal is for a machine without one")
    monkeypatch.setenv("REPRO_COMM_BACKEND", backend)
    refused(capsys, ["run", "--model", tiny_path, "--device", "cpu", "--island", "forced_comm", "--tp", "2", "--steps",
                     "2"], "REPRO_COMM_BACKEND", needle)


@pytest.mark.parametrize("argv", [
    ["run", "--island", "submod0", "--steps", "2", "--json", "{d}/same.json", "--trace", "{d}/same.json"],
    ["run", "--island", "submod0", "--steps", "2", "--json", "{d}/same.json", "--trace", "{d}/./same.json"],
    ["hunt", "--hazard", "stale-pad", "--max-examples", "1", "--save", "{d}/same.json", "--json", "{d}/same.json"],
    ["bench", "--island", "submod0", "--iters", "1", "--json", "{d}/same.png", "--plot", "{d}/same.png"],
    ["run", "--island", "submod0", "--steps", "2", "--json", "{d}/rep/REPORT.md", "--report", "{d}/rep"],
])
def test_two_outputs_may_not_share_a_path(tiny_path, tmp_path, capsys, argv):
    (tmp_path / "rep").mkdir()
    argv = [x.format(d=tmp_path) for x in argv] + ["--model", tiny_path, "--device", "cpu"]
    refused(capsys, argv, "same")
    assert sorted(os.listdir(tmp_path)) == ["rep"] and not os.listdir(tmp_path / "rep")


@pytest.mark.parametrize("argv", [QUICK_RUN + ["--json", ""], QUICK_RUN + ["--trace", ""],
                                  ["run", "--island", "submod0", "--sequence", ""], QUICK_RUN + ["--report", ""],
                                  ["hunt", "--hazard", "stale-pad", "--max-examples", "1", "--save", ""],
                                  ["report", "r.json", "-o", ""], QUICK_BENCH + ["--batches", "1", "--json", ""],
                                  QUICK_RUN + ["--model", ""]])
def test_an_empty_path_is_refused(tiny_path, capsys, argv):
    if "--model" not in argv and argv[0] != "report":
        argv = argv + ["--model", tiny_path]
    refused(capsys, argv + (["--device", "cpu"] if argv[0] != "report" else []), "an empty path")


@pytest.mark.parametrize("argv", [["env"], ["bench", "--island", "submod0", "--iters", "1", "--warmup", "0", "--batches",
                                            "1", "--no-repairs", "--no-tiny-rates", "--quiet"]])
def test_a_closed_stdout_is_not_an_error(tmp_path, argv):
    r, w = os.pipe()
    os.close(r)  # the reader is gone before the first line (`| head -1` after its line)
    try:
        p = subprocess.run([sys.executable, "-m", "repro", *argv], stdout=w, stderr=subprocess.PIPE, text=True,
                           cwd=tmp_path, env=_env(tmp_path), timeout=300)
    finally:
        os.close(w)
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr


def test_a_hunt_writes_nothing_into_the_working_directory(tiny_path, tmp_path):
    """Without the test suite's settings (a subprocess, as a user runs it): Hypothesis's own files
    (its `constants/` cache, a `.gitignore`) go under $REPRO_CACHE, never into the current folder."""
    work = tmp_path / "work"
    work.mkdir()
    p = subprocess.run([sys.executable, "-m", "repro", "hunt", "--model", tiny_path, "--device", "cpu",
                        "--max-examples", "2", "--save", str(tmp_path / "h.json")], cwd=work, env=_env(tmp_path),
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert os.listdir(work) == [], os.listdir(work)
    assert (tmp_path / "cache" / "hypothesis").is_dir()


def test_sigint_during_a_hunt_says_it_was_interrupted_and_nothing_else(tiny_path, tmp_path):
    p = subprocess.Popen([sys.executable, "-m", "repro", "hunt", "--model", tiny_path, "--device", "cpu",
                          "--max-examples", "5000", "--save", str(tmp_path / "h.json")], cwd=tmp_path,
                         env=_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    first = p.stderr.readline()  # a progress line: the search is under way
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=120)
    assert "sequences run" in first, first + err
    assert p.returncode == 130, err
    assert out == "", out  # nothing from Hypothesis (`@seed(...)`) on stdout
    lines = err.strip().splitlines()
    assert lines[-1] == "repro: interrupted", err
    assert all("sequences run of at most" in x for x in lines[:-1]), err  # no "done, nothing found"
    assert not (tmp_path / "h.json").exists()


@pytest.mark.parametrize("argv, needles", [
    (QUICK_BENCH + ["--batches", "100000"], ["--batches", "512"]),
    (QUICK_BENCH + ["--batches", "1", "--profile", "0"], ["--profile", "0"]),
    (["make-tiny", "{d}/nodir/sub"], ["nodir", "does not exist"]),
    (["make-tiny", "{d}/m", "--shards", "100000"], ["--shards", "1..6"]),
    (["make-tiny", "{d}/m", "--seed", "-1"], ["--seed", "-1"]),
    (["make-tiny", "{d}/m", "--seed", "12345678901234567890123"], ["--seed"]),
    (QUICK_RUN + ["--seed", "-3"], ["--seed"]),
    (QUICK_RUN + ["--seed", "x"], ["--seed", "is not an integer"]),
    (QUICK_RUN + ["--sentinel", "x"], ["--sentinel", "is not an integer"]),
    (["report", "r.json", "-o", "o", "--seed", "12345678901234567890123"], ["--seed"]),
])
def test_values_out_of_range_are_refused_in_one_line(tiny_path, tmp_path, capsys, argv, needles):
    if argv[0] in ("run", "bench"):
        argv = argv + ["--model", tiny_path, "--device", "cpu"]
    refused(capsys, [x.format(d=tmp_path) for x in argv], *needles)
    assert not (tmp_path / "nodir").exists() and not (tmp_path / "m").exists()
    assert "make_tiny:" not in capsys.readouterr().err


def _help(capsys, argv) -> str:
    assert main([*argv, "--help"]) == 0
    return capsys.readouterr().out


def test_help_names_only_options_the_command_has(capsys):
    for cmd in ("run", "hunt"):
        assert "--kernels" not in _help(capsys, [cmd]), cmd
    assert "--kernels" in _help(capsys, ["bench"])
    hunt = _help(capsys, ["hunt"])
    codes = next(x for x in hunt.splitlines() if x.startswith("exit codes"))
    assert "MISSED" not in codes and "found" in codes, codes
    assert "shards" in _help(capsys, ["make-tiny"]) and "1..6" in _help(capsys, ["make-tiny"])


CMDS = ("env", "make-tiny", "inspect", "run", "hunt", "report", "bench")


def test_the_top_level_help_says_what_each_command_is_for(capsys):
    text = _help(capsys, [])
    assert "Namespace" not in text and "repro/cli" not in text
    listed = text.split("commands:", 1)[1]
    for cmd, after in zip(CMDS, CMDS[1:] + ("",)):  # each command, then what it is for, in words
        said = listed.split(f"    {cmd}", 1)[1].split(f"    {after}", 1)[0] if after else listed.split(f"    {cmd}")[1]
        assert len(said.split()) > 6, (cmd, text)
    assert "exit" in text.lower()


def test_the_unknown_island_error_lists_all_and_run_takes_the_chain_as_bench_does(tiny_path, capsys):
    refused(capsys, ["run", "--model", tiny_path, "--device", "cpu", "--island", "nope"], "all", "chain")
    assert main(["run", "--model", tiny_path, "--device", "cpu", "--island", "chain", "--mode", "piecewise",
                 "--baseline", "--steps", "2"]) == 0
    rows = [x.split() for x in capsys.readouterr().out.splitlines()[2:] if x.startswith("chain")]
    assert rows == [["chain", "piecewise", "0", "baseline", "2", "ok"]], rows


def test_notes_fit_the_terminal_and_a_passing_repair_says_it_held(tiny_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["run", "--model", tiny_path, "--device", "cpu", "--island", "chain", "--mode", "piecewise", "--hazard",
                 "frozen-python-state", "--repair", "recapture", "--steps", "12"]) == 0
    out = capsys.readouterr().out
    assert max(len(x) for x in out.splitlines()) <= 80, out
    notes = " ".join(x.strip() for x in out.split("\n\n", 1)[1].splitlines())
    assert "recapture held" in notes, out


def test_inspect_and_bench_tables_fit_80_columns(tiny_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["inspect", tiny_path]) == 0
    out = capsys.readouterr().out
    assert max(len(x) for x in out.splitlines()) <= 80, out
    assert "in_proj_qkv" in out and "shared_expert_gate" in out
    assert main(["bench", "--model", tiny_path, "--device", "cpu", "--island", "chain", "--mode", "piecewise",
                 "--iters", "1", "--warmup", "0", "--batches", "1", "--no-tiny-rates", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert max(len(x) for x in out.splitlines()) <= 80, out
    assert "eager-family=submod0" in out and "replay/floor" in out

