"""The CPU tape reproduces what a device graph freezes: addresses, Python decisions, kernels."""
import pytest
import torch

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
