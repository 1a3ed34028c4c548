"""One rule for every output path (`--json`, `--trace`, `--report`, `hunt --save`, `bench --json`,
`bench --plot`), tried as a new user would: a missing folder, `/proc`, a dangling symlink, an
island that writes no trace, and SIGINT during a run. Each is refused before the work (exit 2,
one line, nothing created) or leaves the user's file as it was."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from repro.cli.app import main
from refusals import refused

ROOT = Path(__file__).resolve().parent.parent

# (argv before the path, option): every output file option, on a command that would do real work
OUTPUTS = [
    (["run", "--island", "submod0", "--steps", "2"], "--json"),
    (["run", "--island", "submod0", "--steps", "2"], "--trace"),
    (["hunt", "--hazard", "stale-pad", "--max-examples", "2"], "--save"),
    (["hunt", "--hazard", "stale-pad", "--max-examples", "2"], "--json"),
    (["bench", "--island", "submod0", "--batches", "1", "--iters", "1", "--no-tiny-rates"], "--json"),
    (["bench", "--island", "submod0", "--batches", "1", "--iters", "1", "--no-tiny-rates"], "--plot"),
]


_refused = refused


def _with_model(argv, tiny_path):
    return argv + ["--model", tiny_path, "--device", "cpu"]


@pytest.mark.parametrize("argv, option", OUTPUTS)
def test_a_missing_folder_is_refused_not_created(tiny_path, tmp_path, capsys, argv, option):
    target = tmp_path / "missing" / "dir" / "out.json"
    _refused(capsys, _with_model(argv, tiny_path) + [option, str(target)], option, "does not exist")
    assert not (tmp_path / "missing").exists()


def test_a_missing_folder_above_a_report_dir_is_refused_not_created(tiny_path, tmp_path, capsys):
    _refused(capsys, _with_model(["run", "--island", "submod0", "--steps", "2"], tiny_path)
             + ["--report", str(tmp_path / "missing" / "report")], "--report", "does not exist")
    assert not (tmp_path / "missing").exists()


@pytest.mark.parametrize("argv, option", OUTPUTS)
def test_proc_is_refused_before_the_work(tiny_path, capsys, argv, option):
    # /proc/self/status is a regular file that even root may open for writing: only creating a
    # file beside it (what the final rename needs) tells that it cannot be written
    t0 = time.monotonic()
    _refused(capsys, _with_model(argv, tiny_path) + [option, "/proc/self/status"], option, "/proc")
    assert time.monotonic() - t0 < 20  # before the work, not after a hunt or a bench
    _refused(capsys, _with_model(argv, tiny_path) + [option, "/proc/foo"], option)


@pytest.mark.parametrize("argv, option", OUTPUTS)
def test_a_dangling_symlink_is_refused_and_its_target_not_created(tiny_path, tmp_path, capsys, argv, option):
    link = tmp_path / "link.json"
    link.symlink_to(tmp_path / "nonexistent" / "x.json")
    _refused(capsys, _with_model(argv, tiny_path) + [option, str(link)], option, "dangling symlink")
    assert not (tmp_path / "nonexistent").exists() and link.is_symlink()


def test_a_symlink_to_an_existing_file_is_written_through(tiny_path, tmp_path):
    real = tmp_path / "real.json"
    real.write_text("old")
    os.chmod(real, 0o640)
    link = tmp_path / "link.json"
    link.symlink_to(real)
    assert main(_with_model(["run", "--island", "submod0", "--steps", "2"], tiny_path) + ["--json", str(link)]) == 0
    assert link.is_symlink() and '"results"' in real.read_text()
    assert oct(real.stat().st_mode & 0o777) == oct(0o640)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.json", "real.json"]  # no temporary file left


@pytest.mark.parametrize("island", ["moe", "forced_comm"])
def test_an_island_that_writes_no_trace_refuses_trace_and_keeps_the_file(tiny_path, tmp_path, capsys, island):
    precious = tmp_path / "precious.txt"
    precious.write_text("mine\n")
    extra = ["--tp", "2"] if island == "forced_comm" else []
    _refused(capsys, _with_model(["run", "--island", island, "--steps", "2", *extra], tiny_path)
             + ["--trace", str(precious)], "--trace", island)
    assert precious.read_text() == "mine\n"


def _as_a_terminal():
    """The child gets Ctrl-C as a shell gives it: SIGINT neither ignored nor blocked. Both are
    inherited across exec, and a pytest-xdist worker that ran other tests first may hold either
    (the child then ran on past SIGINT: its stacks showed it still in the lockstep)."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_sigint_during_a_traced_run_leaves_the_old_trace_whole(tiny_path, tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text("the old trace\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONFAULTHANDLER": "1"}  # a hang dumps its stacks on SIGABRT
    p = subprocess.Popen([sys.executable, "-m", "repro", "run", "--model", tiny_path, "--device", "cpu", "--island",
                          "submod0", "--steps", "5000", "--trace", str(trace)], cwd=tmp_path, env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, preexec_fn=_as_a_terminal)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # until the new trace is being written beside the old one
            temps = [q for q in tmp_path.iterdir() if q.name != "t.jsonl"]
            if temps and temps[0].stat().st_size > 0:
                break
            assert p.poll() is None, p.stderr.read()
            time.sleep(0.2)
        else:
            pytest.fail("the run never started its trace")
        p.send_signal(signal.SIGINT)
        try:
            _, err = p.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            p.send_signal(signal.SIGABRT)  # where it hung, from faulthandler
            pytest.fail("no exit within 60 s of SIGINT; its stacks:\n" + p.communicate(timeout=30)[1][-6000:])
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 130 and "Traceback" not in err, err
    assert trace.read_text() == "the old trace\n"
    assert [q.name for q in tmp_path.iterdir()] == ["t.jsonl"]  # the half-written one is gone


def test_a_completed_trace_replaces_the_old_one(tiny_path, tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text("the old trace\n")
    assert main(_with_model(["run", "--island", "submod0", "--steps", "3"], tiny_path) + ["--trace", str(trace)]) == 0
    lines = trace.read_text().splitlines()
    assert len(lines) == 3 and all(line.startswith('{"step"') for line in lines)
