"""The independent third copy: faults both copies share, and which copy departed.

Faults are planted from outside through the public API: a kernel provider both copies use that
is wrong by the same amount (invisible to eager vs replay), a provider that goes wrong on the
eager copy's calls only (a process-wide cache misbehaving after capture: the replay copy replays
what was recorded), and a planted graph hazard (the replay copy departs)."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels import registry
from kernels.norms.reference import add_rms_norm_reference, rms_norm_reference
from repro.check.compare import CORRUPTION
from repro.graphs import make_provider
from repro.islands import Model
from repro.job.cases import Case, default_sequence, run_case
from repro.lockstep import Lockstep
from repro.knobs.options import Options
from repro.check.reference_copy import ReferenceCopy, default_every, independent_copy
from repro.control.shape import StepShape

SEQ = default_sequence(seed=2, steps=16)
FAULT = {"on": False}


def shifted(x, w, eps):
    """Wrong by +0.25 on every row, every call: both copies agree with each other."""
    return (rms_norm_reference(x.float(), w, eps) + 0.25).to(x.dtype)


def eager_only(x, y, w, eps):
    """`add_rms_norm` (submod1: inside a graph in both modes), right until FAULT is switched on;
    then row 0 of the normed output is off by 4.0 at each call (a stale cache on the Python path: a
    captured graph replays the ops recorded before, and is not affected)."""
    h, normed = add_rms_norm_reference(x, y, w, eps)
    if FAULT["on"]:
        normed = normed.clone()
        normed[0] += 4.0
    return h, normed


for _op, _name, _fn in (("rms_norm", "test-shifted", shifted), ("add_rms_norm", "test-eager-only", eager_only)):
    if _name not in registry.providers(_op):
        registry.register(_op, _name, _fn)


@pytest.fixture(scope="module")
def setup(tiny_path):
    provider = make_provider("cpu")
    return Model(tiny_path, provider.device), provider


@pytest.mark.parametrize("mode", ["piecewise", "full"])
def test_a_fault_both_copies_share_is_found_by_the_third_copy_and_only_by_it(setup, mode):
    model, provider = setup
    with registry.using(rms_norm="test-shifted"):
        blind = run_case(model, provider, Case("chain", mode), SEQ, reference_every=0)
        seen = run_case(model, provider, Case("chain", mode), SEQ, reference_every=1)
    assert not blind.diverged and blind.steps == len(SEQ.batches())  # eager == replay throughout
    d = seen.divergence
    assert d is not None and d.kind == CORRUPTION and d.departed == "both" and d.step == SEQ.batches()[0].step
    assert "eager and replay agree" in d.reason and "exceeds the bound" in d.reason
    assert "both departed" in d.where() and seen.to_json()["microscope"]["departed"] == "both"


def test_the_eager_copy_departing_is_named(setup):
    model, provider = setup
    seq = default_sequence(seed=2, steps=24)
    batches = seq.batches()
    ls = Lockstep(lambda o: model.copy(o, num_slots=seq.num_slots), provider, "piecewise", Options(),
                  StepShape(max_tokens=seq.max_tokens), reference=ReferenceCopy(independent_copy(model, seq.num_slots, 0), 1))
    captured, div = set(), None
    with registry.using(add_rms_norm="test-eager-only"):
        try:
            for b in batches:
                size = next(s for s in ls.graph.sizes if s >= b.num_tokens) if b.num_tokens <= max(ls.graph.sizes) \
                    else None
                FAULT["on"] = size in captured and len(captured) >= 2  # a step replaying an old capture
                div = ls.step(b)
                if div is not None:
                    break
                captured |= {d.num_tokens for d in ls.graph.captured}
        finally:
            FAULT["on"] = False
    assert div is not None and div.departed == "eager", div.line() if div else None
    assert "agrees with replay" in div.reason


def test_a_failing_step_is_judged_by_the_third_copy_whatever_its_cadence(setup):
    """The cadence thins the search for faults both copies share; a step where the copies differ
    is judged by the third copy anyway, so every failure names the copy that departed."""
    model, provider = setup
    # seed 0 first reaches stale-pad's trigger at step 49 (a padded replay over rows staged before)
    seq = default_sequence(seed=0, steps=60)
    r = run_case(model, provider, Case("chain", "full", ("stale-pad",)), seq, reference_every=1000)
    assert r.detected and r.divergence.step != seq.batches()[0].step  # not a step the cadence picks
    assert r.divergence.departed == "replay" and "agrees with eager" in r.divergence.reason


def test_a_planted_graph_hazard_names_the_replay_copy(setup):
    model, provider = setup
    r = run_case(model, provider, Case("chain", "full", ("stale-pad",)), default_sequence(seed=0, steps=60))
    assert r.detected and r.divergence.departed == "replay" and "agrees with eager" in r.divergence.reason
    assert r.bound_usage and max(r.bound_usage.values()) <= 1  # rounding's use only: the departure is the finding


def test_the_third_copy_owns_its_weights_and_checks_every_step_on_the_cpu_only(setup):
    model, _ = setup
    ref = ReferenceCopy(independent_copy(model, 8, 0), default_every("cpu"))
    assert ref.every == 1 and default_every("cuda") > 1 and not ReferenceCopy(ref.copy, 0).due(0)
    shared = {t.untyped_storage().data_ptr() for t in model.weights.__dict__.values() if isinstance(t, torch.Tensor)}
    own = {t.untyped_storage().data_ptr() for t in ref.copy.submod0.w.__dict__.values() if isinstance(t, torch.Tensor)}
    assert own and not (own & shared)
    assert ref.intact()
    next(t for t in ref.copy.submod0.w.__dict__.values() if isinstance(t, torch.Tensor) and t.is_floating_point()).add_(1)
    assert not ref.intact()


def test_the_cli_sets_the_cadence_and_refuses_it_where_there_is_no_third_copy(tiny_path, tmp_path):
    import json

    from repro.cli.app import main, parser
    assert parser().parse_args(["run"]).reference_every is None
    with pytest.raises(SystemExit):
        parser().parse_args(["run", "--reference-every", "-1"])
    assert main(["run", "--island", "forced_comm", "--tp", "2", "--reference-every", "4"]) == 2
    with registry.using(rms_norm="test-shifted"):
        off = main(["run", "--model", str(tiny_path), "--island", "submod0", "--steps", "6", "--reference-every", "0",
                    "--json", str(tmp_path / "off.json")])
        on = main(["run", "--model", str(tiny_path), "--island", "submod0", "--steps", "6",
                   "--json", str(tmp_path / "on.json")])
    assert (off, on) == (0, 1)  # the shared fault fails the run only with the third copy
    assert json.loads((tmp_path / "on.json").read_text())["results"][0]["microscope"]["departed"] == "both"


WRITE = {"on": False, "once": False}


def weight_writer(x, w, eps):
    """`rms_norm` that, while WRITE is on, adds 1 to its weight in place (once, or at every call)."""
    if WRITE["on"]:
        w.add_(1.0)
        if WRITE["once"]:
            WRITE["on"] = False
    return rms_norm_reference(x, w, eps)


@pytest.mark.parametrize("once", [False, True])
def test_a_weight_change_names_the_op_that_wrote_it_and_is_restored(setup, once):
    model, provider = setup
    if "test-weight-writer" not in registry.providers("rms_norm"):
        registry.register("rms_norm", "test-weight-writer", weight_writer)
    seq = default_sequence(seed=2, steps=10)
    ref = ReferenceCopy(independent_copy(model, seq.num_slots, 0), 1)
    ls = Lockstep(lambda o: model.copy(o, num_slots=seq.num_slots), provider, "piecewise", Options(),
                  StepShape(max_tokens=seq.max_tokens), reference=ref)
    batches = seq.batches()
    div = None
    with registry.using(rms_norm="test-weight-writer"):
        try:
            for i, b in enumerate(batches):
                WRITE.update(on=i == 3, once=once)
                div = ls.step(b)
                if div is not None:
                    break
        finally:
            WRITE["on"] = False
    assert div is not None and div.step == batches[3].step and div.kind == CORRUPTION
    assert div.tensor == "layer.input_layernorm"  # submod0's norm: the first rms_norm of the step
    if once:  # not written again; the ops that can have written it are named
        assert "nothing wrote it again" in div.reason and "hands it to: repro.rms_norm.default (op " in div.reason, \
            div.reason
    else:
        assert "repro.rms_norm.default (op " in div.reason and "wrote" in div.reason, div.reason
    restored = [n for n, t in ls.check.weights.items() if not torch.equal(t, ref.pristine(n))]
    assert restored == [], restored


# ---- a router near-tie is rounding, not corruption (found by the H200 at step 784 with FLA) -------

def _router(lead=1e-3, h=32, experts=6, seed=0):
    """A router whose experts 1 and 2 lead every other; at x[0] = 0.01 expert 2 leads expert 1 by
    `lead` / 100, and at x[0] = -0.01 expert 1 leads by as much: a near-tie for a small `lead`."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(experts, h, generator=g) * 0.01
    w[1] = 1.0 / h
    w[2] = w[1].clone()
    w[2, 0] += lead
    return w


