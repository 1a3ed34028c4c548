"""tools/long_runs.py: a row is clean only when the run reached its last step with replay equal
to eager and the third copy agreeing; a repair meant to be loud must be loud."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
import long_runs  # noqa: E402

from repro.graphs import TapeProvider, make_provider  # noqa: E402
from repro.islands import Model  # noqa: E402
from repro.job.cases import Case  # noqa: E402


@pytest.fixture(scope="module")
def model_provider(tiny_path):
    return Model(tiny_path, "cpu"), TapeProvider("cpu")


def test_a_baseline_row_is_clean_and_a_live_hazard_row_is_not(model_provider):
    model, provider = model_provider
    base = long_runs.run(model, provider, Case("chain", "full_and_piecewise", spec_tokens=2), 8, 0)
    assert base.clean and base.ok and base.steps == base.planned == 8
    bad = long_runs.run(model, provider, Case("chain", "full_and_piecewise", ("shape-only-uniform-decode",),
                                               spec_tokens=2), 8, 0)
    assert bad.expect == "diverged" and bad.ok and not bad.clean and "gdn_core" in bad.failure


def test_the_loud_repair_is_expected_loud(device, tiny_path):
    """On the device under test: a replay the runner refuses ends the step early, before its read;
    the step's timing must still close (on a GPU its device events were still pending)."""
    provider = make_provider(device)
    model = Model(tiny_path, provider.device)
    r = long_runs.run(model, provider, Case("chain", "full_and_piecewise", ("shape-only-uniform-decode",),
                                             ("replay-assert",), spec_tokens=2), 8, 0)
    assert r.expect == "finding" and r.ok and not r.clean and "replay-refused" in r.failure


def test_the_plan_has_every_record_repair_and_every_k_mode():
    cs = long_runs.cases([0, 1], ["none", "piecewise"], False, True, block_sizes=[4])
    assert sum(not c.hazards and c.block_size is None for c in cs) == 4
    assert {(c.mode, c.spec_tokens) for c in cs if c.block_size == 4} == {(m, k) for m in ("none", "piecewise")
                                                                          for k in (0, 1)}
    assert not [c for c in long_runs.cases([0, 2], ["none"], False, False, block_sizes=[2]) if c.spec_tokens == 2
                and c.block_size]  # a block no wider than K
    assert {(c.hazards[0], c.repairs[0]) for c in cs if c.hazards} >= {("first-chunk-as-decode", "is-prefilling-first-chunk"),
                                                                       ("fresh-alloc-split-op", "copy-inputs")}
    blocks_only = long_runs.cases([0, 1], ["none"], False, False, block_sizes=[4], plain=False)
    assert [(c.spec_tokens, c.block_size) for c in blocks_only] == [(0, 4), (1, 4)]  # --no-baselines keeps them


def test_main_exits_0_when_clean_and_1_when_a_row_is_not(capsys, monkeypatch):
    argv = ["--steps", "4", "--spec-tokens", "0", "--modes", "none", "--no-repairs"]
    assert long_runs.main(argv + ["--block-sizes", "4"]) == 0
    out = capsys.readouterr().out
    assert "2 of 2 as expected" in out and "baseline block 4" in out
    monkeypatch.setattr(long_runs, "run", lambda *a: long_runs.Row("baseline", "none", 0, False, 3, 4, None, 0.0))
    assert long_runs.main(argv) == 1  # stopped short of its last step with no failure named
    assert "NOT CLEAN: stopped at step 3" in capsys.readouterr().out
