"""A hazard's trigger is reached only where the hazard can act: a step the trigger counts and the
hazard leaves alone would make a clean run report it MISSED."""
import pytest

from repro.control.dispatch import default_capture_sizes
from repro.control.shape import StepShape
from repro.graphs import make_provider
from repro.islands import Model
from repro.job.cases import Case, run_case
from repro.job.triggers import reached
from repro.scheduler.sequence import Request, Sequence

HAZARD = ("first-chunk-as-decode",)


def _seq(beside_a_decode: bool) -> Sequence:
    """Request 0 is a one-token prompt that finishes at once; request 2's one-token first chunk then
    takes its state blocks at step 1, beside request 1's spec decode or alone."""
    reqs = [Request(0, 1, 0), Request(2, 1, 0, arrive=1)]
    if beside_a_decode:
        reqs.append(Request(1, 2, 4))
    return Sequence(reqs, num_slots=4, max_tokens=16, spec_tokens=2)


def _reached(seq: Sequence) -> bool:
    return reached(HAZARD, (), "piecewise", seq.batches(), default_capture_sizes(4, 16, 2), [], StepShape.of(seq))


def test_a_one_token_first_chunk_beside_a_spec_decode_does_not_reach_the_decode_kernels():
    """Beside a spec row the builder sends one-token non-spec rows to the prefill kernel, which
    starts from zero whatever the first-chunk rule says: the trigger is not reached."""
    seq = _seq(beside_a_decode=True)
    step1 = seq.batches()[1]
    assert 2 in step1.request_ids and step1.drafts()[step1.request_ids.index(1)] == 2  # the state it means
    assert step1.slots[step1.request_ids.index(2)] == seq.batches()[0].slots[0]  # the block request 0 left
    assert not _reached(seq)
    assert _reached(_seq(beside_a_decode=False))


@pytest.fixture(scope="module")
def model_provider(tiny_path):
    p = make_provider("cpu")
    return Model(tiny_path, p.device, None, island="submod0"), p


@pytest.mark.parametrize("beside", [True, False])
def test_the_trigger_agrees_with_what_the_hazard_does(model_provider, beside):
    """Where the trigger is reached the hazard shows (the third copy sees the recycled state); where
    it is not, the planted hazard changes nothing."""
    model, provider = model_provider
    seq = _seq(beside)
    r = run_case(model, provider, Case("chain", "piecewise", HAZARD, (), "diverged", spec_tokens=2), seq)
    assert r.diverged is (not beside) and r.triggered is (not beside), r.to_json()