def _inputs(rows=2):
    """The reference copy's router inputs, and an eager copy's that rounded its row 1 otherwise."""
    x = torch.ones(rows, 32)
    x[:, 0] = 0.01
    other = x.clone()
    other[1, 0] = -0.01  # within the inputs' bound (16 bf16 ulps of 1), and expert 1 now leads
    return x, other


def test_a_router_flip_at_a_near_tie_is_excused_and_a_wide_one_is_not():
    from repro.check.oracle import routing_ties
    x, near = _inputs(3)
    w = _router()
    assert set(routing_ties(x, near, w, 1, [1])) == {1}
    assert routing_ties(x, x, _router(lead=10.0), 1, [0, 1, 2]) == {}  # far from a tie: nothing to excuse
    moved = x.clone()
    moved[1, :16] = -1.0  # the router input moved by more than rounding: never excused
    assert routing_ties(x, moved, w, 1, [1]) == {}
    close = x.clone()
    close[1, 5] += 1e-3  # a row that moved (say, by a fault after the MoE) while its router is far from
    assert routing_ties(x, close, _router(lead=10.0), 1, [1]) == {}  # any boundary the input could cross


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 6), seed=st.integers(0, 9999), step=st.sampled_from([0.0, 1e-4, 0.5, 4.0]),
       odd=st.sampled_from(["none", "nan", "inf", "nan-both", "inf-both"]), near=st.booleans())
