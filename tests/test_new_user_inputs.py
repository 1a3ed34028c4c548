"""Bad input tried as a new user would: one line on stderr and exit 2, never a traceback, never
silently ignored (an unknown hazard on hunt, a closed pipe, a sequence nested 100,000 deep, a
report for a layer that is not there, sequences that contradict themselves, options that do
nothing in their context, make-tiny's messages and modes, a plugin that exits)."""
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from repro.cli.app import main
from refusals import refused

ROOT = Path(__file__).resolve().parent.parent


_refused = refused


def _repro(argv, cwd, env=None, **kw):
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run([sys.executable, "-m", "repro", *argv], cwd=cwd, env=env, capture_output=True, text=True,
                          **kw)


@pytest.mark.parametrize("island", [[], ["--island", "moe"], ["--island", "submod0"]])
def test_hunt_an_unknown_hazard_is_one_line(tiny_path, capsys, island):
    _refused(capsys, ["hunt", "--model", tiny_path, "--device", "cpu", "--hazard", "nope", *island],
             "unknown hazard 'nope'")


def test_inspect_into_a_closed_pipe_is_no_traceback_and_keeps_its_exit_code(tiny_path, tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    for f in Path(tiny_path).iterdir():
        (bad / f.name).write_bytes(f.read_bytes())
    t = load_file(str(bad / "model.safetensors"))
    name = next(k for k in sorted(t) if k.endswith("in_proj_z.weight_scale"))
    t[name][0] = -1.0
    save_file(t, str(bad / "model.safetensors"), metadata={"format": "pt"})
    r, w = os.pipe()
    os.close(r)  # the reader is gone before the first line (`| head -1` after its line)
    try:
        p = subprocess.run([sys.executable, "-m", "repro", "inspect", str(bad)], stdout=w, stderr=subprocess.PIPE,
                           text=True, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)})
    finally:
        os.close(w)
    assert "Traceback" not in p.stderr and "BrokenPipe" not in p.stderr, p.stderr
    assert p.returncode == 2 and name in p.stderr


def _nested(path: Path, depth: int = 100_000) -> Path:
    path.write_text("[" * depth + "]" * depth)
    return path


def test_a_sequence_nested_100000_deep_is_one_line(tiny_path, tmp_path, capsys):
    f = _nested(tmp_path / "seq.json")
    _refused(capsys, ["run", "--model", tiny_path, "--device", "cpu", "--island", "submod0", "--sequence", str(f)],
             str(f), "nested")


def test_a_result_nested_100000_deep_is_one_line(tmp_path, capsys):
    f = _nested(tmp_path / "r.json")
    _refused(capsys, ["report", str(f), "-o", str(tmp_path / "out")], str(f), "nested")
    assert not (tmp_path / "out").exists()


@pytest.fixture(scope="module")
def result(tiny_path, tmp_path_factory):
    out = tmp_path_factory.mktemp("result") / "r.json"
    assert main(["run", "--model", tiny_path, "--device", "cpu", "--mode", "piecewise", "--hazard",
                 "shared-pool-weakref", "--steps", "4", "--json", str(out)]) == 1
    return out


def test_report_for_a_layer_the_checkpoint_does_not_have_is_refused(result, tmp_path, capsys):
    _refused(capsys, ["report", str(result), "-o", str(tmp_path / "d"), "--layer", "99", "--no-verify"],
             "--layer 99")
    assert not (tmp_path / "d").exists()


def test_report_on_a_forced_comm_result_says_so(tmp_path, capsys):
    doc = {"command": "repro run --island forced_comm --tp 2", "tp": 2, "results": [
        {"island": "forced_comm", "comm_mode": "graph", "hazards": [], "repairs": [], "steps": 4, "diverged": False,
         "first_divergence": None, "ranks_diverged": [], "expect": "clean", "verdict": "ok"}]}
    f = tmp_path / "comm.json"
    f.write_text(json.dumps(doc))
    err = _refused(capsys, ["report", str(f), "-o", str(tmp_path / "d")], "forced_comm")
    assert "lacks mode" not in err


def _step(i, rids, slots, qlens=None, init=None):
    qlens = qlens or [1] * len(rids)
    return {"step": i, "request_ids": rids, "slots": slots, "query_lens": qlens,
            "has_initial_state": init or [False] * len(rids), "token_ids": [3] * sum(qlens)}


@pytest.mark.parametrize("seq, needle", [
    ({"num_slots": 4, "steps": [_step(0, [0, 0], [1, 2])]}, "duplicate request id 0"),
    ({"num_slots": 4, "requests": [{"rid": 0, "prompt_len": 1, "decode_steps": 1}], "steps": [_step(0, [5], [1])]},
     "request id 5 is not in requests"),
    ({"num_slots": 4, "steps": [_step(0, [0], [1]), _step(7, [0], [1], init=[True])]}, "steps[1].step: 7"),
    ({"num_slots": 4, "steps": [_step(1, [0], [1])]}, "steps[0].step: 1"),
])
def test_sequences_that_contradict_themselves_are_refused(tiny_path, tmp_path, capsys, seq, needle):
    f = tmp_path / "seq.json"
    f.write_text(json.dumps(seq))
    _refused(capsys, ["run", "--model", tiny_path, "--device", "cpu", "--island", "submod0", "--sequence", str(f)],
             needle)


