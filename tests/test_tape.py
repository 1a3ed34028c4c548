"""The CPU tape reproduces what a device graph freezes: addresses, Python decisions, kernels."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from repro.graphs import CaptureError, TapeProvider
from repro.graphs.pool import Arena


def test_replay_reads_new_values_at_captured_addresses():
    p = TapeProvider()
    x, w = torch.randn(4, 8), torch.randn(8, 8)
    with torch.inference_mode():
        g, out = p.capture(lambda: {"y": (x @ w).relu(), "b": (x @ w).to(torch.bfloat16)}, p.new_pool())
        x.copy_(torch.randn(4, 8))
        g.replay()
        assert torch.equal(out["y"], (x @ w).relu())
        assert torch.equal(out["b"], (x @ w).to(torch.bfloat16))


def test_a_fresh_input_tensor_is_not_seen_by_replay():
    p = TapeProvider()
    x = torch.ones(3)
    holder = {"x": x}
    with torch.inference_mode():
        g, out = p.capture(lambda: holder["x"] * 2, p.new_pool())
        holder["x"] = torch.full((3,), 5.0)  # a new tensor at a new address
        g.replay()
    assert torch.equal(out, torch.full((3,), 2.0))


def test_python_branch_is_frozen_at_capture():
    p = TapeProvider()
    state = {"n": 1}
    x = torch.ones(4)
    with torch.inference_mode():
        g, out = p.capture(lambda: x * state["n"], p.new_pool())
        state["n"] = 3
        g.replay()
    assert torch.equal(out, torch.ones(4))


def test_noop_to_aliases_and_copying_to_does_not():
    p = TapeProvider()
    x = torch.randn(5)
    with torch.inference_mode():
        g, out = p.capture(lambda: (x.to(torch.float32), x.to(torch.float64)), p.new_pool())
        same, copied = out
        assert same.data_ptr() == x.data_ptr()  # the alias check kept it a view
        x.copy_(torch.randn(5))
        g.replay()
    assert torch.equal(copied, x.double())


def test_in_place_mutation_is_replayed():
    p = TapeProvider()
    s = torch.zeros(3)
    with torch.inference_mode():
        g, _ = p.capture(lambda: s.add_(1), p.new_pool())
        g.replay()
        g.replay()
    assert torch.equal(s, torch.full((3,), 3.0))


@pytest.mark.parametrize("fn, op", [(lambda x: x.sum().item(), "item"), (lambda x: x.nonzero(), "nonzero")])
def test_data_dependent_ops_are_refused_at_capture_with_their_name(fn, op):
    p = TapeProvider()
    x = torch.ones(3)
    with pytest.raises(CaptureError, match=op):
        p.capture(lambda: fn(x), p.new_pool())


def test_released_blocks_are_reused_by_a_later_capture():
    p = TapeProvider()
    pool = p.new_pool()
    x = torch.randn(16)
    with torch.inference_mode():
        g1, o1 = p.capture(lambda: x * 2, pool)
        p.release_all_but(g1, [])  # a weak reference: its bytes go back to the pool
        g2, o2 = p.capture(lambda: x + 100, pool)
        assert o2.data_ptr() == o1.data_ptr()
        g1.replay()
        g2.replay()  # writes the bytes graph 1's output still points at
    assert torch.equal(o1, x + 100)


def test_kept_blocks_are_not_reused():
    p = TapeProvider()
    pool = p.new_pool()
    x = torch.randn(16)
    with torch.inference_mode():
        g1, o1 = p.capture(lambda: x * 2, pool)
        p.release_all_but(g1, [o1])
        g2, o2 = p.capture(lambda: x + 100, pool)
        g1.replay()
        g2.replay()
    assert o2.data_ptr() != o1.data_ptr()
    assert torch.equal(o1, x * 2)


def test_arena_first_fit_and_merge():
    a = Arena()
    b1, b2 = a.alloc(100), a.alloc(100)
    a.release(b1)
    a.release(b2)
    assert a.free[0][0][0] == 0  # merged back into one span from the start
    assert a.alloc(200) == b1


# ---- recording below custom ops, refusals, aliasing, the pool -------------------------------------

def test_a_custom_op_is_recorded_as_the_aten_ops_of_its_body():
    p = TapeProvider()
    x, w = torch.randn(3, 16, dtype=torch.bfloat16), torch.ones(16, dtype=torch.bfloat16)
    with torch.inference_mode():
        g, _ = p.capture(lambda: torch.ops.repro.rms_norm(x, w, 1e-6), p.new_pool())
    names = g.kernel_names()
    assert names and all(n.startswith("aten.") for n in names), names


def test_the_islands_direct_op_call_is_taped_as_the_dispatched_op():
    """The islands call `kernels._library.namespace` ops, which skip the dispatcher only when no mode
    is on: under the tape's capture (a dispatch mode) they record the kernels `torch.ops.repro`
    records, and a replay computes what the dispatched op computes."""
    from kernels._library import namespace
    from repro.islands.base import ops
    assert ops is namespace
    p = TapeProvider()
    x, w = torch.randn(3, 16, dtype=torch.bfloat16), torch.randn(16, dtype=torch.bfloat16)
    with torch.inference_mode():
        g1, o1 = p.capture(lambda: ops.add_rms_norm(x, x, w, 1e-6), p.new_pool())
        g2, o2 = p.capture(lambda: torch.ops.repro.add_rms_norm(x, x, w, 1e-6), p.new_pool())
        assert g1.kernel_names() == g2.kernel_names() and g1.kernel_names()
        x.copy_(torch.randn(3, 16, dtype=torch.bfloat16))
        g1.replay()
        g2.replay()
        want = torch.ops.repro.add_rms_norm(x, x, w, 1e-6)
    assert all(torch.equal(a, b) and torch.equal(a, c) for a, b, c in zip(o1, o2, want))


def test_a_refusal_reads_like_a_cuda_capture_failure():
    from repro.graphs.refusals import SYNC_PHRASE, capture_refusal
    p = TapeProvider()
    x = torch.ones(3)
    with pytest.raises(RuntimeError, match=SYNC_PHRASE) as e:
        p.capture(lambda: x.sum().item(), p.new_pool())
    assert isinstance(e.value, CaptureError) and capture_refusal(e.value) == "sync"


def test_host_methods_are_restored_after_a_capture_and_allowed_in_escape():
    p = TapeProvider()
    x = torch.arange(3.0)
    seen = {}

    def fn():
        with p.escape():  # a queue the capture does not follow may talk to the host
            seen["host"] = x.tolist()
        return x + 1
    with torch.inference_mode():
        p.capture(fn, p.new_pool())
    with pytest.raises(CaptureError):
        p.capture(lambda: x.tolist(), p.new_pool())
    assert seen["host"] == [0.0, 1.0, 2.0] and x.tolist() == [0.0, 1.0, 2.0] and x.cpu() is x


def test_only_new_allocations_go_to_the_arena():
    p = TapeProvider()
    pool = p.new_pool()
    x = torch.randn(8, 8)
    with torch.inference_mode():
        g, (view, new) = p.capture(lambda: (x[2:], x @ x), pool)
    seg = pool.segments[0]
    inside = lambda t: seg.data_ptr() <= t.data_ptr() < seg.data_ptr() + seg.numel()
    assert view.data_ptr() == x[2:].data_ptr() and not inside(view)
    assert inside(new) and len(g.blocks) == 1


_lib = torch.library.Library("repro_tape_leaf", "DEF")
_lib.define("into_ws(Tensor x) -> Tensor")
_WS = torch.zeros(16)


def _into_ws(x):
    _WS[: x.numel()].copy_(x * 3)  # below the tape: a kernel writing its own workspace
    return _WS[: x.numel()]


_lib.impl("into_ws", _into_ws, "CompositeExplicitAutograd")


def test_a_kernel_returning_its_workspace_is_not_copied_into_the_pool_and_reruns():
    """An op the tape cannot see into (not a Python custom_op) returns a view of memory it keeps:
    the storage has owners besides the result, so it is a workspace, not a new allocation."""
    p = TapeProvider()
    x = torch.ones(4)
    with torch.inference_mode():
        g, out = p.capture(lambda: torch.ops.repro_tape_leaf.into_ws(x), p.new_pool())
        assert out.data_ptr() == _WS.data_ptr() and not g.blocks
        x.fill_(2.0)
        g.replay()
    assert torch.equal(out, torch.full((4,), 6.0))


def test_a_pool_block_is_its_own_storage_and_outlives_its_arena():
    import gc
    a = Arena()
    t, block = a.empty_like_strided((4, 4), (4, 1), torch.float32)
    assert t.untyped_storage().nbytes() == a.live[block] and t.untyped_storage().nbytes() < a.segments[0].numel()
    t.fill_(1.5)
    del a
    gc.collect()
    assert torch.equal(t, torch.full((4, 4), 1.5))


def test_written_spans_keep_the_size_a_block_had_when_taken():
    p = TapeProvider()
    pool = p.new_pool()
    x = torch.randn(16)
    with torch.inference_mode():
        g1, o1 = p.capture(lambda: x * 2, pool)
        (a, b), = p.written_spans(g1)
        p.release_all_but(g1, [])
        g2, o2 = p.capture(lambda: torch.cat([x, x, x, x, x]), pool)  # same offset, larger block
    assert o2.data_ptr() == o1.data_ptr() and p.written_spans(g1) == [(a, b)]


_leaf = st.sampled_from(["t", "n", "i", "f"])
_arg = st.recursive(_leaf, lambda inner: st.lists(inner, max_size=3) | st.tuples(inner, inner)
                    | st.dictionaries(st.sampled_from("ab"), inner, max_size=2), max_leaves=8)


def _build(tree):
    """A sampled shape of an op argument, with real tensors at its "t" leaves."""
    if isinstance(tree, str):
        return {"t": lambda: torch.zeros(1), "n": lambda: None, "i": lambda: 3, "f": lambda: 0.5}[tree]()
    if isinstance(tree, dict):
        return {k: _build(v) for k, v in tree.items()}
    return type(tree)(_build(v) for v in tree)


@settings(max_examples=200, deadline=None)
@given(st.lists(_arg, max_size=4), st.dictionaries(st.sampled_from(["out", "indices", "dim"]), _arg, max_size=2))
def test_the_tapes_argument_walk_finds_the_tensors_pytree_finds(args, kwargs):
    # The recorder walks an op's arguments one list level deep (as aten schemas nest) and hands
    # anything deeper to pytree; either way the same tensor objects, in the same order.
    from torch.utils._pytree import tree_flatten

    from repro.graphs.tape import _arg_tensors, _flatten, _unflatten
    a, kw = tuple(_build(x) for x in args), {k: _build(v) for k, v in kwargs.items()}
    want = [t for t in tree_flatten((a, kw))[0] if isinstance(t, torch.Tensor)]
    got = _arg_tensors(a, kw)
    assert len(got) == len(want) and all(x is y for x, y in zip(got, want))
    # results: flattened and rebuilt to the same structure, the same leaves
    flat, spec = _flatten(a)
    assert [id(x) for x in flat] == [id(x) for x in tree_flatten(a)[0]]
    rebuilt = _unflatten(list(flat), spec)
    assert type(rebuilt) is type(a) and tree_flatten(rebuilt)[1] == tree_flatten(a)[1]
