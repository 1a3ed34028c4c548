"""`repro hunt`: options refused rather than ignored, profile counts honoured,
the database under the cache, flaky failures in one line, findings hunted, the largest captured
decode batch reachable, minimal sequences cut after the divergence, replay lines that replay."""
import json
import re

import pytest

from repro.commands import hunt as HC
from repro.search import hunt as H
from repro.cli.app import main
from repro.knobs.hazards import HAZARDS
from repro.scheduler.sequence import Request, Sequence


@pytest.mark.parametrize("extra, needle", [
    (["--max-examples", "0"], "--max-examples"),
    (["--profile", "turbo"], "turbo"),
    (["--island", "bogus"], "bogus"),
    (["--island", "forced_comm"], "forced_comm"),
    (["--tp", "2"], "--tp"),
])
def test_bad_hunt_options_are_refused(tiny_path, capsys, extra, needle):
    rc = main(["hunt", "--model", tiny_path, "--device", "cpu", "--hazard", "stale-pad", *extra])
    err = capsys.readouterr().err
    assert rc == 2 and needle in err and len(err.strip().splitlines()) == 1, err


def test_an_unwritable_save_is_refused_before_the_search(tiny_path, tmp_path, capsys):
    (tmp_path / "f").write_text("x")
    rc = main(["hunt", "--model", tiny_path, "--device", "cpu", "--hazard", "stale-pad",
               "--save", str(tmp_path / "f" / "out.json")])
    assert rc == 2 and "--save" in capsys.readouterr().err


def test_profile_counts_are_not_overridden_by_a_default():
    assert H.example_count(None, "soak") == 5000
    assert H.example_count(None, "ci") == 25
    assert H.example_count(None, None) == H.DEFAULT_MAX_EXAMPLES
    assert H.example_count(7, "soak") == 7


class _Div:
    step = 0

    def line(self):
        return "fake"


def test_the_database_is_under_the_cache_not_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    found = H.hunt(lambda s: _Div(), max_examples=3, cache=tmp_path / "cache")
    assert found and found[0].seq is not None
    assert (tmp_path / "cache" / "hypothesis").is_dir()
    assert not (tmp_path / ".hypothesis").exists()


def test_a_flaky_failure_is_one_exception_not_a_traceback(tmp_path):
    calls = []

    def once(s):
        calls.append(s)
        return _Div() if len(calls) == 1 else None
    with pytest.raises(H.FlakyHunt, match="did not reproduce"):
        H.hunt(once, max_examples=5, cache=tmp_path)


def test_the_search_space_reaches_the_largest_captured_size():
    from repro.control.dispatch import DEFAULT_SIZES
    from repro.search.strategies import space_for
    space = space_for(DEFAULT_SIZES)
    top = max(DEFAULT_SIZES)
    assert space["num_slots"] >= top and space["max_requests"] >= top and space["max_tokens"] >= top
    seq = Sequence([Request(i, 1, 3) for i in range(top)], num_slots=space["num_slots"],
                   max_tokens=space["max_tokens"])
    assert max(b.num_decodes for b in seq.batches()) == top  # such a sequence is inside the space


def test_minimal_sequences_are_cut_after_the_divergence():
    m = {"steps": [{"step": i} for i in range(6)]}
    assert [s["step"] for s in HC.cut_after(m, 2)["steps"]] == [0, 1, 2]
    assert HC.cut_after(m, None) is m


def test_replay_line_keeps_every_option_and_the_file_name_has_the_island():
    o = HC.HuntConfig(model="/m", device="cpu", island="moe", layer=2, sentinel=-1,
                      hazards=("frozen-python-state",))
    save = HC.save_path(o, "piecewise")
    assert save.name.startswith("moe-frozen-python-state-piecewise")
    line = HC.replay_line(o, "piecewise", save)
    for part in ("--model /m", "--device cpu", "--layer 2", "--sentinel -1", "--island moe",
                 "--hazard frozen-python-state", f"--sequence {save}"):
        assert part in line


def test_findings_are_hunted(tiny_path, tmp_path, capsys):
    save = tmp_path / "f.json"
    rc = main(["hunt", "--model", tiny_path, "--device", "cpu", "--hazard", "undeclared-mutation",
               "--max-examples", "3", "--profile", "ci", "--save", str(save)])
    assert rc == 1
    d = json.loads(save.read_text())
    assert any(f["kind"] == "undeclared-mutation" for f in d["results"][0]["findings"])
    assert "finding" in capsys.readouterr().out


@pytest.mark.skipif(not hasattr(next(iter(HAZARDS.values())), "sets"),
                    reason="needs the typed hazard table (Hazard.sets['kernel_sentinel']) from main")
def test_pad_sentinel_mismatch_replays(tiny_path, tmp_path, capsys):
    save = tmp_path / "p.json"
    assert main(["hunt", "--model", tiny_path, "--device", "cpu", "--hazard", "pad-sentinel-mismatch",
                 "--max-examples", "40", "--profile", "ci", "--save", str(save)]) == 1
    d = json.loads(save.read_text())
    assert d["results"][0]["diverged"] is True
    line = capsys.readouterr().out.split("replay: ")[1].strip().split()
    assert main(line[1:]) == 1


def test_max_examples_bounds_the_whole_search_shrinking_included(tiny_path, tmp_path, capsys):
    rc = main(["hunt", "--model", tiny_path, "--device", "cpu", "--hazard", "shared-pool-weakref",
               "--max-examples", "3", "--save", str(tmp_path / "s.json")])
    err = capsys.readouterr().err
    assert rc == 1, err
    counts = [int(n) for n in re.findall(r"(\d+) sequences? run", err)]
    assert counts and max(counts) <= 3, err
    assert re.search(r"shrinking: done", err), err  # the shrink phase shows its end


def test_help_says_what_max_examples_bounds(capsys):
    assert main(["hunt", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "shrinking included" in text
