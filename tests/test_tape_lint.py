"""The lint is complete: whole storages, keyword arguments, any call, a schedule."""
from __future__ import annotations

import pytest
import torch

from repro.graphs.lint import Lint, LintSchedule, lint_call
from repro.control.shape import StepShape

NEIGHBOUR = torch.library.Library("repro_lint_test", "DEF")
NEIGHBOUR.define("spill(Tensor x) -> Tensor")                   # declares no write
NEIGHBOUR.define("spill_into(Tensor(a!) out, Tensor x) -> ()")  # declares a write to `out` only
NEIGHBOUR.define("scale_kw(Tensor x, *, Tensor(a!) acc, Tensor w) -> ()")
NEIGHBOUR.define("clean(Tensor x, *, Tensor w) -> Tensor")


def _spill(x):
    """Reads its view, writes one element past it: into whatever shares the allocation."""
    s = x.untyped_storage()
    whole = torch.empty(0, dtype=x.dtype).set_(s, 0, (s.nbytes() // x.element_size(),), (1,))
    whole[x.storage_offset() + x.numel()] = -1.0
    return x * 2


def _spill_into(out, x):
    out.copy_(x)
    s = out.untyped_storage()
    whole = torch.empty(0, dtype=out.dtype).set_(s, 0, (s.nbytes() // out.element_size(),), (1,))
    whole[out.storage_offset() + out.numel()] = -1.0  # past the declared view


def _scale_kw(x, *, acc, w):
    acc.add_(x)
    w.mul_(2)  # a keyword argument its schema does not mark as written


def _clean(x, *, w):
    return x * w


for _name, _fn in (("spill", _spill), ("spill_into", _spill_into), ("scale_kw", _scale_kw), ("clean", _clean)):
    NEIGHBOUR.impl(_name, _fn, "CompositeExplicitAutograd")
ops = torch.ops.repro_lint_test


def _kinds(problems):
    return [k for k, _ in problems]


def test_a_write_through_an_arguments_storage_outside_its_view_is_reported():
    buf = torch.zeros(16)
    x, neighbour = buf[:8], buf[8:]  # two buffers sliced from one allocation
    _, problems = lint_call("piece", {}, lambda: ops.spill(x))
    assert neighbour[0] == -1.0  # the fault happened
    assert _kinds(problems) == ["undeclared-mutation"], problems
    assert "outside its view" in problems[0][1] and "`x`" in problems[0][1] and "bytes [34, 36)" in problems[0][1]  # -1.0


def test_a_declared_write_that_spills_past_its_view_is_reported():
    buf, x = torch.zeros(16), torch.ones(8)
    _, problems = lint_call("piece", {"buf": buf}, lambda: ops.spill_into(buf[:8], x))
    assert _kinds(problems) == ["undeclared-mutation"], problems
    assert "`out`" in problems[0][1] and "outside its view" in problems[0][1]


def test_a_mutated_keyword_argument_is_reported():
    x, acc, w = torch.ones(4), torch.zeros(4), torch.ones(4)
    _, problems = lint_call("piece", {"acc": acc}, lambda: ops.scale_kw(x, acc=acc, w=w))
    assert problems == [("undeclared-mutation", "repro_lint_test.scale_kw.default changes `w` but its schema "
                         "does not declare it mutated (torch.library.opcheck reports this)")]


def test_a_written_keyword_argument_the_island_does_not_own_is_reported():
    x, acc, w = torch.ones(4), torch.zeros(4), torch.ones(4)
    _, problems = lint_call("piece", {}, lambda: ops.scale_kw(x, acc=acc, w=w))
    assert ("mutates-input" in _kinds(problems)) and any("`acc`" in d for _, d in problems), problems


def test_clean_ops_and_declared_writes_report_nothing():
    buf = torch.zeros(16)
    x = torch.ones(8)
    _, problems = lint_call("piece", {"buf": buf}, lambda: (ops.clean(buf[:8], w=x), buf[8:].add_(1)))
    assert problems == []
    other = torch.zeros(16)[:8]  # not the island's: made outside the call, not declared
    _, problems = lint_call("piece", {}, lambda: ops.spill_into(other, x))
    assert _kinds(problems) == ["mutates-input", "undeclared-mutation"], problems  # owner and spill


def test_lint_can_wrap_any_call_and_accumulates():
    lint = Lint("piece", {})
    buf = torch.zeros(16)
    with lint:
        ops.spill(buf[:4])
    with lint:
        ops.spill(buf[4:8])
    assert len(lint.problems) == 2


@pytest.mark.parametrize("every, due", [(0, [True, False, False, False, True]),
                                        (2, [True, False, True, False, True])])
def test_schedule_first_calls_then_every_n_steps(every, due):
    s = LintSchedule(every)
    calls = [(("p", 8), 1), (("p", 8), 3), (("p", 8), 4), (("p", 8), 5), (("p", 16), 5)]
    assert [s.due(k, step) for k, step in calls] == due


def test_schedule_rejects_a_negative_period():
    with pytest.raises(ValueError):
        LintSchedule(-1)


# ---- the schedule in the runner -------------------------------------------------------------

LATE = {"calls": 0, "from": 10**9}


def _late_writer(q, k, v, g, beta, ssm_state, state_indices, sentinel):
    """The reference decode, which from call LATE["from"] on also writes into `q` (not declared)."""
    from kernels.gdn.reference import gated_delta_rule_decode_reference
    LATE["calls"] += 1
    out = gated_delta_rule_decode_reference(q, k, v, g, beta, ssm_state, state_indices, sentinel)
    if LATE["calls"] >= LATE["from"]:
        q[(0,) * q.dim()] += 1
    return out


@pytest.mark.parametrize("every, seen", [(0, False), (3, True)])
def test_the_splitting_op_is_linted_on_a_schedule_not_only_at_first_calls(tiny_path, every, seen):
    from dataclasses import replace

    from kernels import registry
    from repro.graphs import make_provider
    from repro.islands import Model
    from repro.job.cases import default_sequence
    from repro.lockstep import Lockstep
    from repro.knobs.options import Options, RunnerOptions
    if "test-late-writer" not in registry.providers("gated_delta_rule_decode"):
        registry.register("gated_delta_rule_decode", "test-late-writer", _late_writer)
    provider = make_provider("cpu")
    model = Model(tiny_path, provider.device)
    seq = default_sequence(seed=1, steps=14)
    opts = Options(runner=replace(RunnerOptions(), lint_every=every))
    ls = Lockstep(lambda o: model.copy(o, num_slots=seq.num_slots), provider, "piecewise", opts,
                  StepShape(max_tokens=seq.max_tokens))
    LATE.update(calls=0, **{"from": 12})  # past every op kind's first call: the first-call lint saw it clean
    try:
        with registry.using(gated_delta_rule_decode="test-late-writer"):
            for b in seq.batches():
                ls.step(b)
    finally:
        LATE["from"] = 10**9
    assert LATE["calls"] > 12
    found = [f for f in ls.graph.findings if f.kind == "undeclared-mutation" and "`q`" in f.detail]
    assert bool(found) is seen, [f.detail for f in ls.graph.findings]
