"""The device-side check on the CPU tape: it finds the same first divergence as the
per-tensor host path for planted hazards, it sees writes into slots no live
request owns and in-place weight changes at the step they happen, NaN in both copies stays
equal, and a clean step reads the device once. No timing is asserted."""
from dataclasses import replace

import pytest
import torch

from repro.knobs import hazards as hz
from repro.control.batch import StepBatch
from repro.check.compare import UNOWNED, WEIGHTS
from repro.graphs import make_provider
from repro.islands import Model
from repro.job.cases import default_sequence
from repro.lockstep import Lockstep, run_lockstep
from repro.lockstep.checks import locate
from repro.check.stepcheck import StepCheck, digest_words, words
from repro.control.shape import StepShape

SEQ = default_sequence(seed=0, steps=60)
STALE_SEQ = default_sequence(seed=4, steps=60)
KEYS = ("step", "island", "tensor", "row", "slot")


@pytest.fixture(scope="module")
def setup(tiny_path):
    provider = make_provider("cpu")
    return Model(tiny_path, provider.device), provider


def _make(model, seq, sentinel):
    return lambda o: model.copy(o, num_slots=seq.num_slots, sentinel=sentinel)


def run(model, provider, hazard, mode, check, seq=SEQ):
    """One hazard case as `job.cases.run_case` runs it, with the check chosen."""
    opts = hz.options_for((hazard,), ())
    sentinel = opts.sentinel(0)
    batches = seq.batches(None if sentinel == 0 else range(seq.num_slots))
    return run_lockstep(_make(model, seq, sentinel), provider, batches, mode=mode, opts=opts,
                        shape=StepShape(max_tokens=seq.max_tokens), check=check)


@pytest.mark.parametrize("hazard, mode", [("stale-pad", "full"), ("pad-sentinel-mismatch", "full"),
                                          ("output-alias", "piecewise"), ("fresh-alloc-split-op", "piecewise"),
                                          ("frozen-python-state", "piecewise"), ("escaped-capture", "piecewise")])
def test_device_check_finds_the_host_paths_first_divergence(setup, hazard, mode):
    """Same step, island, tensor, row and slot as the per-tensor host path, or earlier only where
    the whole state shows a slot no live request owns. (stale-pad on seed 4's sequence: seed 0's
    60 steps never pad a FULL replay over rows an earlier decode staged.)"""
    model, provider = setup
    seq = STALE_SEQ if hazard == "stale-pad" else SEQ
    dev, host = (run(model, provider, hazard, mode, "device", seq), run(model, provider, hazard, mode, "host", seq))
    assert dev.divergence is not None and host.divergence is not None
    d, h = dev.divergence, host.divergence
    if d.note == UNOWNED:
        assert d.step <= h.step
    else:
        assert [getattr(d, k) for k in KEYS] == [getattr(h, k) for k in KEYS]
        assert d.kind == h.kind and d.max_abs == h.max_abs


def _lockstep(model, provider, seq=SEQ):
    return Lockstep(_make(model, seq, 0), provider, "full", shape=StepShape(max_tokens=seq.max_tokens))


def _unowned_step(batches, want_null: bool):
    """(index, slot): a step and a slot no live request owns at it (slot 0, or a freed one)."""
    for i, b in enumerate(batches):
        owned = set(b.slots) | set(b.live_slots)
        if want_null:
            return i, 0
        freed = [s for s in range(1, SEQ.num_slots + 1) if s not in owned and any(s in p.slots for p in batches[:i])]
        if freed and i > 3:
            return i, freed[0]
    raise AssertionError("no freed slot in the sequence")


