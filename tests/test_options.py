"""The hazard table flips typed options; the capture primitive and the runner read them.

Unit tests of the pieces the end-to-end hazard tests compose: each knob changes exactly the
option it declares, the capture primitive pads, captures once per size and holds its outputs
as asked, and the runner's pad policy is the one the options name.
"""
from dataclasses import fields

import pytest
import torch

from repro.knobs import hazards as hz
from repro.control.batch import StepBatch
from repro.capture.piece import IslandRunner, Piece
from repro.control.dispatch import pad_size
from repro.graphs import make_provider
from repro.islands import Model
from repro.knobs.options import CommOptions, IslandOptions, Options, Pad, RunnerOptions
from repro.capture.runner import GraphRunner
from repro.control.shape import StepShape


def _changed(opts: Options) -> set[str]:
    """The option paths where `opts` differs from the defaults."""
    base, out = Options(), set()
    for part in ("eager_island", "replay_island", "runner", "comm", "control"):
        a, b = getattr(base, part), getattr(opts, part)
        out |= {f"{part}.{f.name}" for f in fields(a) if getattr(a, f.name) != getattr(b, f.name)}
    if opts.kernel_sentinel is not None:
        out.add("kernel_sentinel")
    return out


@pytest.mark.parametrize("name", list(hz.HAZARDS))
def test_every_hazard_flips_the_options_its_row_declares_and_nothing_else(name):
    h = hz.HAZARDS[name]
    changed = _changed(hz.options_for([name]))
    want = set()
    for key in h.sets:
        part, _, field = key.partition(".")
        if part == "island":
            want |= {f"replay_island.{field}"} | (set() if h.replay_only else {f"eager_island.{field}"})
        else:
            want.add(key if part == "kernel_sentinel" else f"{part}.{field}")
    assert changed == want and changed


@pytest.mark.parametrize("name", [h for h in hz.HAZARDS if hz.HAZARDS[h].repairs])
def test_each_repair_undoes_or_outweighs_its_hazard(name):
    """A repair sets options of its own; applied after the hazard it wins where both set one."""
    for r in hz.HAZARDS[name].repairs:
        opts = hz.options_for([name], [r])
        for key, value in hz.REPAIRS[r].sets.items():
            part, _, field = key.partition(".")
            obj = opts.replay_island if part == "island" else getattr(opts, part)
            got = getattr(obj, field)
            assert got == value or (isinstance(got, frozenset) and set(value) <= got), (r, key)


def test_replay_only_hazards_leave_the_eager_copy_as_the_reference():
    opts = hz.options_for(["output-alias"])
    assert opts.eager_island == IslandOptions() and opts.replay_island.reinplace_residual


def test_expectations_come_from_the_table():
    assert hz.expectation([], []) == "clean"
    assert hz.expectation(["stale-pad"], []) == "diverged"
    assert hz.expectation(["stale-pad"], ["sanitize-pad"]) == "clean"
    assert hz.expectation(["undeclared-mutation"], []) == "finding"
    assert hz.expectation(["comm-graph-then-eager"], []) == "clean"  # a probe: healthy stacks stay clean


def test_comm_mode_follows_the_comm_options():
    assert CommOptions().mode == "in-graph"
    assert hz.options_for(["comm-noop-capture"]).comm.mode == "noop-capture"
    assert hz.options_for(["comm-noop-capture"], ["eager-family=comm"]).comm.mode == "eager-split"
    assert hz.options_for(["allreduce-no-clone"], ["clone-input"]).comm.mode == "registered"
    with pytest.raises(hz.Refused):
        hz.check_comm(["stale-pad"], [])


def test_help_lists_every_hazard_and_repair_once():
    from repro.cli.parser import knobs_help
    lines = knobs_help().splitlines()
    for name in list(hz.HAZARDS) + list(hz.REPAIRS):
        assert sum(line.split()[:1] == [name] for line in lines) == 1, name


# ---- the capture primitive ------------------------------------------------------------------

def test_pad_size_is_the_smallest_capture_size_that_fits():
    assert [pad_size(n, (1, 2, 4, 8)) for n in (1, 2, 3, 5, 8, 9)] == [1, 2, 4, 8, 8, None]


