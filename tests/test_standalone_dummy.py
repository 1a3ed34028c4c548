"""The generated standalone script with an idle data-parallel rank's dummy steps: its persistent batch
and block table are the suite's (`control.input_batch`), its FULL dummy run commits and re-stages as
the rules say (`capture.runner.GraphRunner._dummy_run`), and a dummy hazard the suite detects
reproduces in the script at the suite's first divergence, with its repair and without the hazard
clean."""
import collections
from itertools import product

import numpy as np
import pytest

from repro.control.input_batch import InputBatch
from repro.knobs.options import ControlRules
from repro.report import SCRIPT, standalone_gap
from tests.scripts import module, report, run_script, template_module


@pytest.mark.parametrize("clear, zero_source", list(product((True, False), repeat=2)))
def test_the_templates_block_table_is_the_suites(clear, zero_source):
    """Random steps of requests arriving, finishing, resuming with new blocks and condensing, each
    followed by a commit of some rows: the script's rows, table and committed copy equal the suite's
    after every step, under each form of the two rules that clear a row."""
    t = template_module("template_ib")
    rules = ControlRules(clear_finished_row=clear, move_row_zeroes_source=zero_source)
    opts = {"control.clear_finished_row": clear, "control.move_row_zeroes_source": zero_source}
    width, rows = 3, 6
    ours, theirs = InputBatch(rows, width, 0, rules), t.InputBatch(rows, width, 0, opts)
    rng = np.random.default_rng(int(clear) * 2 + int(zero_source))
    live: dict[int, list[int]] = {}
    next_rid, moved = 0, 0
    for step in range(300):
        for rid in list(live):
            if rng.random() < 0.3:
                del live[rid]
            elif rng.random() < 0.1:  # resumed after a preemption: new blocks
                live[rid] = rng.integers(1, 40, width).tolist()
        while len(live) < rows and rng.random() < 0.5:
            live[next_rid] = rng.integers(1, 40, width).tolist()
            next_rid += 1
        order = [r for r in live if rng.random() < 0.8]  # the rest are not scheduled this step
        scheduled = [(r, live[r]) for r in order]
        before = dict(ours.row_of)
        ours.update(scheduled)
        theirs.update(scheduled)
        moved += any(before.get(r) not in (None, ours.row_of[r]) for r in ours.row_of)
        n = int(rng.integers(0, rows + 1))
        ours.commit(n)
        theirs.commit(n)
        assert theirs.row_of == ours.row_of and theirs.num_rows == ours.num_rows, step
        assert theirs.table == ours.table.tolist() and theirs.committed == ours.committed.tolist()
        rids = [r for r, _ in scheduled]
        assert theirs.rows(rids) == ours.rows(rids).tolist()
    assert moved > 20, moved  # condense moved rows often enough for the zeroing rule to matter


@pytest.mark.parametrize("hazard, k", [("dummy-stale-rows", 0), ("dummy-reuses-staging", 0),
                                       ("dummy-reuses-staging", 2)])
def test_a_dummy_hazard_reproduces_in_the_script_and_its_repair_clears_it(hazard, k, tiny_path, tmp_path):
    """The suite's run detects the hazard at a dummy step; the script written from it diverges at the
    same step, tensor and block, and is clean with the repair and without the hazard."""
    doc, rep = report(tmp_path, ["--model", tiny_path, "--hazard", hazard, "--mode", "full_and_piecewise",
                                 "--island", "gdn_core", "--steps", "60", "--spec-tokens", str(k)])
    r = doc["results"][0]
    fd = r["first_divergence"]
    assert r["diverged"] and r["data_parallel"] and standalone_gap(r) is None
    p, got = run_script(rep)
    assert p.returncode == 1, p.stdout + p.stderr
    assert (got["step"], got["island"], got["tensor"], got["slot"]) == (fd["step"], fd["island"], fd["tensor"],
                                                                       fd["slot"])
    assert "dummy step" in p.stdout
    for extra in (("--repair",), ("--no-hazard",)):
        p, got = run_script(rep, *extra)
        assert p.returncode == 0 and got == {"diverged": False, "steps": fd["step"] + 1}, (extra, p.stdout + p.stderr)


def test_a_data_parallel_baseline_replays_full_dummy_runs_clean(tiny_path, tmp_path):
    """A fixed-stack data-parallel sequence at K = 2: the script's dummy steps replay the FULL decode
    graph (committed and re-staged), and replay equals eager at every step, dummy steps included."""
    _, rep = report(tmp_path, ["--model", tiny_path, "--hazard", "dummy-reuses-staging", "--repair", "restage-dummy",
                               "--mode", "full_and_piecewise", "--island", "gdn_core", "--steps", "60",
                               "--spec-tokens", "2"])
    script = module(rep / SCRIPT, "script_dp")
    seen = collections.Counter()
    dummy0 = script.GraphRunner._dummy_run

    def counted(self, st):
        dummy0(self, st)
        seen[self.last[0]] += 1
    script.GraphRunner._dummy_run = counted
    assert script.main(["--device", "cpu"]) == 0
    assert seen["full"] >= 2, seen
