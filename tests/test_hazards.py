"""Replay == eager at baseline; every planted hazard is detected where it applies and its repair
clears it; the microscope names the right island and slot."""
import pytest

from repro.knobs import hazards as hz
from repro.errors import Refused
from repro.graphs import make_provider
from repro.islands import Model
from repro.job.cases import Case, default_sequence, run_case, sequence_needs
from repro.job.results import FINDING_KINDS

SEQ = default_sequence(seed=0, steps=60)


@pytest.fixture(scope="module")
def setup(tiny_path, device):
    provider = make_provider(device)
    return Model(tiny_path, provider.device), provider


def applicable(provider_name):
    for name, h in hz.HAZARDS.items():
        if "chain" not in h.islands or (h.device_only and provider_name == "cpu-tape"):
            continue
        for mode in h.modes:
            yield name, mode


@pytest.mark.submod0
@pytest.mark.gdn_core
@pytest.mark.submod1
@pytest.mark.parametrize("island, mode", [("chain", "piecewise"), ("chain", "full"), ("submod0", "piecewise"),
                                          ("submod1", "piecewise"), ("gdn_core", "full")])
def test_baseline_replay_equals_eager_bit_exactly(setup, island, mode):
    model, provider = setup
    r = run_case(model, provider, Case(island, mode), SEQ)
    assert not r.diverged, r.first_divergence
    assert r.steps == len(SEQ.batches()) > 40
    assert not [f for f in r.findings if f["kind"] == "undeclared-mutation"]


@pytest.mark.moe
def test_moe_island_baseline(setup):
    model, provider = setup
    r = run_case(model, provider, Case("moe", "piecewise"), SEQ)
    assert not r.diverged, r.first_divergence


@pytest.mark.parametrize("hazard, mode", sorted(applicable("cpu-tape")))
def test_planted_hazard_is_detected_and_its_repair_clears_it(setup, hazard, mode, hazard_filter):
    """Each hazard on the sequence it needs (drafts, dummy steps: `sequence_needs`); a repair that
    leaves a loud error (vLLM PR #55123's assertion) ends as that finding, never as a divergence."""
    if hazard_filter and hazard not in hazard_filter:
        pytest.skip(f"--hazard selects {hazard_filter}")
    model, provider = setup
    h = hz.HAZARDS[hazard]
    k, dp = sequence_needs((hazard,), None)
    seq = default_sequence(seed=0, steps=60, spec_tokens=k, data_parallel=dp)
    bad = run_case(model, provider, Case("chain", mode, (hazard,), spec_tokens=k, data_parallel=dp), seq)
    if h.detected_as == "finding":
        assert any(f["kind"] == (h.finding or "undeclared-mutation") for f in bad.findings), bad.findings
    else:
        assert bad.diverged and bad.first_divergence["step"] < 60, bad.findings
    for repair in h.repairs:
        try:
            hz.check([hazard], [repair], mode, provider.supports_streams)
        except Refused:
            continue  # e.g. eager-family=... in full mode
        good = run_case(model, provider, Case("chain", mode, (hazard,), (repair,), spec_tokens=k, data_parallel=dp), seq)
        assert not good.diverged, (repair, good.first_divergence)
        loud = {f["kind"] for f in good.findings if f["kind"] in FINDING_KINDS}
        if hz.REPAIRS[repair].leaves == "clean":
            assert not loud, (repair, good.findings)
        else:  # the repair turns the corruption into the one loud error it is for
            assert loud == {"replay-refused"}, (repair, good.findings)


@pytest.mark.parametrize("hazard, mode, island, tensor", [
    ("stale-pad", "full", "gdn_core", None),
    ("pad-sentinel-mismatch", "full", "gdn_core", None),
    ("output-alias", "piecewise", "submod0", "residual"),
    ("fresh-alloc-split-op", "piecewise", "submod1", None),
    ("escaped-capture", "piecewise", "submod0", "z"),
])
def test_microscope_names_island_tensor_and_slot(setup, hazard, mode, island, tensor):
    model, provider = setup
    r = run_case(model, provider, Case("chain", mode, (hazard,)), SEQ)
    fd = r.first_divergence
    assert fd["island"] == island
    if tensor:
        assert fd["tensor"] == tensor
    ctx = fd["context"]["this_step"]
    assert fd["slot"] in ctx["slots"] + ctx.get("pad_state_indices", [])
    if hazard == "stale-pad":
        # the corrupted slot is the one a padded row still pointed at
        assert fd["slot"] in ctx["pad_state_indices"]
        assert fd["tensor"] in ("conv_state", "ssm_state")
    if hazard == "pad-sentinel-mismatch":
        assert fd["slot"] == 0 and set(ctx["pad_state_indices"]) == {0}


