"""A new user's first short run: `repro run --steps N` exits 0 with no MISSED row for N in 1..30 (a
hazard the sequence never reached is marked so; one whose mechanism the runner reported counts as
detected), a shorter run is a prefix of a longer one with the same seed, and the table fits a
100-column terminal with every note printed whole once, no timing column, and probes marked."""
import json
import re

import pytest

from repro.check.compare import GRAPH_HAZARD, Divergence
from repro.cli.app import main
from repro.graphs import TapeProvider
from repro.islands import Model
from repro.job.cases import Case, default_sequence, plan, run_case
from repro.job.results import CaseResult, MultiRankResult, exit_code, format_table, verdict
from repro.knobs import hazards as hz

WIDTH = 100


@pytest.mark.parametrize("seed", [0, 1, 7])
def test_a_shorter_run_is_a_prefix_of_a_longer_one(seed):
    long = [b.to_json() for b in default_sequence(seed, 60).batches()]
    assert len(long) == 60
    for n in (1, 7, 13, 30, 59):
        assert [b.to_json() for b in default_sequence(seed, n).batches()] == long[:n], n


def test_steps_13_replays_the_first_13_steps_of_steps_30(tiny_path, tmp_path):
    docs = []
    for n in (13, 30):
        out = tmp_path / f"r{n}.json"
        assert main(["run", "--model", tiny_path, "--device", "cpu", "--island", "submod0", "--steps", str(n),
                     "--json", str(out)]) == 0
        docs.append(json.loads(out.read_text())["sequence"]["steps"])
    assert docs[0] == docs[1][:13]


@pytest.fixture(scope="module")
def model(tiny_path):
    return Model(tiny_path, "cpu")


def _planted():
    return [c for c in plan("all", None, (), (), streams=False) if c.hazards and c.expect != "clean"]


def test_no_planted_hazard_is_missed_in_any_run_of_1_to_30_steps(model):
    provider = TapeProvider("cpu")
    seen = set()
    for case in _planted():
        for n in range(1, 31):
            # the third copy only where a hazard's row asks for it (one both copies share): the rest is speed
            every = None if hz.HAZARDS[case.hazards[0]].reference_every else 0
            r = run_case(model, provider, case, default_sequence(0, n, vocab=model.cfg.vocab_size), reference_every=every)
            v = verdict(r)
            assert v != "MISSED", (case, n, r.findings)
            seen.add(v)
            if v == "detected":
                break  # a longer run is this run and more steps: still detected
    assert seen == {"not triggered", "detected"}  # both outcomes happen: the test can tell them apart


@pytest.mark.parametrize("steps", [1, 20])
def test_a_short_default_run_exits_0_with_no_missed_row(steps, tmp_path, capsys):
    out = tmp_path / "r.json"
    assert main(["run", "--device", "cpu", "--steps", str(steps), "--json", str(out)]) == 0, capsys.readouterr().err
    text = capsys.readouterr().out
    assert "MISSED" not in text
    rows = json.loads(out.read_text())["results"]
    assert all(r["verdict"] != "MISSED" for r in rows)
    if steps == 1:
        assert any(r["verdict"] == "not triggered" for r in rows) and "not triggered" in text


def test_a_python_state_finding_counts_as_the_detection_of_frozen_python_state():
    finding = {"kind": "python-state", "island": "forward-context",
               "detail": "num_actual_tokens was 4 when size 4 was captured and differs at a later replay: ..."}
    r = CaseResult(Case("chain", "full", ("frozen-python-state",), (), "diverged"), 20, None, [finding],
                   triggered=True)
    assert verdict(r) == "detected" and exit_code([r]) == 0
    repaired = CaseResult(Case("chain", "full", ("frozen-python-state",), ("recapture",), "clean"), 20, None,
                          [finding], triggered=True)
    assert verdict(repaired) == "ok"  # the repair's own row: the finding is a note, not a failure
    missed = CaseResult(Case("chain", "full", ("stale-pad",), (), "diverged"), 20, None, [], triggered=True)
    assert verdict(missed) == "MISSED" and exit_code([missed]) == 1


