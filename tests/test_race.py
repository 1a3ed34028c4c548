"""The race amplifier: stream hazards happen on every step, whatever the kernel speed.

On the CPU (always run): the options and the CLI flag reach the runner; the poison is what an
early read sees; a host read that races a copy that lands late (a provider whose copies land
only when it synchronises) gets the poison, a synchronised read the real values; the
side-stream amplifier's poison is rewritten by every replay before anything reads it (the tape
runs in program order, a correct ordering, so the amplified run must equal eager bit for bit);
the registered all-reduce's amplifier turns a hazard that repeated rows hide into a wrong value,
and leaves clone-input exact.

On a GPU (`pytest --device cuda tests/test_race.py`; skipped otherwise): every stream hazard is
detected by step 2 in 10 of 10 runs, each repair clears it in 10 of 10 runs with amplification
on, and correctly ordered stream mechanisms stay clean over 200 amplified steps.
"""
import contextlib
import re
from dataclasses import replace

import pytest

from repro.control.dispatch import DEFAULT_SIZES, Dispatcher, uniform_decode
from repro.knobs.modes import Runtime, parse_mode
from repro.knobs.options import UniformDecode
import torch

from repro.knobs import hazards as hz
from repro.capture.piece import Graph
from repro.graphs import TapeProvider, make_provider
from repro.islands import Model
from repro.job.cases import Case, default_sequence, run_case
from repro.lockstep import Lockstep
from repro.knobs.options import HostCopy, Options, RunnerOptions
from repro.capture.race import device_delay
from repro.graphs.poison import is_poison, poison_, poison_value
from repro.capture.race import HostReadback
from repro.capture.runner import GraphRunner
from repro.control.shape import StepShape

GPU_REASON = "needs an NVIDIA GPU (pytest --device cuda)"
STREAM_HAZARDS = sorted((h.name, m) for h in hz.HAZARDS.values() if h.stream and "chain" in h.islands
                        for m in h.modes)


# --------------------------------------------------------------------------- options and poison


def test_amplify_is_on_by_default_and_no_table_row_turns_it_off():
    assert RunnerOptions().amplify and RunnerOptions().amplify_us > 0
    for name in hz.HAZARDS:
        for repairs in [()] + [(r,) for r in hz.HAZARDS[name].repairs]:
            assert hz.options_for([name], repairs).runner.amplify, (name, repairs)


def test_no_amplify_flag_parses_on_run_only_and_forced_comm_refuses_it():
    from repro.cli.app import main, parser
    assert parser().parse_args(["run", "--no-amplify"]).no_amplify
    assert not parser().parse_args(["run"]).no_amplify
    with pytest.raises(SystemExit):
        parser().parse_args(["hunt", "--no-amplify"])
    assert main(["run", "--island", "forced_comm", "--tp", "2", "--no-amplify"]) == 2


@pytest.mark.parametrize("dtype, value", [(torch.bfloat16, "nan"), (torch.float32, "nan"),
                                          (torch.int64, torch.iinfo(torch.int64).min),
                                          (torch.int32, torch.iinfo(torch.int32).min), (torch.bool, None)])
def test_poison_is_recognisable_for_each_dtype(dtype, value):
    t = torch.zeros(3, 4, dtype=dtype)
    poison_(t)
    if value is None:  # no bool value is recognisable: left alone, never reported as poison
        assert poison_value(dtype) is None and not t.any() and not is_poison(t).any()
        return
    assert is_poison(t).all()
    if value == "nan":
        assert torch.isnan(t.float()).all()
    else:
        assert (t == value).all()
    t[1] = 7
    assert is_poison(t).sum() == 8  # one rewritten row is no longer poison


def test_device_delay_does_nothing_on_the_cpu():
    assert device_delay("cpu", 10_000) == 0.0


# --------------------------------------------------------------------------- async output copy


class LateCopies:
    """A provider whose device-to-host copies land only when it synchronises (or when an event
    recorded after them is waited on): the worst interleaving of a non-blocking copy, made
    deterministic. `syncs` counts the synchronisations."""

    supports_streams = True
    device = torch.device("cpu")

    def __init__(self):
        self.pending: list = []
        self.syncs = 0

    def land(self):
        for dst, src in self.pending:
            dst.copy_(src)
        self.pending.clear()

    def synchronize(self):
        self.syncs += 1
        self.land()

    def new_event(self):
        provider = self

        class Event:
            def record(self, stream=None):
                self.upto = len(provider.pending)

            def query(self):
                return not provider.pending

            def synchronize(self):
                provider.land()
        return Event()