@pytest.mark.parametrize("null", [True, False], ids=["null-block", "freed-slot"])
@pytest.mark.parametrize("when", ["during", "between"])
def test_write_into_a_slot_no_live_request_owns_is_reported_at_that_step(setup, null, when):
    """A freed slot written is a divergence at that step (no live request owns it); the null block
    written is set aside (`Lockstep._null_aside`: kernels may write it for padded rows), and the step
    is kept as `null_written`."""
    model, provider = setup
    batches = SEQ.batches()
    k, slot = _unowned_step(batches, null)
    ls = _lockstep(model, provider)
    step = ls.graph.step

    def planted(batch):  # a provider that writes one unowned slot of the replay copy's state
        out = step(batch)
        if batch is batches[k]:
            ls.replay_copy.cache.ssm[slot] += 1.0
        return out
    if when == "during":
        ls.graph.step = planted
    div = None
    for i, b in enumerate(batches):
        if when == "between" and i == k:
            ls.replay_copy.cache.conv[slot] += 1.0
        div = ls.step(b)
        if div is not None:
            break
    if null:  # the null block holds no request's state: not a divergence, but kept as the step it was written
        assert div is None and ls.null_written == batches[k].step
        return
    assert div is not None and div.step == batches[k].step
    assert div.slot == slot and div.tensor in ("ssm_state", "conv_state") and div.request is None
    assert div.note == UNOWNED and UNOWNED in div.where() and div.failure


def test_the_host_path_does_not_see_an_unowned_slot(setup):
    """Why the device check reads the whole state: the host path compares live and touched slots only."""
    model, provider = setup
    ls = Lockstep(_make(model, SEQ, 0), provider, "full", shape=StepShape(max_tokens=SEQ.max_tokens), check="host")
    batches = SEQ.batches()
    ls.step(batches[0])
    ls.replay_copy.cache.ssm[0] += 1.0
    assert ls.step(batches[1]) is None


@pytest.mark.parametrize("name, where, at", [("layer.gdn.dt_bias", lambda w: w.gdn.dt_bias, 6),
                                             ("layer.gdn.in_proj_z.weight", lambda w: w.gdn.in_proj_z.weight, 6),
                                             ("layer.gdn.dt_bias", lambda w: w.gdn.dt_bias, 11)])
def test_in_place_weight_change_is_reported_at_that_step_naming_the_tensor(tiny_path, name, where, at):
    """The digest is read a step late (`StepCheck.begin`), and at the end of the run (`finish`):
    a write in the last step (11 of 12) is reported too, at its own step."""
    provider = make_provider("cpu")
    model = Model(tiny_path, provider.device)  # its own: the weights are changed
    batches = SEQ.batches()[:12]
    ls = _lockstep(model, provider)
    step = ls.graph.step

    def planted(batch):  # after both copies ran: the outputs agree, only the weight watch sees it
        out = step(batch)
        if batch.step == at:
            t = where(model.weights)
            t.view(-1)[0] = t.view(-1)[0] + 1 if t.is_floating_point() else t.view(-1)[0] ^ 1
        return out
    ls.graph.step = planted
    div = ls.run(batches)
    assert div is not None and (div.step, div.island, div.tensor) == (at, WEIGHTS, name)
    assert f"at step {at}" in div.reason
    assert ls.steps == min(at + 2, len(batches))  # seen at the next step's read, or by `finish`
    assert div.kind == "corruption" and "changed in place" in div.where()
    if "in_proj_z" in name:  # a row view of the stacked matrix: named, the matrix listed too
        assert "layer.gdn.in_proj.weight" in div.reason


def test_nan_in_both_copies_is_equal_and_bits_only_point_the_exact_path():
    nan = float("nan")
    b = StepBatch([7], [1], [2], [False], [3, 4], step=2, live_slots=[1])
    a = {"submod0.qkv": torch.tensor([[1.0, nan], [float("inf"), 2.0]], dtype=torch.bfloat16),
         "head.token_ids": torch.tensor([1, 2])}
    sa = {"ssm_state": torch.zeros(3, 2)}
    sa["ssm_state"][2, 1] = nan
    sb = {"ssm_state": sa["ssm_state"].clone()}
    check = StepCheck()
    same = {k: v.clone() for k, v in a.items()}
    assert check.read(check.launch(a, same, sa, sb)).clean
    # +0.0 vs -0.0: the bits differ, the values do not: flagged, and the exact path says equal
    sb["ssm_state"][1, 0] = -0.0
    v = check.read(check.launch(a, same, sa, sb))
    assert v.slots["ssm_state"] == [1] and locate(b, v, a, same, sa, sb) is None
    # a one-sided NaN is a divergence naming the row and the copy
    other = {k: v.clone() for k, v in a.items()}
    other["submod0.qkv"][1, 1] = nan
    v = check.read(check.launch(a, other, sa, sa))
    assert v.outputs == ["submod0.qkv"]
    d = locate(b, v, a, other, sa, sa)
    assert (d.tensor, d.row, d.request, d.slot, d.nonfinite) == ("qkv", 1, 7, 1, "replay")