def _long_rows():
    detail = ("aten.add_.Tensor writes argument 0, which graph 0 returned and its holder still reads later on; "
              "the value a reader sees then is graph 1's, not graph 0's, whatever the order of the replays")
    d = Divergence(8, "gdn_core", "conv_state", None, None, 0, 4.27, kind=GRAPH_HAZARD,
                   note="no live request owns it", departed="replay")
    return detail, [
        CaseResult(Case("chain", "piecewise", ("output-alias",), ("clone-outputs",)), 200, None,
                   [{"kind": "mutates-input", "island": "lint", "detail": detail},
                    {"kind": "alias", "island": "submod1", "detail": "x " * 70}], eager_us=10, replay_us=30),
        CaseResult(Case("chain", "full", ("pad-sentinel-mismatch",), ("eager-family=submod0",), "diverged"), 9, d),
        CaseResult(Case("chain", "full", ("stale-pad",), (), "diverged"), 1, None, [], triggered=False),
    ]


def test_the_table_fits_100_columns_and_prints_every_note_whole_once():
    detail, rows = _long_rows()
    table = format_table(rows)
    assert max(len(line) for line in table.splitlines()) <= WIDTH, table
    flat = " ".join(table.split())
    for text in (detail, ("x " * 70).strip(), "no live request owns it; replay departed"):
        assert flat.count(" ".join(text.split())) == 1, text
    assert re.search(r"^\[1\] ", table, re.M) and re.search(r"^\[3\] ", table, re.M)
    assert "not triggered" in table


def test_the_table_has_no_unlabelled_timing_column():
    _, rows = _long_rows()
    table = format_table(rows)
    assert "replay/eager" not in table and "3.00" not in table


def test_a_probe_row_says_it_is_a_probe():
    from repro.comm.cases import CommCase
    r = MultiRankResult(CommCase(("comm-graph-then-eager",), ()), 4, None)
    run = {"tp": 2, "backend": "gloo", "device": "cpu", "graph_provider": "cpu-tape", "comm_dtype": "fp32",
           "elapsed_s": 1.0}
    line = next(x for x in format_table([r], run=run).splitlines() if "comm-graph-then-eager" in x)
    assert "probe" in line


@pytest.mark.parametrize("seed", [0, 5])
def test_the_largest_steps_allowed_is_reached_by_the_seeded_sequence(seed):
    from repro.cli.parser import MAX_STEPS
    assert len(default_sequence(seed, MAX_STEPS).batches()) == MAX_STEPS


def test_every_line_a_run_prints_fits_100_columns(tiny_path, capsys):
    assert main(["run", "--model", tiny_path, "--device", "cpu", "--mode", "piecewise", "--hazard",
                 "output-alias", "--repair", "clone-outputs", "--steps", "10"]) == 0
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= WIDTH, out
    assert "mutates-input: aten.add_.Tensor writes argument 0" in " ".join(out.split())


@pytest.mark.forced_comm
def test_a_probe_row_says_so_on_the_command_line(tiny_path, capsys):
    assert main(["run", "--model", tiny_path, "--device", "cpu", "--island", "forced_comm", "--tp", "2",
                 "--hazard", "comm-graph-then-eager", "--steps", "4"]) == 0
    out = capsys.readouterr().out
    row = next(x for x in out.splitlines() if x.startswith("forced_comm"))
    assert "ok (probe)" in row and "is a probe for an upstream bug" in out


def test_the_default_plans_longest_names_and_many_notes_still_fit_100_columns():
    # every case a default run plans, streams included (the longest hazard, repair and mode names),
    # each with notes enough to make its note cell long
    cases = plan("all", None, (), (), streams=True)
    rows = [CaseResult(c, 200, None, [{"kind": "python-state", "island": "x", "detail": f"note {i} of case {j}"}
                                      for i in range(12)]) for j, c in enumerate(cases)]
    table = format_table(rows)
    assert max(len(line) for line in table.splitlines()) <= WIDTH, table
    flat = " ".join(table.split())
    assert all(f"note 11 of case {j}" in flat for j in range(len(cases)))
