"""Bad input is one line on stderr and exit 2, never a traceback or a silent "ok": the exit code
says what happened. Every case runs `main()` in-process and fails before any lockstep work."""
import json
import os
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from repro.model import tiny
from repro.cli.app import main
from repro.check.compare import GRAPH_HAZARD, Divergence
from repro.job.results import exit_code
from repro.job.cases import Case, CaseResult
from refusals import refused


_one_line_exit_2 = refused


def _run(tiny_path, *extra):
    return ["run", "--model", tiny_path, "--device", "cpu", "--island", "submod0", *extra]


def _copy(tiny_path, tmp_path, name="m"):
    d = tmp_path / name
    shutil.copytree(tiny_path, d)
    return d


@pytest.mark.parametrize("steps", ["0", "-5", "1000000", "x"])
def test_bad_steps_are_refused(tiny_path, capsys, steps):
    _one_line_exit_2(capsys, _run(tiny_path, "--steps", steps), "--steps")


def test_forced_comm_steps_0_is_refused(capsys):
    _one_line_exit_2(capsys, ["run", "--island", "forced_comm", "--tp", "2", "--steps", "0"], "--steps")


def test_tp_0_is_refused(tiny_path, capsys):
    _one_line_exit_2(capsys, _run(tiny_path, "--tp", "0"), "--tp")


@pytest.mark.parametrize("content, needle", [
    ([1, 2], "got list"),
    ("a string", "got str"),
    ({}, "nothing to replay"),
    ({"requests": [{"rid": 0, "prompt_len": 2}]}, "requests[0]: missing key 'decode_steps'"),
    ({"num_slots": 4, "steps": [{"step": 0, "request_ids": [0], "slots": [99], "query_lens": [1],
                                 "has_initial_state": [False], "token_ids": [3]}]}, "slots[0]: 99"),
    ({"num_slots": 4, "steps": [{"step": 0, "request_ids": [0], "slots": [-2], "query_lens": [1],
                                 "has_initial_state": [False], "token_ids": [3]}]}, "slots[0]: -2"),
    ({"num_slots": 4, "steps": [{"step": 0, "request_ids": [0, 1], "slots": [1, 1], "query_lens": [1, 1],
                                 "has_initial_state": [False, False], "token_ids": [3, 4]}]}, "duplicate slot 1"),
    ({"num_slots": 4, "steps": [{"step": 0, "request_ids": [0], "slots": [1], "query_lens": [1],
                                 "has_initial_state": [False], "token_ids": [512]}]}, "token_ids[0]: 512"),
    ({"num_slots": 4, "steps": [{"step": 0, "request_ids": [0], "slots": [1], "query_lens": [1],
                                 "has_initial_state": [False, True], "token_ids": [3]}]}, "has_initial_state: 2 entries"),
    ({"num_slots": 4, "max_tokens": 8, "steps": [{"step": 0, "request_ids": [0], "slots": [1], "query_lens": [300],
                                                  "has_initial_state": [False], "token_ids": [1] * 300}]},
     "query_lens[0]: 300"),
    ({"requests": [{"rid": 0, "prompt_len": "2", "decode_steps": 1}]}, "prompt_len: expected an integer"),
])
def test_bad_sequence_files_are_refused(tiny_path, tmp_path, capsys, content, needle):
    f = tmp_path / "seq.json"
    f.write_text(json.dumps(content))
    _one_line_exit_2(capsys, _run(tiny_path, "--sequence", str(f)), str(f), needle)


def test_a_slot_outside_the_sentinels_range_is_refused(tiny_path, tmp_path, capsys):
    f = tmp_path / "seq.json"  # slot 0 is the null block with sentinel 0
    f.write_text(json.dumps({"num_slots": 4, "steps": [{"step": 0, "request_ids": [0], "slots": [0], "query_lens": [1],
                                                         "has_initial_state": [False], "token_ids": [3]}]}))
    _one_line_exit_2(capsys, _run(tiny_path, "--sequence", str(f)), "slots: 0 is out of range 1..4")


def _edit_config(d, fn):
    p = d / "config.json"
    cfg = json.loads(p.read_text())
    fn(cfg["text_config"])
    p.write_text(json.dumps(cfg))


@pytest.mark.parametrize("edit, needle", [
    (lambda t: (t.pop("num_hidden_layers"), t.pop("layer_types")), "num_hidden_layers"),
    (lambda t: t.update(num_experts_per_tok=99), "num_experts_per_tok 99"),
    (lambda t: t.update(hidden_size="64"), "hidden_size must be a positive integer"),
])
@pytest.mark.parametrize("cmd", ["run", "inspect"])
def test_bad_configs_are_refused(tiny_path, tmp_path, capsys, edit, needle, cmd):
    d = _copy(tiny_path, tmp_path)
    _edit_config(d, edit)
    argv = _run(str(d), "--steps", "2") if cmd == "run" else ["inspect", str(d)]
    _one_line_exit_2(capsys, argv, "config.json", needle)


def test_an_index_pointing_a_tensor_at_the_wrong_shard_is_refused(tmp_path, capsys):
    d = tiny.make_tiny(tmp_path / "sharded", shards=2)
    idx = json.loads((d / "model.safetensors.index.json").read_text())
    files = sorted(set(idx["weight_map"].values()))
    name = next(n for n, f in idx["weight_map"].items() if f == files[0])
    idx["weight_map"][name] = files[1]
    (d / "model.safetensors.index.json").write_text(json.dumps(idx))
    _one_line_exit_2(capsys, ["inspect", str(d)], name, files[1])