def test_weight_digest_sees_any_single_word():
    for t in (torch.arange(7, dtype=torch.int8), torch.randn(5, 3).to(torch.bfloat16), torch.randn(4, 6)[:, 1:3]):
        before = int(digest_words(t))
        u = t.clone()
        u.view(-1)[-1] = u.view(-1)[-1] + 1
        assert int(digest_words(u)) != before
    # the widest words that tile the bytes: one sum in the words' own type, no widening cast
    assert words(torch.zeros(8, dtype=torch.bfloat16)).dtype == torch.int64
    assert words(torch.zeros(6, dtype=torch.bfloat16)).dtype == torch.int32
    assert words(torch.zeros(3, dtype=torch.bfloat16)).dtype == torch.int16
    assert words(torch.zeros(16, dtype=torch.int8)[1:9]).dtype != torch.int64  # misaligned: narrower words
    # int64 words wrap on overflow (addition modulo 2**64): still any single word, in any order
    big = torch.full((8,), 2 ** 62, dtype=torch.int64)
    before = int(digest_words(big))
    big[3] += 1
    assert int(digest_words(big)) == before + 1
    assert int(digest_words(big.flip(0))) == before + 1



def test_the_weight_digest_wraps_modulo_2_64_on_the_device_as_on_the_host(device):
    """A digest whose sum overflows int64 (any real expert stack's does) is the exact sum modulo
    2**64 on the run's device, in whatever order the device reduces: otherwise the per-step check
    would report weights that did not change."""
    g = torch.Generator().manual_seed(0)
    host = torch.randint(-2 ** 62, 2 ** 62, (1 << 16,), dtype=torch.int64, generator=g)
    exact = sum(host.tolist()) % 2 ** 64
    exact -= 2 ** 64 if exact >= 2 ** 63 else 0
    as_bytes = host.view(torch.int8).to(device)  # int8 weights: read back as int64 words
    assert words(as_bytes).dtype == torch.int64
    assert abs(sum(host.tolist())) > 2 ** 63 and int(digest_words(as_bytes)) == exact
    assert int(digest_words(as_bytes)) == int(digest_words(as_bytes))


def test_the_frozen_reads_see_a_weight_word_and_a_state_slot_at_the_step(device):
    """On a CUDA device the weight digests and the state slot flags are one captured graph each,
    replayed per step (`stepcheck.Frozen`); elsewhere they run directly. Either way a changed weight
    byte and a changed slot are seen at the next read, a clean step stays clean, and state tensors
    at new addresses are read (captured again), not the old ones."""
    w = torch.arange(64, dtype=torch.int8, device=device)
    check = StepCheck({"layer.w": w})
    sa = {"conv_state": torch.zeros(3, 2, 4, device=device), "ssm_state": torch.zeros(4, 8, device=device)}
    sb = {k: v.clone() for k, v in sa.items()}
    out = {"submod0.qkv": torch.ones(2, 3, device=device)}

    def step(b=sb):  # the lockstep's order: the digest first, then the step's flags
        assert check.begin()
        return check.read(check.launch(out, out, sa, b))

    assert step().clean
    w[5] += 1
    assert step().weights == ["layer.w"] and check.changed_now() == ["layer.w"]
    w[5] -= 1
    sb["ssm_state"][2, 7] = 1.0
    v = step()
    assert v.slots == {"conv_state": [], "ssm_state": [2]} and not v.weights
    moved = {k: v.clone() for k, v in sa.items()}
    assert step(moved).clean
    moved["conv_state"][1, 1, 3] = -1.0
    assert step(moved).slots["conv_state"] == [1]
    w[0] ^= 1  # after the last step: only `finish` can see it
    assert check.changed_now() == ["layer.w"]


