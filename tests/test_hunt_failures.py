"""A hunt that meets several distinct failures (Hypothesis raises them together, as an exception
group) shrinks and reports each: a crash of the check is one of them, never a traceback; every
hunt says how long it took to its first failure and to its minimal sequence."""
import json
import re

from repro.cli.app import main
from repro.commands import hunt as HC
from repro.job.results import CaseResult
from repro.search import hunt as H


class _Div:
    step = 0

    def line(self):
        return "step 0: a divergence"


def _two_bugs(seq):
    """An IndexError where a prompt has 4 tokens or more; a divergence where one has 3. Shrinking the
    crash's prompt meets the divergence."""
    if any(r.prompt_len >= 4 for r in seq.requests):
        raise IndexError("list index out of range")
    if any(r.prompt_len == 3 for r in seq.requests):
        return _Div()
    return None


def test_each_distinct_failure_is_shrunk_and_returned(tmp_path):
    """Shrinking the crash meets the divergence (a prompt one token shorter): Hypothesis shrinks both
    and raises them together, and the hunt returns each with its own minimal sequence."""
    found = H.hunt(_two_bugs, max_examples=200, profile="ci", cache=tmp_path)
    kinds = {type(f.found).__name__: f for f in found}
    assert set(kinds) == {"Crash", "_Div"}, found
    crash, div = kinds["Crash"], kinds["_Div"]
    assert [r.prompt_len for r in crash.seq.requests] == [4]
    assert "IndexError" in crash.found.line() and "_two_bugs" in crash.found.line()
    assert [r.prompt_len for r in div.seq.requests] == [3]


def test_a_lone_crash_is_a_failure_too(tmp_path):
    def crash(seq):
        raise KeyError("slot")
    found = H.hunt(crash, max_examples=20, cache=tmp_path)
    assert len(found) == 1 and found[0].found.line().startswith("crash: KeyError")


def test_the_command_reports_both_and_saves_the_divergence_first(tiny_path, tmp_path, monkeypatch, capsys):
    """Through `repro hunt`, with `_two_bugs` planted as what fails on each sequence (the lockstep
    is left out: what is tested is the search and its report): exit 1, both failures printed, no
    traceback, the divergence saved and replayable, the crash kept under `other_failures` with its
    own minimal sequence, and the two times printed."""
    last = []

    def run_case(model, provider, case, seq, **kw):
        last[:] = [seq]
        return CaseResult(case, len(seq.batches()), None)
    monkeypatch.setattr(HC, "run_case", run_case)
    monkeypatch.setattr(HC, "failure", lambda r: _two_bugs(last[0]))
    save = tmp_path / "m.json"
    rc = main(["hunt", "--model", tiny_path, "--device", "cpu", "--hazard", "shape-only-uniform-decode",
               "--profile", "ci", "--max-examples", "200", "--save", str(save)])
    out = capsys.readouterr()
    assert rc == 1, out.err
    assert "failure 1 of 2" in out.out and "failure 2 of 2" in out.out, out.out
    assert "first divergence: step 0: a divergence" in out.out
    assert "first failure: crash: IndexError: list index out of range" in out.out
    assert "Traceback" not in out.err and "ExceptionGroup" not in out.err
    assert any(x.startswith("time: first failure at ") and "minimal sequence at" in x for x in out.out.splitlines())
    doc = json.loads(save.read_text())
    assert [r["prompt_len"] for r in doc["minimal_sequence"]["requests"]] == [3] and "crash" not in doc
    (other,) = doc["other_failures"]
    assert other["crash"].startswith("crash: IndexError") and other["results"] == []
    assert [r["prompt_len"] for r in other["minimal_sequence"]["requests"]] == [4]  # its own sequence


def test_a_hunt_that_finds_nothing_says_how_long_it_searched(tiny_path, tmp_path, capsys):
    rc = main(["hunt", "--model", tiny_path, "--device", "cpu", "--island", "moe", "--profile", "ci",
               "--max-examples", "2", "--save", str(tmp_path / "s.json")])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert rc == 0 and last.startswith("nothing found") and re.search(r"in 2 sequences, [0-9.]+ s$", last), last