def test_router_ties_skips_its_rows_only_where_the_summaries_prove_none_is_over(n, seed, step, odd, near):
    """`router_ties` given the pair's `compare.summaries` (what `departed` has read already) answers
    what it answers reading the rows itself: a row is over its bound only where max|d| is, or where a
    value is non-finite on one side (inf facing a finite value is over; NaN never is)."""
    from repro.check.compare import summaries
    from repro.check.oracle import ROUTED, router_ties
    g = torch.Generator().manual_seed(seed)
    ref = {"submod1.hidden": torch.randn(n, 8, generator=g).to(torch.bfloat16),
           "submod1.next_normed": torch.randn(n, 8, generator=g).to(torch.bfloat16),
           "head.token_ids": torch.arange(n)}
    other = {k: v.clone() for k, v in ref.items()}
    r = int(torch.randint(n, (1,), generator=g))
    other["submod1.hidden"][r] += step
    if odd != "none":
        v = float("nan") if odd.startswith("nan") else float("inf")
        other["submod1.next_normed"][r, 1] = v
        if odd.endswith("both"):
            ref["submod1.next_normed"][r, 1] = v
    x_ref, x_other = _inputs(n) if n > 1 else (torch.ones(1, 32), torch.ones(1, 32))
    routing = lambda: (x_ref, x_other, _router(lead=1e-3 if near else 10.0), 1)
    sums = summaries({k: (ref[k], other[k]) for k in ROUTED})
    assert router_ties(ref, other, routing, sums) == router_ties(ref, other, routing)