@pytest.mark.parametrize("slot", [0, 17])
def test_slot_range_messages_agree(tiny_path, tmp_path, capsys, slot):
    f = tmp_path / "seq.json"
    f.write_text(json.dumps({"num_slots": 16, "steps": [_step(0, [0], [slot])]}))
    # slot 17 is refused when the file is read, slot 0 when the run knows its pad sentinel: one wording
    _refused(capsys, ["run", "--model", tiny_path, "--device", "cpu", "--island", "submod0", "--sequence", str(f)],
             f"{slot} is out of range 1..16 (", "pad sentinel 0")


@pytest.fixture
def seq_file(tmp_path):
    f = tmp_path / "seq.json"
    f.write_text(json.dumps({"num_slots": 4, "requests": [{"rid": 0, "prompt_len": 2, "decode_steps": 2}]}))
    return str(f)


@pytest.mark.parametrize("extra, needle", [
    (["--island", "forced_comm", "--tp", "2", "--trace", "t.jsonl"], "--trace"),
    (["--island", "forced_comm", "--tp", "2", "--mode", "full"], "--mode"),
    (["--island", "submod0", "--force"], "--force"),
    (["--island", "submod0", "--sequence", "SEQ", "--steps", "5"], "--steps"),
    (["--island", "submod0", "--sequence", "SEQ", "--seed", "7"], "--seed"),
    (["--mode", "full", "--hazard", "stale-pad", "--hazard", "stale-pad"], "stale-pad"),
    (["--mode", "full", "--hazard", "stale-pad", "--repair", "sanitize-pad", "--repair", "sanitize-pad"],
     "sanitize-pad"),
])
def test_options_that_would_be_ignored_are_refused(tiny_path, tmp_path, capsys, seq_file, extra, needle):
    extra = [seq_file if x == "SEQ" else str(tmp_path / x) if x == "t.jsonl" else x for x in extra]
    _refused(capsys, ["run", "--model", tiny_path, "--device", "cpu", *extra], needle)
    assert not (tmp_path / "t.jsonl").exists()


def test_hunt_refuses_force_without_report_and_has_no_seed(tiny_path, capsys):
    _refused(capsys, ["hunt", "--model", tiny_path, "--device", "cpu", "--hazard", "stale-pad", "--force"], "--force")
    _refused(capsys, ["hunt", "--model", tiny_path, "--device", "cpu", "--hazard", "stale-pad", "--seed", "7"],
             "--seed")


def test_a_kernel_chosen_twice_in_repro_kernels_is_refused(tmp_path):
    p = _repro(["run", "--island", "submod0", "--steps", "1", "--device", "cpu"], tmp_path,
               {"REPRO_KERNELS": "moe=torch,moe=reference"})
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert "moe" in p.stderr and "twice" in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr


def test_make_tiny_into_a_non_empty_folder_names_no_python_keyword(tmp_path, capsys):
    d = tmp_path / "d"
    d.mkdir()
    (d / "mine.txt").write_text("x")
    err = _refused(capsys, ["make-tiny", str(d)], str(d), "not empty")
    assert "overwrite=True" not in err and "=" not in err.split(str(d))[-1]
    assert (d / "mine.txt").read_text() == "x"


def test_make_tiny_onto_a_plain_file_says_it_is_a_file(tmp_path, capsys):
    f = tmp_path / "f"
    f.write_text("x")
    err = _refused(capsys, ["make-tiny", str(f)], str(f), "is a file")
    assert "not empty" not in err and f.read_text() == "x"


def test_make_tiny_files_get_the_umask_mode(tmp_path):
    p = subprocess.run(["sh", "-c", f"umask 022 && {sys.executable} -m repro make-tiny {tmp_path / 'ck'}"],
                       env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    modes = {f.name: stat.S_IMODE(f.stat().st_mode) for f in (tmp_path / "ck").iterdir()}
    assert modes and all(m == 0o644 for m in modes.values()), modes


@pytest.mark.parametrize("how", ["--plugin", "REPRO_PLUGINS"])
def test_a_plugin_that_exits_is_one_line_and_exit_2(tmp_path, how):
    (tmp_path / "exiter.py").write_text("import sys\nsys.exit(3)\n")
    env = {"PYTHONPATH": f"{ROOT}{os.pathsep}{tmp_path}"}
    argv = ["run", "--island", "submod0", "--steps", "1", "--device", "cpu"]
    if how == "--plugin":
        argv += ["--plugin", "exiter"]
    else:
        env["REPRO_PLUGINS"] = "exiter"
    p = _repro(argv, tmp_path, env)
    assert p.returncode == 2 and "Traceback" not in p.stderr, (p.returncode, p.stderr)
    assert "exiter" in p.stderr and "sys.exit(3)" in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