class LateReadback(HostReadback):
    def copy(self, dst, src):
        self.provider.pending.append((dst, src.clone()))


def _outs(seed):
    g = torch.Generator().manual_seed(seed)
    return {"hidden": torch.randn(4, 8, generator=g).to(torch.bfloat16),
            "ids": torch.randint(0, 100, (4,), generator=g)}


def test_an_unsynchronised_read_of_a_late_copy_sees_the_poison_and_the_finding_says_so():
    p = LateCopies()
    rb = LateReadback(p, synced=False, amplify=True, delay_us=1234)
    got = rb.read(_outs(0), step=3)
    assert torch.isnan(got["hidden"].float()).all()
    assert (got["ids"] == torch.iinfo(torch.int64).min).all()
    got = rb.read(_outs(1), step=4)  # step 3's copy lands before step 4 poisons the buffers
    assert torch.isnan(got["hidden"].float()).all()
    f = rb.log.finding()
    assert f.kind == "race" and "before the device-to-host copy landed" in f.detail
    assert "poisoned with NaN" in f.detail and "1234 us" in f.detail
    assert "2 of 2 amplified steps, first at step 3" in f.detail
    assert "the early read was confirmed at 2 of 2 measured steps, first at step 3" in f.detail


def test_a_synchronised_read_gets_the_real_values_with_the_amplifier_on():
    p = LateCopies()
    rb = LateReadback(p, synced=True, amplify=True)
    for step in range(3):
        out = _outs(step)
        got = rb.read(out, step=step)
        assert all(torch.equal(got[k], out[k]) for k in out)
        assert p.syncs == step + 1  # the synchronize came between the copy and the read
    assert rb.log.steps == 3 and rb.log.finding() is None
    assert rb.log.ordered == 3 and rb.log.early == 0  # the event said the copy had landed each time


def test_without_the_amplifier_an_early_read_can_give_last_steps_values_and_pass():
    """Why the poison: when step k's values equal step k-1's, a read that raced the copy still
    reads the right numbers. Unamplified, that race is invisible; amplified, it is not."""
    out = _outs(0)
    for amplify, invisible in ((False, True), (True, False)):
        p = LateCopies()
        rb = LateReadback(p, synced=False, amplify=amplify)
        rb.read(out, step=0)
        p.land()  # step 0's copy lands some time later
        got = rb.read(out, step=1)  # step 1 repeats step 0's values; its copy has not landed
        assert torch.equal(got["hidden"], out["hidden"]) is invisible


# --------------------------------------------------------------------------- side stream


class _Stream:
    def wait_stream(self, other):
        pass

    def wait_event(self, ev):
        pass


class _Event:
    def record(self, stream=None):
        pass

    def query(self):
        return True

    def synchronize(self):
        pass


class StreamedTape(TapeProvider):
    """The CPU tape with streams and events that order nothing: everything runs in program order
    (a correct ordering), so amplified runs must equal eager bit for bit."""

    supports_streams = True

    def new_stream(self):
        return _Stream()

    def stream(self, s):
        return contextlib.nullcontext()

    def current_stream(self):
        return _Stream()

    def new_event(self):
        return _Event()


@pytest.fixture(scope="module")
def model(tiny_path):
    return Model(tiny_path, "cpu")


def _lockstep(model, provider, mode, runner_opts, steps=14):
    seq = default_sequence(seed=1, steps=steps)
    ls = Lockstep(lambda o: model.copy(o, num_slots=seq.num_slots), provider, mode,
                  Options(runner=runner_opts), StepShape(max_tokens=seq.max_tokens))
    for b in seq.batches():
        div = ls.step(b)
        assert div is None, div.line()
    return ls


@pytest.mark.parametrize("mode", ["piecewise", "full"])
def test_amplified_stream_mechanisms_in_program_order_equal_eager_bit_for_bit(model, mode):
    """Every output the side-stream amplifier poisons is rewritten before anything reads it, and
    the host copy's poison is overwritten by the copy: with the order right nothing changes."""
    opts = RunnerOptions(side_stream=True, event_wait=True, host_copy=HostCopy.ASYNC_SYNCED)
    ls = _lockstep(model, StreamedTape("cpu"), mode, opts)
    g = ls.graph
    assert g.player.side_race.steps > 0 and g.player.host.log.steps > 0  # it did amplify
    assert not [f for f in g.findings if f.kind == "race"]  # and no read held the poison
    off = _lockstep(model, StreamedTape("cpu"), mode, replace(opts, amplify=False), steps=4)
    assert off.graph.player.side_race.steps == 0 and off.graph.player.host.log.steps == 0


