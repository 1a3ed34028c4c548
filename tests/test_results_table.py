"""What a person reads in the table: no `row None`, findings cut at a word and marked as notes on
clean rows, and no replay/eager ratio for rows too short to time."""
from repro.check.compare import GRAPH_HAZARD, Divergence
from repro.job.results import FINDING_WIDTH, MIN_TIMED_STEPS, Case, CaseResult, format_table


def _row(table: str, i: int = 0) -> str:
    return table.splitlines()[2 + i]


def test_a_state_slot_divergence_has_no_row_column_and_short_rows_show_no_ratio():
    d = Divergence(7, "gdn_core", "conv_state", None, 3, 6, 4.67, kind=GRAPH_HAZARD)
    r = CaseResult(Case("chain", "full", ("stale-pad",), (), "diverged"), 1, d, eager_us=10.0, replay_us=250.0)
    row = _row(format_table([r]))
    assert "row None" not in row and "step 7 gdn_core.conv_state slot 6 |d|=4.67" in row
    assert row.rstrip().endswith("-") and "25.00" not in row  # 1 step: capture time, not replay speed
    r.steps = MIN_TIMED_STEPS
    assert _row(format_table([r])).rstrip().endswith("25.00")


def test_a_finding_on_a_clean_row_is_a_note_cut_at_a_word():
    detail = "aten.add_.Tensor writes argument 0, which graph 0 returned and its holder still reads later on"
    r = CaseResult(Case("chain", "piecewise", ("output-alias",), ("clone-outputs",)), 60, None,
                   [{"kind": "mutates-input", "island": "lint", "detail": detail},
                    {"kind": "alias", "island": "submod1", "detail": "x"}])
    row = _row(format_table([r]))
    assert " ok " in row and "note: mutates-input: aten.add_.Tensor" in row and "(+1 more)" in row
    cell = row[row.index("note: "):row.index(" (+1 more)")]
    assert cell.endswith(" ...") and len(cell) <= len("note: ") + FINDING_WIDTH + 4
    assert cell[:-4].split()[-1] in detail.split()  # cut between words, never inside one


def test_a_hunt_says_how_far_it_is_without_a_terminal(capsys):
    from repro.search.hunt import HUNT_LINE_EVERY, progress_of_hunt
    tried = progress_of_hunt("hunt chain full stale-pad", 25)
    for _ in range(2 * HUNT_LINE_EVERY + 3):
        tried()
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 2 and lines[-1].startswith("repro: hunt chain full stale-pad: 20 sequences tried")


def test_a_forced_comm_heartbeat_says_where_each_rank_is(tmp_path):
    import json

    from repro.comm.supervisor import _heartbeat
    (tmp_path / "progress.0.json").write_text(json.dumps({"rank": 0, "case": 2, "index": 7, "phase": "replay"}))
    line = _heartbeat(str(tmp_path), 2, 0.0)
    assert "rank 0: case 2 step 7 replay" in line and "rank 1: case - step - starting" in line