def test_an_unreadable_directory_is_one_line(tiny_path, tmp_path, capsys, monkeypatch):
    d = _copy(tiny_path, tmp_path)
    if os.geteuid() != 0:
        os.chmod(d, 0)
    else:  # root reads anything: make the first read fail as it would for a user
        import pathlib
        real = pathlib.Path.is_file

        def denied(self):
            if self.parent == d:
                raise PermissionError(13, "Permission denied", str(self))
            return real(self)
        monkeypatch.setattr(pathlib.Path, "is_file", denied)
    try:
        _one_line_exit_2(capsys, ["inspect", str(d)], str(d), "ermission denied")
    finally:
        os.chmod(d, 0o755)


def test_non_finite_weights_are_refused(tiny_path, tmp_path, capsys):
    d = _copy(tiny_path, tmp_path)
    f = d / "model.safetensors"
    t = load_file(str(f))
    name = "model.language_model.layers.0.input_layernorm.weight"
    t[name][3] = float("nan")
    save_file(t, str(f), metadata={"format": "pt"})
    _one_line_exit_2(capsys, _run(str(d), "--steps", "2"), name, "NaN")


def test_make_tiny_into_an_unwritable_place(tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    _one_line_exit_2(capsys, ["make-tiny", str(tmp_path / "file" / "ck")], "is not a directory")


def test_a_preset_too_big_for_memory_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(tiny, "_available_memory", lambda: 2 ** 30)
    _one_line_exit_2(capsys, ["make-tiny", str(tmp_path / "big"), "--preset", "qwen3.6-35b-a3b"], "GiB", "--shards")
    assert not (tmp_path / "big").exists()


def test_out_of_memory_during_a_run_is_one_line(tiny_path, capsys, monkeypatch):
    import repro.commands.run as job

    def oom(*a, **k):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
    monkeypatch.setattr(job, "Model", oom)
    _one_line_exit_2(capsys, _run(tiny_path, "--steps", "2"), "out of memory")


def test_a_corrupted_cached_checkpoint_is_rebuilt(tmp_path, capsys):
    p = tiny.default_checkpoint(tmp_path)
    good = (p / "model.safetensors").read_bytes()
    bad = bytearray(good)
    bad[-10] ^= 0xFF  # data bytes: the headers still parse, only the digest sees it
    (p / "model.safetensors").write_bytes(bytes(bad))
    assert tiny.verify(p) is not None
    assert tiny.default_checkpoint(tmp_path) == p
    assert "rebuilding" in capsys.readouterr().err
    assert (p / "model.safetensors").read_bytes() == good and tiny.verify(p) is None


def test_a_killed_generations_temp_dir_is_cleaned_next_time(tmp_path):
    stale = tmp_path / ".ck.tmp-999999999-abcdef12"  # no such pid
    stale.mkdir()
    (stale / "model.safetensors").write_bytes(b"half")
    live = tmp_path / f".ck.tmp-{os.getpid()}-abcdef12"
    live.mkdir()
    tiny.make_tiny(tmp_path / "ck")
    assert not stale.exists() and live.exists()


def _result(expect, diverged=False, findings=()):
    div = Divergence(0, "submod0", "qkv", 0, 0, 1, 1.0, kind=GRAPH_HAZARD) if diverged else None
    return CaseResult(Case("chain", "full", ("stale-pad",) if expect != "clean" else (), (), expect), 5, div,
                      list(findings))


@pytest.mark.parametrize("results, explicit, rc", [
    ([_result("clean"), _result("diverged", True)], False, 0),
    ([_result("clean"), _result("diverged", False)], False, 1),  # MISSED
    ([_result("clean", True)], False, 1),
    ([_result("diverged", True)], True, 1),  # --hazard X detected
    ([_result("finding")], False, 1),  # a finding hazard missed
])
def test_exit_codes(results, explicit, rc):
    assert exit_code(results, explicit) == rc


def test_a_hazard_a_short_run_never_reached_is_not_triggered_and_says_why(tiny_path, capsys):
    rc = main(["run", "--model", tiny_path, "--device", "cpu", "--mode", "full", "--hazard", "stale-pad",
               "--steps", "1"])
    err = capsys.readouterr().err
    assert rc == 0 and "not triggered" in err and "--steps" in err and "MISSED" not in err


def test_a_detection_with_hazard_exits_1_and_says_what(tiny_path, capsys):
    rc = main(["run", "--model", tiny_path, "--device", "cpu", "--mode", "full", "--hazard", "stale-pad",
               "--steps", "60"])  # seed 0 reaches stale-pad's trigger at step 49
    err = capsys.readouterr().err
    assert rc == 1 and "detected" in err and "gdn_core" in err


def _scale_name(tensors: dict) -> str:
    return next(k for k in sorted(tensors) if k.endswith("in_proj_z.weight_scale"))


def test_negative_weight_scales_are_refused(tiny_path, tmp_path, capsys):
    d = _copy(tiny_path, tmp_path)
    f = d / "model.safetensors"
    t = load_file(str(f))
    name = _scale_name(t)
    t[name][0] = -t[name][0]
    save_file(t, str(f), metadata={"format": "pt"})
    _one_line_exit_2(capsys, _run(str(d), "--steps", "2"), name, "negative")


def test_zero_weight_scales_are_flagged_not_refused(tiny_path, tmp_path, capsys):
    from repro.cli.app import main
    d = _copy(tiny_path, tmp_path)
    f = d / "model.safetensors"
    t = load_file(str(f))
    name = _scale_name(t)
    t[name][0] = 0
    save_file(t, str(f), metadata={"format": "pt"})
    rc = main(_run(str(d), "--steps", "2"))
    err = capsys.readouterr().err
    assert rc == 0 and f"{name}: 1 zero scale(s)" in err and "warning" in err