class _NoReplay:
    """A captured graph whose replay has not landed yet (it writes nothing)."""

    def replay(self):
        pass


def test_a_read_before_the_side_stream_replay_lands_sees_the_poison(model):
    runner = GraphRunner(model.copy(num_slots=4), StreamedTape("cpu"),
                         opts=RunnerOptions(side_stream=True, event_wait=False))
    outs = {"hidden": torch.ones(2, 3, dtype=torch.bfloat16), "ids": torch.arange(2)}
    got = runner.player.replay(Graph(_NoReplay(), outs))
    assert torch.isnan(got["hidden"].float()).all() and (got["ids"] == torch.iinfo(torch.int64).min).all()
    assert any(f.kind == "stream" for f in runner.findings)
    off = GraphRunner(model.copy(num_slots=4), StreamedTape("cpu"),
                      opts=RunnerOptions(side_stream=True, amplify=False))
    outs = {"hidden": torch.ones(2, 3, dtype=torch.bfloat16)}
    assert torch.equal(off.player.replay(Graph(_NoReplay(), outs))["hidden"], torch.ones(2, 3, dtype=torch.bfloat16))


def test_the_side_stream_race_log_counts_poisoned_steps_and_the_first(model):
    from repro.capture.race import RaceLog
    log = RaceLog("what", "how")
    for step, hit in ((5, False), (6, True), (7, True)):
        log.hit_device(step, torch.tensor(hit))
    f = log.finding()
    assert f.detail == "forced: what; amplified: how; the read held the poison at 2 of 3 amplified steps, first at step 6"
    assert RaceLog("a", "b").finding() is None


# --------------------------------------------------------------------------- registered all-reduce


def _slice(tiny_path, clone_input, amplify):
    from repro.capture.slice import SliceRunner
    from repro.islands.forced_comm import ForcedComm, load_slice
    w = load_slice(tiny_path, 0, 0, 1, "cpu")
    eager = ForcedComm(w, mode="in-graph")
    replay = ForcedComm(w, mode="registered", clone_input=clone_input, amplify=amplify)
    return eager, SliceRunner(replay, TapeProvider("cpu"))


@pytest.mark.forced_comm
@pytest.mark.parametrize("clone_input, amplify, wrong", [(False, False, False), (False, True, True),
                                                         (True, True, False), (True, False, False)])
def test_registered_all_reduce_amplifier_makes_repeated_rows_visible(tiny_path, clone_input, amplify, wrong):
    """Step k's collective is read after step k+1's piece (the runner's overlap). When step k+1
    repeats step k's first rows and has fewer of them, the unamplified hazard reads right values
    and passes; the amplifier's overwrite right after each issue makes every row it reads NaN.
    With clone-input the result is eager's, bit for bit, amplified or not."""
    eager, runner = _slice(tiny_path, clone_input, amplify)
    a, b = [11, 22, 33, 44], [11, 22]
    with torch.inference_mode():
        want = eager(input_ids=torch.tensor(a))["out"]
        k = runner.launch(a)
        runner.launch(b)
        got = k.wait()
    assert k.amplified is (amplify and not clone_input)
    assert (not torch.equal(got, want)) is wrong
    if wrong:
        assert torch.isnan(got.float()).all()


# --------------------------------------------------------------------------- on a GPU


@pytest.fixture(scope="module")
def gpu(tiny_path, device):
    provider = make_provider(device)
    if not provider.supports_streams:
        pytest.skip(GPU_REASON)
    return Model(tiny_path, provider.device), provider


def _first_graphed_step(seq, mode):
    """The first step the runner replays a graph for, as it dispatches (`control.dispatch`): under
    full_and_piecewise a mixed step replays its PIECEWISE pieces, so that is usually step 0."""
    d = Dispatcher(parse_mode(mode), DEFAULT_SIZES, StepShape(0, seq.num_slots))
    return next(b.step for b in seq.batches()
                if d.dispatch(b.num_tokens, uniform_decode(UniformDecode.PAST_PROMPT, b.query_lens, b.is_prefilling(),
                                                           0))[0] is not Runtime.NONE)


