"""What a person reads in the table: no `row None`, no timing column, and every note under the
table, numbered, whole, referred to by its rows (the width and the numbering: see
test_short_runs.py); a hunt's progress against its bound."""
import io as _io

from repro.check.compare import GRAPH_HAZARD, Divergence
from repro.job.results import Case, CaseResult, format_table


def _row(table: str, i: int = 0) -> str:
    return table.splitlines()[2 + i]


def test_a_state_slot_divergence_has_no_row_column_and_no_ratio():
    d = Divergence(7, "gdn_core", "conv_state", None, 3, 6, 4.67, kind=GRAPH_HAZARD)
    r = CaseResult(Case("chain", "full", ("stale-pad",), (), "diverged"), 20, d, eager_us=10.0, replay_us=250.0)
    table = format_table([r])
    assert "row None" not in table and "[1] graph hazard: step 7 gdn_core.conv_state slot 6 |d|=4.67" in table
    assert _row(table).split()[-2:] == ["detected", "1"] and "25.00" not in table


def test_findings_on_a_clean_row_are_notes_printed_whole():
    detail = "aten.add_.Tensor writes argument 0, which graph 0 returned and its holder still reads later on"
    findings = [{"kind": "mutates-input", "island": "lint", "detail": detail}, {"kind": "alias", "island": "submod1",
                                                                               "detail": "x"}]
    table = format_table([CaseResult(Case("chain", "piecewise"), 60, None, findings)])
    assert _row(table).split()[-2:] == ["ok", "1,2"]
    assert " ".join(f"mutates-input: {detail}".split()) in " ".join(table.split()) and "[2] alias: x" in table


def test_a_repair_that_held_says_so_beside_what_it_answers():
    """A hazard's row with its repair that ends ok: its note says the repair held (the findings that
    capture still shows, whole, inside it), not the findings alone, which read as a failure."""
    detail = "num_actual_tokens was 7 when 8 tokens was captured and differs at a later replay"
    r = CaseResult(Case("chain", "piecewise", ("frozen-python-state",), ("recapture",)), 12, None,
                   [{"kind": "python-state", "island": "submod1", "detail": detail}])
    table = format_table([r])
    assert _row(table).split()[-2:] == ["ok", "1"]
    flat = " ".join(table.split())
    assert "[1] recapture held: replay equals eager in all 12 steps" in flat and f"python-state: {detail}" in flat


def test_a_hunt_says_how_far_it_is_against_its_bound_without_a_terminal():
    from repro.commands.hunt import HUNT_LINE_EVERY, HuntProgress
    from repro.search.hunt import Budget
    s = _io.StringIO()
    progress = HuntProgress("hunt chain full stale-pad", stream=s, tty=False)
    b = Budget(lambda seq: None, 25, progress)
    for i in range(1, 2 * HUNT_LINE_EVERY + 4):
        b.spent = i  # as the budget counts each sequence it runs, then shows it
        progress(b)
    lines = s.getvalue().strip().splitlines()
    assert len(lines) == 2 and lines[-1] == "repro: hunt chain full stale-pad: 20 sequences run of at most 25 (searching)"
    b.found_at = b.spent = 24  # the 24th fails: the shrinking has one sequence left
    progress(b)
    progress.end(b)
    lines = s.getvalue().strip().splitlines()
    assert "found at sequence 24; shrinking with at most 1 more" in lines[-2]
    assert lines[-1].endswith("shrinking: done (no smaller sequence fails), 24 sequences run of at most 25")


def test_a_forced_comm_heartbeat_says_where_each_rank_is(tmp_path):
    import json

    from repro.comm.supervisor import _heartbeat
    (tmp_path / "progress.0.json").write_text(json.dumps({"rank": 0, "case": 2, "index": 7, "phase": "replay"}))
    line = _heartbeat(str(tmp_path), 2, 0.0)
    assert "rank 0: case 2 step 7 replay" in line and "rank 1: case - step - starting" in line
