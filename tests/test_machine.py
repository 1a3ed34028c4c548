"""The stateful search: clean at baseline, and a planted hazard fails and shrinks."""
import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test

from repro.graphs import make_provider
from repro.islands import Model
from repro.search.machine import lockstep_machine


@pytest.fixture(scope="module")
def model_provider(tiny_path, device):
    p = make_provider(device)
    return Model(tiny_path, p.device), p


def _settings(n):
    # one bug shrunk, not every distinct one found on the way: Hypothesis bounds a shrink by wall
    # clock (minutes on the 2-core CI machine), and each further bug costs another
    return settings(max_examples=n, stateful_step_count=25, deadline=None, derandomize=True, database=None,
                    suppress_health_check=list(HealthCheck), report_multiple_bugs=False)


@pytest.mark.parametrize("mode", ["piecewise", "full"])
def test_baseline_machine_stays_clean(model_provider, mode):
    model, provider = model_provider
    run_state_machine_as_test(lockstep_machine(model, provider, mode), settings=_settings(12))


@pytest.mark.exclusive  # shrinking is bounded by wall-clock
# A full-mode hazard needs three decodes padded to 4 (pad-sentinel-mismatch) or, after four staged
# ones, three (stale-pad): a search of minutes over 25 random rules, so it runs with -m slow.
@pytest.mark.parametrize("mode, hazard, examples", [
    pytest.param("full", "pad-sentinel-mismatch", 200, marks=pytest.mark.slow),
    ("piecewise", "frozen-python-state", 60)])
def test_planted_hazard_fails_the_invariant(model_provider, mode, hazard, examples):
    model, provider = model_provider
    # shrunk: the divergence is reported at one of the first few scheduler steps
    with pytest.raises(AssertionError, match=r"^step [0-7]: "):  # shrinking is time-bounded under load
        run_state_machine_as_test(lockstep_machine(model, provider, mode, hazards=(hazard,)),
                                  settings=_settings(examples))


def test_repaired_hazard_stays_clean(model_provider):
    model, provider = model_provider
    run_state_machine_as_test(lockstep_machine(model, provider, "full", hazards=("stale-pad",),
                                               repairs=("sanitize-pad",)), settings=_settings(12))