def test_departed_excuses_the_rows_a_router_tie_explains_and_nothing_else():
    from repro.control.batch import StepBatch
    from repro.check.reference_copy import departed
    w = _router(lead=10.0)  # row 1's flip is within what its input difference explains; row 0 is far from a tie
    x_ref, x_eager = _inputs()
    h = torch.randn(2, 8, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    ref = {"submod1.hidden": h, "head.token_ids": torch.tensor([3, 4])}
    moved = h.clone()
    moved[1] += 2.0  # a whole expert's share on the flipped row, and its canary token changed
    eager = {"submod1.hidden": moved, "head.token_ids": torch.tensor([3, 5])}
    batch = StepBatch([0, 1], [1, 2], [1, 1], [True, True], [7, 8], step=5, live_slots=[1, 2])
    routing = lambda: (x_ref, x_eager, w, 1)
    for equal in (False, True):  # `copies_equal`: the lockstep saw the two copies equal (one judgement)
        who, why, first, ties = departed(batch, ref, eager, dict(eager), routing=routing, copies_equal=equal)
        assert who is None and set(ties) == {1}, why
        who, _, first, ties = departed(batch, ref, eager, dict(eager), copies_equal=equal)  # without the MoE inputs
        assert who == "both" and first.tensor == "hidden" and ties == {}
        worse = {k: v.clone() for k, v in eager.items()}
        worse["submod1.hidden"][0] += 2.0  # row 0 moved too, and its router did not flip
        who, _, first, ties = departed(batch, ref, worse, dict(worse), routing=routing, copies_equal=equal)
        assert who == "both" and first.row == 0 and set(ties) == {1}


def nudged(x, y, w, eps):
    """`add_rms_norm` that rounds otherwise than `reference` by a fixed pattern: +-1 bf16 ulp of the
    row maximum on alternate columns of the normed output (within the oracle's 16-ulp bound)."""
    h, normed = add_rms_norm_reference(x, y, w, eps)
    p = torch.ones(normed.shape[-1], device=normed.device)
    p[1::2] = -1
    step = 2.0 ** -7 * normed.float().abs().amax(-1, keepdim=True)
    return h, (normed.float() + step * p).to(normed.dtype)


def nudged_when_even(x, y, w, eps):
    """Batch-variant: `nudged` at an even row count (the padded sizes), `reference` at an odd one."""
    return (nudged if x.shape[0] % 2 == 0 else add_rms_norm_reference)(x, y, w, eps)


for _name, _fn in (("test-nudged", nudged), ("test-nudged-when-even", nudged_when_even)):
    if _name not in registry.providers("add_rms_norm"):
        registry.register("add_rms_norm", _name, _fn)


def _tied_router_model(tiny_path, provider):
    """The tiny model with a router of near-ties: two groups of three experts whose rows differ by
    a small multiple of `nudged`'s column pattern, so a nudge can move the third-ranked expert in
    or out of the top 2."""
    model = Model(tiny_path, provider.device)
    gate = model.weights.moe.gate
    v = torch.randn(gate.shape[1], generator=torch.Generator().manual_seed(0)) * 0.1
    p = torch.ones(gate.shape[1])
    p[1::2] = -1
    rows = [v, v + 0.002 * p, v + 0.004 * p, -v, -v + 0.002 * p, -v + 0.004 * p]
    rows += [torch.zeros_like(v)] * (gate.shape[0] - len(rows))
    gate.copy_(torch.stack(rows).to(gate.dtype))
    return model


def _lockstep_until_divergence(model, provider, seq, norm_provider: str, reference=None):
    """Piecewise lockstep over `seq` with `add_rms_norm` on `norm_provider`: (first divergence or
    None, the lockstep)."""
    ls = Lockstep(lambda o: model.copy(o, num_slots=seq.num_slots), provider, "piecewise", Options(),
                  StepShape(max_tokens=seq.max_tokens), reference=reference)
    with registry.using(add_rms_norm=norm_provider):
        for b in seq.batches():
            div = ls.step(b)
            if div is not None:
                return div, ls
    return None, ls


def test_router_flips_at_near_ties_in_a_whole_run_are_findings_not_corruption(tiny_path, monkeypatch):
    """Both copies run a provider that rounds otherwise than `reference` (within the bound), and the
    router has near-ties by construction: experts in two groups of three whose rows differ by a
    small multiple of the nudge's column pattern, so the nudge flips the third-ranked expert in and
    out of the top 2 on some tokens. Each flip moves its token's output by a whole expert's share.
    Without the router inputs the third copy calls that shared corruption; with them each is a
    `routing tie` finding and the run is clean."""
    from repro.check.compare import ROUTING_TIE
    provider = make_provider("cpu")
    model = _tied_router_model(tiny_path, provider)
    seq = default_sequence(seed=4, steps=24)

    def run():
        return _lockstep_until_divergence(model, provider, seq, "test-nudged",
                                          ReferenceCopy(independent_copy(model, seq.num_slots, 0), 1))

    div, ls = run()
    assert div is None, div.line()
    # the bound's use, measured: the nudge (one ulp of the row maximum) shows after it, in submod1,
    # within the bound; the GDN state (before the nudge; `torch` vs `reference` there) barely uses it
    u = ls.bound_usage
    assert 0 < u["submod1.hidden"] <= 1 and u["gdn_core.ssm_state"] < 1e-3 * u["submod1.hidden"], u
    tie = ls.kernel_findings[ROUTING_TIE]
    assert tie["count"] >= 1 and "near-tie" in tie["first"].reason and tie["first"].tensor == "hidden"
    monkeypatch.setattr(Lockstep, "_routing", lambda self: None)
    div, _ = run()
    assert div is not None and div.kind == CORRUPTION and div.departed == "both" and div.island == "submod1"


def test_an_expert_flip_between_the_eager_and_the_padded_shape_is_batch_variance(tiny_path, monkeypatch):
    """The two-copy oracle: a kernel that rounds otherwise at the padded row count flips experts at
    the router's near-ties between the exact-shape eager run and the padded replay. Each such step
    is batch variance (the replay equals the padded eager run bit for bit), named as an expert flip;
    without the MoE inputs it would be corruption."""
    from repro.check.compare import BATCH_VARIANCE
    from repro.check.probe import ChainProbe
    provider = make_provider("cpu")
    model = _tied_router_model(tiny_path, provider)
    seq = default_sequence(seed=4, steps=24)

    div, ls = _lockstep_until_divergence(model, provider, seq, "test-nudged-when-even")
    assert div is None, div.line()
    assert ls.kernel_findings[BATCH_VARIANCE]["count"] >= 1
    monkeypatch.setattr(ChainProbe, "routing", lambda self: None)
    div, _ = _lockstep_until_divergence(model, provider, seq, "test-nudged-when-even")
    assert div is not None and div.kind == CORRUPTION and div.island in ("submod1", "head"), div
