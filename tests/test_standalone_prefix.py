"""The generated standalone script with prefix caching's block size: its forward copies, running
columns and growing block-table rows are the suite's (`control.prefix`, `control.input_batch`), a
K = 2 block-4 baseline replays equal to eager through prefix hits and forward copies, and a hazard
the suite detects with a block size reproduces in the script at the suite's first divergence."""
import collections

import numpy as np
import pytest

from repro.control.input_batch import InputBatch
from repro.control.prefix import forward_copies, state_block_columns
from repro.job.cases import default_sequence
from repro.report import SCRIPT, standalone_gap
from tests.scripts import module, report, run_script, template_module

BS = 4


@pytest.mark.parametrize("k", [0, 2])
def test_the_templates_prefix_rules_are_the_suites(k):
    """Over 300 seeded steps with a block size (prefix hits, chunks, preemptions, an idle rank's dummy
    steps): the script's forward copies and accepted counts (`preprocess_mamba`), its state columns
    (`mamba_get_block_table_tensor`, mode "align") and its block table, whose rows grow in place,
    equal the suite's at every step."""
    t = template_module(f"template_prefix{k}")
    batches = default_sequence(0, 300, spec_tokens=k, block_size=BS, data_parallel=True).batches()
    ours, theirs = InputBatch(16, 1 + k, 0), t.InputBatch(16, 1 + k, 0, t.OPTION_DEFAULTS)
    moved = hit = 0
    for b in batches:
        st = b.to_json()
        copies, accepted = forward_copies(b)
        got_copies, got_accepted = t.forward_copies(st)
        assert got_copies == [(c.dst, c.conv_src, c.conv_offset, c.ssm_src) for c in copies] and \
            got_accepted == accepted, b.step
        moved += len(copies)
        if b.num_reqs:
            width = max(len(r) for r in b.block_rows())
            table = np.array([r + [0] * (width - len(r)) for r in b.block_rows()])
            seq_lens = np.array(b.computed()) + np.array(b.query_lens)
            want = state_block_columns(table, seq_lens, 1 + k, BS).tolist()
            assert [t.state_columns(st, i, 1 + k) for i in range(b.num_reqs)] == want, b.step
            hit += any(c > 0 and r not in theirs.row_of for c, r in zip(b.computed(), b.request_ids))
        scheduled = list(zip(b.request_ids, b.block_rows()))
        ours.update(scheduled, True, set(b.finished))
        theirs.update(scheduled, True, set(b.finished))
        assert theirs.row_of == ours.row_of and theirs.table == ours.table.tolist(), b.step
        ours.commit(ours.num_rows)
        theirs.commit(theirs.num_rows)
        assert theirs.rows(b.request_ids) == ours.rows(b.request_ids).tolist()
    assert moved > 50 and hit > 0, (moved, hit)


def test_a_block_size_baseline_replays_equal_to_eager_through_prefix_hits(tiny_path, tmp_path):
    """120 steps at K = 2 with blocks of 4: the script's copies make forward copies, run FULL spec
    decodes over running columns past column 0, and replay equals eager at every step."""
    _, rep = report(tmp_path, ["--model", tiny_path, "--mode", "full_and_piecewise", "--spec-tokens", "2",
                               "--block-size", str(BS), "--steps", "120", "--island", "gdn_core"])
    script = module(rep / SCRIPT, "script_prefix")
    seen = collections.Counter()
    copy0, build0 = script.copy_states, script.MetadataBuilder.build

    def counted_copies(copy, copies):
        seen["copies"] += len(copies)
        return copy0(copy, copies)

    def counted_build(self, st, rows):
        if self.full_graphs and st.get("block_size") and any(
                script.state_columns(st, i, 1)[0] != st["blocks"][i][0] for i in range(len(st["query_lens"]))):
            seen["past column 0"] += 1
        return build0(self, st, rows)
    script.copy_states, script.MetadataBuilder.build = counted_copies, counted_build
    assert script.main(["--device", "cpu"]) == 0
    assert seen["copies"] > 20 and seen["past column 0"] > 10, seen


def test_a_hazard_with_a_block_size_reproduces_in_the_script(tiny_path, tmp_path):
    """vLLM #49757's re-staging half at K = 2 with blocks of 4 (the dummy replays the last decode's
    staging, over running columns): the script diverges at the suite's step, tensor and block, and
    its repair is clean."""
    doc, rep = report(tmp_path, ["--model", tiny_path, "--hazard", "dummy-reuses-staging", "--mode",
                                 "full_and_piecewise", "--island", "gdn_core", "--steps", "60", "--spec-tokens", "2",
                                 "--block-size", str(BS)])
    r = doc["results"][0]
    fd = r["first_divergence"]
    assert r["diverged"] and r["block_size"] == BS and standalone_gap(r) is None
    p, got = run_script(rep)
    assert p.returncode == 1, p.stdout + p.stderr
    assert (got["step"], got["island"], got["tensor"], got["slot"]) == (fd["step"], fd["island"], fd["tensor"],
                                                                       fd["slot"])
    p, got = run_script(rep, "--repair")
    assert p.returncode == 0 and got == {"diverged": False, "steps": fd["step"] + 1}, p.stdout + p.stderr