def test_knobs_that_cannot_apply_are_refused():
    with pytest.raises(Refused, match="streams"):
        hz.check(["async-output-copy"], [], "piecewise", False)
    with pytest.raises(Refused, match="full"):
        hz.check(["stale-pad"], [], "piecewise", False)
    with pytest.raises(Refused, match="unknown hazard"):
        hz.check(["no-such"], [], "piecewise", False)
    with pytest.raises(Refused, match="unknown repair"):
        hz.check([], ["no-such"], "piecewise", False)


def test_findings_report_frozen_python_state(setup):
    model, provider = setup
    r = run_case(model, provider, Case("chain", "piecewise", ("frozen-python-state",), ("recapture",)), SEQ)
    assert not r.diverged
    assert any(f["kind"] == "python-state" and "num_actual_tokens" in f["detail"] for f in r.findings)


@pytest.mark.parametrize("hazard, repair", [("side-stream-no-wait", "event-wait"),
                                            ("async-output-copy", "sync-output-copy")])
def test_stream_hazards_on_a_device(setup, hazard, repair):
    model, provider = setup
    if not provider.supports_streams:
        pytest.skip("needs a GPU with streams (run with --device cuda or xpu); the CPU tape has none")
    seq = default_sequence(seed=1, steps=30)
    bad = run_case(model, provider, Case("chain", "piecewise", (hazard,)), seq)
    assert bad.diverged
    # the race amplifier (on by default) forced it on the first replayed step, and says how
    race = [f for f in bad.findings if f["kind"] == "race"]
    assert race and "amplified:" in race[0]["detail"], bad.findings
    assert f"first at step {bad.first_divergence['step']}" in race[0]["detail"]
    good = run_case(model, provider, Case("chain", "piecewise", (hazard,), (repair,)), seq)
    assert not good.detected, good.first_divergence


def test_alias_map_reports_pool_reuse_over_held_outputs_and_nothing_at_baseline(setup):
    model, provider = setup
    if provider.name != "cpu-tape":
        pytest.skip("needs the CPU tape (--device cpu): a device pool's internal blocks are not visible, "
                    "the tape's arena is")
    seq = default_sequence(seed=0, steps=12)
    bad = run_case(model, provider, Case("chain", "piecewise", ("shared-pool-weakref",)), seq)
    assert any(f["kind"] == "alias" and "graph 0's output" in f["detail"] for f in bad.findings), bad.findings
    for case in (Case("chain", "piecewise"), Case("chain", "piecewise", ("shared-pool-weakref",), ("private-pool",))):
        clean = run_case(model, provider, case, seq)
        assert not [f for f in clean.findings if f["kind"] == "alias"], clean.findings


def test_stream_check_reports_a_consumer_without_a_wait(setup):
    model, provider = setup
    if not provider.supports_streams:
        pytest.skip("needs a GPU with streams (run with --device cuda or xpu); the CPU tape has none")
    seq = default_sequence(seed=0, steps=6)
    bad = run_case(model, provider, Case("chain", "piecewise", ("side-stream-no-wait",)), seq)
    assert any(f["kind"] == "stream" for f in bad.findings)
    good = run_case(model, provider, Case("chain", "piecewise", ("side-stream-no-wait",), ("event-wait",)), seq)
    assert not any(f["kind"] == "stream" for f in good.findings)


@pytest.mark.parametrize("mode", ["piecewise", "full"])
def test_baseline_holds_for_500_steps(setup, mode):
    model, provider = setup
    seq = default_sequence(seed=7, steps=500)
    batches = seq.batches()
    assert len(batches) >= 500
    r = run_case(model, provider, Case("chain", mode), seq)
    assert r.steps == len(batches) and not r.diverged, r.first_divergence


@pytest.mark.parametrize("hazard, mode", [("stale-pad", "full"), ("frozen-python-state", "piecewise"),
                                          ("frozen-python-state", "full")])
def test_tape_and_cuda_graph_diverge_at_the_same_step(tiny_path, hazard, mode):
    import torch
    if not torch.cuda.is_available():
        pytest.skip("needs an NVIDIA GPU to compare the CPU tape with real CUDA graphs")
    steps = {}
    for dev in ("cpu", "cuda"):
        p = make_provider(dev)
        r = run_case(Model(tiny_path, p.device), p, Case("chain", mode, (hazard,)), SEQ)
        steps[dev] = (r.first_divergence["step"], r.first_divergence["slot"])
    assert steps["cpu"] == steps["cuda"]