def test_weight_every_thins_the_digest_and_the_flags_still_run_every_step():
    w = torch.arange(16, dtype=torch.int8)
    check = StepCheck({"layer.w": w}, weight_every=3)
    out = {"submod0.qkv": torch.ones(2)}
    assert [check.begin() for _ in range(7)] == [True, False, False, True, False, False, True]
    w[1] += 1
    assert not check.begin() and check.read(check.launch(out, out, {}, {})).weights == []
    assert not check.begin()
    assert check.begin() and check.read(check.launch(out, out, {}, {})).weights == ["layer.w"]


def test_a_clean_step_reads_the_device_once(setup, monkeypatch):
    """No per-tensor `.item()`, `torch.equal` or bool() of a tensor: one `tolist` of one vector
    per decode step (steps that capture a graph aside: capture-time lints read tensors; and
    prefill steps: the CPU reference prefill kernel reads its query_start_loc on the host)."""
    model, provider = setup
    batches = SEQ.batches()[:25]
    ls = _lockstep(model, provider)
    calls = {"tolist": 0, "item": 0, "equal": 0, "bool": 0}
    for name, orig in (("tolist", torch.Tensor.tolist), ("item", torch.Tensor.item), ("bool", torch.Tensor.__bool__)):
        def counted(self, *a, _n=name, _o=orig, **k):
            calls[_n] += 1
            return _o(self, *a, **k)
        monkeypatch.setattr(torch.Tensor, name if name != "bool" else "__bool__", counted)
    eq = torch.equal
    monkeypatch.setattr(torch, "equal", lambda *a: calls.__setitem__("equal", calls["equal"] + 1) or eq(*a))
    steady = 0
    for i, b in enumerate(batches[:-1]):
        before, captures = dict(calls), ls.graph.captures
        assert ls.step(b, batches[i + 1]) is None
        if ls.graph.captures == captures and b.uniform_decode:
            steady += 1
            assert {k: calls[k] - before[k] for k in calls} == {"tolist": 1, "item": 0, "equal": 0, "bool": 0}, i
    assert steady >= 5


def test_prepared_inputs_are_each_consumers_own(setup):
    """Each call copies the host buffer once (the metadata is the builder's, `control.builder`)."""
    b = replace(SEQ.batches()[3]).prepare()
    i1, i2 = b.ids("cpu"), b.ids("cpu")
    assert i1.tolist() == b.token_ids and i1.data_ptr() != i2.data_ptr()
    assert b.token_slot_tensor("cpu").tolist() == b.token_slots()
    d = b.on("cpu")  # one copy of the host buffer, viewed as every field
    assert d.ids.dtype == torch.long and d.token_slots.dtype == torch.int32
    assert d.ids.untyped_storage().data_ptr() == d.token_slots.untyped_storage().data_ptr()
    b.release()
    assert b._host is None and b.ids("cpu").tolist() == b.token_ids  # rebuilt on demand


@pytest.mark.parametrize("at", [3, 7])
def test_the_moe_lockstep_reports_a_weight_write_at_its_step_the_last_one_too(tiny_path, monkeypatch, at):
    """`run_moe_lockstep` reads each step's digest at the next step and the last one at the end."""
    from repro.lockstep import run_moe_lockstep
    from repro.capture.runner import PieceRunner
    provider = make_provider("cpu")
    model = Model(tiny_path, provider.device)  # its own: a weight is changed
    batches = SEQ.batches()[:8]
    step, calls = PieceRunner.step, []

    def planted(self, ids):  # one call a step, after the eager island: only the digest sees it
        out = step(self, ids)
        calls.append(1)
        if len(calls) == at + 1:
            model.weights.moe.gate.view(-1)[0] += 1
        return out
    monkeypatch.setattr(PieceRunner, "step", planted)
    res = run_moe_lockstep(model, provider, batches)
    d = res.divergence
    assert d is not None and (d.step, d.island, d.tensor) == (at, WEIGHTS, "layer.moe.gate"), d
    assert res.steps == min(at + 2, len(batches))