@pytest.mark.exclusive
@pytest.mark.cuda
@pytest.mark.parametrize("hazard, mode", STREAM_HAZARDS)
def test_every_stream_hazard_is_detected_by_step_2_in_10_of_10_runs(gpu, hazard, mode):
    model, provider = gpu
    seq = default_sequence(seed=1, steps=30)
    first = _first_graphed_step(seq, mode)
    assert first <= 2
    on_time = 0
    for run in range(10):
        r = run_case(model, provider, Case("chain", mode, (hazard,)), seq)
        assert r.diverged, (run, r.findings)
        fd = r.first_divergence
        race = [f for f in r.findings if f["kind"] == "race"]
        assert race and f"first at step {fd['step']}" in race[0]["detail"], (run, r.findings)
        # Late detection is allowed only where the device's own record of the order (timed events,
        # the copy's event) says the first graphed step's read was not early: the host, or another
        # process time-sliced onto the GPU, held the consumer longer than the delay.
        confirmed = re.search(r"confirmed at (\d+) of (\d+) measured steps(?:, first at step (\d+))?",
                              race[0]["detail"])
        first_early = int(confirmed[3]) if confirmed and confirmed[3] is not None else None
        if fd["step"] != first:
            assert confirmed and (first_early is None or first_early > first), (run, fd, race[0]["detail"])
        assert first_early is None or fd["step"] <= first_early, (run, fd, first_early)
        on_time += fd["step"] == first
    assert on_time >= 1  # the forcing worked at the first graphed step at least once in 10


@pytest.mark.exclusive
@pytest.mark.cuda
@pytest.mark.parametrize("hazard, mode", STREAM_HAZARDS)
def test_each_repair_clears_its_stream_hazard_in_10_of_10_amplified_runs(gpu, hazard, mode):
    model, provider = gpu
    seq = default_sequence(seed=1, steps=30)
    for repair in hz.HAZARDS[hazard].repairs:
        for run in range(10):
            r = run_case(model, provider, Case("chain", mode, (hazard,), (repair,)), seq)
            assert not r.detected and r.steps == len(seq.batches()), (repair, run, r.first_divergence)
            assert not [f for f in r.findings if f["kind"] == "race"], (repair, run, r.findings)


@pytest.mark.exclusive
@pytest.mark.cuda
@pytest.mark.parametrize("mode", ["piecewise", "full"])
@pytest.mark.parametrize("hazards, repairs", [
    ((), ()),
    (("side-stream-no-wait",), ("event-wait",)),
    (("async-output-copy",), ("sync-output-copy",)),
    (("side-stream-no-wait", "async-output-copy"), ("event-wait", "sync-output-copy")),
])
def test_correctly_ordered_streams_stay_clean_over_200_amplified_steps(gpu, mode, hazards, repairs):
    model, provider = gpu
    seq = default_sequence(seed=7, steps=200)
    r = run_case(model, provider, Case("chain", mode, hazards, repairs), seq)
    assert r.steps == len(seq.batches()) >= 200 and not r.detected, r.first_divergence


@pytest.mark.cuda
def test_without_the_amplifier_the_run_still_works_and_reports_no_race(gpu):
    """--no-amplify: natural timing (the hazard may or may not show); no race finding claimed."""
    model, provider = gpu
    seq = default_sequence(seed=1, steps=10)
    r = run_case(model, provider, Case("chain", "piecewise", ("async-output-copy",), ("sync-output-copy",)), seq,
                 amplify=False)
    assert not r.detected and not [f for f in r.findings if f["kind"] == "race"]


@pytest.mark.cuda
@pytest.mark.forced_comm
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 NVIDIA GPUs")
def test_allreduce_no_clone_detected_at_the_first_collective_in_10_of_10_runs_on_2_gpus(cache):
    from repro.comm import CommCase, run_forced_comm
    from repro.scheduler.sequence import random_sequence
    from repro.model.tiny import default_checkpoint
    batches = random_sequence(0, num_requests=4, vocab=512).batches()[:24]
    cases = [CommCase(("allreduce-no-clone",))] * 10 + [CommCase(("allreduce-no-clone",), ("clone-input",))] * 10
    res = run_forced_comm(default_checkpoint(cache), tp=2, device="cuda", cases=cases, batches=batches, timeout=500)
    assert res["failure"] is None, res["failure"]
    for r in res["results"][:10]:
        assert r["diverged"] and r["first_divergence"]["index"] <= 1, r
    for r in res["results"][10:]:
        assert not r["diverged"] and r["steps"] == len(batches), r
