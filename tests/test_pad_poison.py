"""Padding poison: non-finite values in padded rows of a piece's output that a later piece reads
are a finding of their own (step, piece, tensor, rows), not a divergence of live rows, and never
silent: a case that should be clean fails on it, and a hunt counts it."""
import math

import pytest
import torch

from repro.capture.forward import ChainForward
from repro.capture.runner import GraphRunner
from repro.graphs import make_provider
from repro.islands import Model
from repro.job.cases import Case, run_case
from repro.job.results import exit_code, format_table, verdict
from repro.scheduler.sequence import Request, Sequence
from repro.search.blind import failure
from repro.control.shape import StepShape

# Three one-token prompts decoding together: three rows padded to the capture size 4 (piecewise).
SEQ = Sequence([Request(i, 1, 3) for i in range(3)], num_slots=4, max_tokens=16)


@pytest.fixture(scope="module")
def model_provider(tiny_path):
    p = make_provider("cpu")
    return Model(tiny_path, p.device, None, island="submod0"), p


def _poison_hidden(monkeypatch):
    """A fault planted at run time: graph 1's `hidden` gets NaN in its padded rows after each replay
    (what a kernel that writes past the live rows would leave)."""
    real = ChainForward.piecewise

    def poisoned(self, cap, batch, meta):
        held, fresh, o1 = real(self, cap, batch, meta)
        o1["hidden"][batch.num_tokens:cap.size] = math.nan
        return held, fresh, o1
    monkeypatch.setattr(ChainForward, "piecewise", poisoned)


def test_nan_in_padded_rows_is_a_pad_poison_finding_not_a_divergence(model_provider, monkeypatch):
    model, provider = model_provider
    _poison_hidden(monkeypatch)
    r = run_case(model, provider, Case("chain", "piecewise"), SEQ)
    poison = [f for f in r.findings if f["kind"] == "pad-poison"]
    assert not r.diverged and len(poison) == 1, r.findings  # reported once, at the first step it is seen
    f = poison[0]
    assert f["island"] == "submod1" and "submod1.hidden" in f["detail"], f
    assert "step 0:" in f["detail"] and "padded rows 3 (live rows 0..2, padded to 4)" in f["detail"], f
    assert verdict(r) == "DIVERGED" and exit_code([r]) == 1  # never silent
    assert "pad-poison: step 0: submod1.hidden" in format_table([r])
    assert failure(r).line().startswith("finding pad-poison in submod1")  # what a hunt counts


def test_clean_padded_rows_say_nothing(model_provider):
    model, provider = model_provider
    r = run_case(model, provider, Case("chain", "piecewise"), SEQ)
    assert not r.findings and verdict(r) == "ok"


@pytest.mark.parametrize("mode", ["piecewise", "full_and_piecewise"])
def test_the_watched_rows_are_what_later_pieces_read(model_provider, mode):
    """A padded step's watched rows: graph 1's inputs (the splitting op's output and graph 0's z and
    residual) and graph 1's outputs (the next layer's inputs), in both modes; none without padding."""
    model, provider = model_provider
    copy = model.copy(num_slots=4)
    runner = GraphRunner(copy, provider, mode=mode, shape=StepShape(max_num_seqs=4, max_tokens=16))
    b = SEQ.batches()
    runner.step(b[0])  # three prompts of one token: 3 rows padded to 4
    assert set(runner.padding) == {"gdn_core.core_out", "submod0.z", "submod0.residual", "submod1.hidden",
                                   "submod1.next_normed"}
    assert all(t.shape[0] == 1 and bool(torch.isfinite(t).all()) for t in runner.padding.values())
    one = Sequence([Request(0, 4, 0)], num_slots=4, max_tokens=16).batches()[0]  # 4 tokens: a capture size
    runner.step(one)
    assert runner.padding == {}