def test_island_runner_pads_with_zeros_captures_once_per_size_and_replays_what_eager_gives():
    provider = make_provider("cpu")
    calls = []
    table = torch.arange(32, dtype=torch.float32) * 0.5

    def body(ids):
        calls.append(int(ids.shape[0]))
        return {"out": table[ids] * 2 + 1}

    r = IslandRunner(body, provider, sizes=(2, 4), max_tokens=8)
    for tokens in ([3], [5, 7, 9], [1, 2, 3], [4, 4], list(range(6))):
        out, n = r.run(tokens)
        ids = torch.tensor(tokens)
        assert n == len(tokens) and torch.equal(out["out"][:n], table[ids] * 2 + 1)
        size = pad_size(n, (2, 4))
        if size is not None:
            assert torch.equal(out["out"][n:size], torch.full((size - n,), 1.0))  # zero-padded token ids
    assert r.captures == 2 and r.replays == 4  # sizes 2 and 4 once each; 6 tokens ran eagerly
    assert calls.count(6) == 1


def test_a_weakly_held_output_is_overwritten_by_the_next_capture_into_the_same_pool():
    """The mechanism of shared-pool-weakref: weak outputs give their bytes back to the pool."""
    provider = make_provider("cpu")
    pool = provider.new_pool("shared")
    x = torch.ones(64)
    for weak, overwritten in ((False, False), (True, True)):
        first = Piece(provider, pool, weak=weak).capture(lambda: {"y": x * 3})
        first.replay()
        held = first.outputs["y"].clone()
        Piece(provider, pool).capture(lambda: {"z": x * 5})
        assert (not torch.equal(first.outputs["y"], held)) == overwritten


# ---- the runner reads options ----------------------------------------------------------------

@pytest.fixture(scope="module")
def model(tiny_path):
    return Model(tiny_path, "cpu")


@pytest.mark.parametrize("pad, want", [(Pad.SENTINEL, [0, 0]), (Pad.OTHER, [-1, -1]), (Pad.STALE, [3, 4])])
def test_pad_rows_carry_what_the_pad_option_names(model, pad, want):
    """Two decode steps through the FULL graph of size 4: the second's padded rows of the builder's
    staged state indices (what the replay reads) hold what the pad option names."""
    runner = GraphRunner(model.copy(num_slots=4), make_provider("cpu"), mode="full",
                         shape=StepShape(max_num_seqs=4, sizes=(4,)), opts=RunnerOptions(pad=pad))
    step = lambda slots: StepBatch(list(range(len(slots))), slots, [1] * len(slots), [True] * len(slots),
                                   [5] * len(slots), live_slots=slots)
    for b in (step([1, 2, 3, 4]), step([1, 2])):
        runner.step(b)
    assert runner.last[1].num_reqs == 4
    assert runner.path.builder.non_spec_state_indices[2:4].tolist() == want
    assert runner.pad_state_indices(step([1, 2])) == want


def test_a_refused_device_capture_gives_the_stream_back():
    """torch's graph context exits its stream only after `capture_end` succeeds; the provider must
    restore it itself, or one refused capture would put every later kernel on the capture stream."""
    from repro.graphs.device import DeviceGraphProvider

    events = []

    class StreamCtx:
        def __exit__(self, *a):
            events.append("stream restored")

    class RefusingGraphCtx:  # what torch.cuda.graph does when the runtime invalidated the capture
        def __init__(self, graph, **kw):
            self.stream_ctx = StreamCtx()

        def __enter__(self):
            events.append("capture begun")

        def __exit__(self, *a):
            raise RuntimeError("operation failed due to a previous error during capture")

    p = DeviceGraphProvider("cuda", torch.device("cpu"), object, RefusingGraphCtx, lambda: None, torch.cuda)
    with pytest.raises(RuntimeError, match="host sync"):
        p.capture(lambda: (_ for _ in ()).throw(RuntimeError("host sync")), None)
    with pytest.raises(RuntimeError, match="previous error"):
        p.capture(lambda: {}, None)
    assert events == ["capture begun", "stream restored"] * 2
