"""The lockstep's comparison on hand-made tensors: NaN in both copies is equal, a one-sided
non-finite value diverges and says which copy holds it, the first row and its owner are named."""
from types import SimpleNamespace

import torch
from hypothesis import given, settings, strategies as st

from repro.control.batch import StepBatch
from repro.check.compare import compare_step, max_abs, nonfinite_side, same

NAN, INF = float("nan"), float("inf")
# three requests: a decode in slot 3, a 2-token prefill in slot 5, a decode in slot 1
BATCH = StepBatch([7, 8, 9], [3, 5, 1], [1, 2, 1], [True, False, True], [11, 12, 13, 14], step=4, live_slots=[1, 3, 5])


def copy(ssm=None):
    cache = torch.zeros(6, 2) if ssm is None else ssm
    return SimpleNamespace(cache=SimpleNamespace(tensors=lambda: {"ssm_state": cache}))


def out(x):
    return {"submod0.qkv": x, "head.token_ids": torch.tensor([1, 2, 3, 4])}


def test_identical_nan_and_inf_are_equal():
    a = torch.tensor([[1.0, NAN], [INF, -INF], [0.0, 2.0], [3.0, 4.0]])
    assert same(a, a.clone())
    assert compare_step(BATCH, out(a), out(a.clone()), copy(), copy()) is None


def test_one_sided_nan_is_a_nonfinite_divergence_not_infinite_difference():
    a = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0], [7.0, 8.0]])
    b = a.clone()
    b[2, 1] = NAN
    b[3, 0] = 7.5
    d = compare_step(BATCH, out(a), out(b), copy(), copy())
    assert d is not None and d.nonfinite == "replay"
    assert d.row == 2 and (d.request, d.slot) == (8, 5)  # token row 2 is the prefill's second token
    assert d.max_abs == 0.5  # over values finite in both copies
    assert "non-finite in replay only" in d.line() and "inf" not in d.line()
    assert nonfinite_side(b, a) == "eager"
    c = a.clone()
    c[0, 0] = INF
    assert nonfinite_side(c, b) == "both"


def test_first_row_owner_and_dtype_mismatch():
    a = torch.arange(8.0).reshape(4, 2)
    b = a.clone()
    b[3, 1] += 1
    d = compare_step(BATCH, out(a), out(b), copy(), copy())
    assert (d.island, d.tensor, d.row, d.request, d.slot, d.max_abs) == ("submod0", "qkv", 3, 9, 1, 1.0)
    assert d.nonfinite is None and "max|diff| 1" in d.line()
    assert not same(a, a.to(torch.float64))


def test_state_slot_divergence_names_slot_and_request():
    a, b = torch.zeros(6, 2), torch.zeros(6, 2)
    b[5, 0] = NAN
    d = compare_step(BATCH, out(torch.zeros(4, 2)), out(torch.zeros(4, 2)), copy(a), copy(b))
    assert (d.tensor, d.slot, d.request, d.row, d.nonfinite) == ("ssm_state", 5, 8, None, "replay")
    a[5, 0] = NAN  # the same NaN in both copies: equal
    assert compare_step(BATCH, out(torch.zeros(4, 2)), out(torch.zeros(4, 2)), copy(a), copy(b)) is None


def test_integer_difference_is_exact():
    assert max_abs(torch.tensor([1, 5]), torch.tensor([1, 2])) == 3.0


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 40), seed=st.integers(0, 9999), equal=st.booleans(),
       dtypes=st.lists(st.sampled_from([torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64,
                                        torch.bool]), min_size=3, max_size=3),
       odd=st.sampled_from(["none", "nan", "inf", "both", "b-only", "shared", "shape", "subnormal", "zero-sign",
                            "huge"]),
       stacked=st.booleans())
def test_summaries_are_the_per_tensor_functions_read_together(device, n, seed, equal, dtypes, odd, stacked):
    """`compare.summaries` (what `oracle.corruption` reads in one or two transfers) gives, pair by
    pair, what `same`, `nonfinite_side`, `max_abs` and `magnitude` give one read at a time, NaN and
    inf on either side, empty tensors, integers, fp64 beside the pairs it runs together, mismatched
    shapes, subnormals one step apart, +0.0 facing -0.0 and differences that overflow included; on
    the suite's device (the stacked read is what a GPU runs)."""
    from repro.check.compare import magnitude, max_abs, nonfinite_side, same, summaries
    g = torch.Generator().manual_seed(seed)
    pairs = {}
    for k in range(3):
        dtype = dtypes[k]
        a = (torch.randn(n, 3, generator=g) * 4).to(dtype)
        b = a.clone() if equal and k != 1 else (torch.randn(n, 3, generator=g) * 4).to(dtype)
        if a.is_floating_point() and n and odd in ("subnormal", "zero-sign", "huge"):
            i = int(torch.randint(n, (1,), generator=g))
            tiny = torch.finfo(dtype).smallest_normal * 2.0 ** -3  # subnormal in every float dtype here
            x, y = {"subnormal": (tiny, 2 * tiny), "zero-sign": (0.0, -0.0),
                    "huge": (torch.finfo(dtype).max, -torch.finfo(dtype).max)}[odd]
            a[i, 0], b[i, 0] = x, y
        if a.is_floating_point() and n and odd in ("nan", "inf", "both"):
            i = int(torch.randint(n, (1,), generator=g))
            a[i, 0] = float("nan") if odd != "inf" else float("inf")
            (b if odd == "both" else a)[i, 1] = float("-inf")
        if a.is_floating_point() and n and odd == "b-only":  # the second copy alone non-finite
            b[int(torch.randint(n, (1,), generator=g)), 2] = float("nan")
        if a.is_floating_point() and n and odd == "shared":  # the same NaN and inf in both: not a side
            i = int(torch.randint(n, (1,), generator=g))
            a[i, :2] = b[i, :2] = torch.tensor([float("nan"), float("inf")])
        if odd == "shape" and k == 2:
            b = b[:-1] if n else b.reshape(0)
        pairs[f"t{k}"] = (a.to(device), b.to(device))
    got = summaries(pairs, stacked)  # both ways of reading `same`: one vector (a GPU), pair by pair (the CPU)
    names = ("reference", "eager")
    for k, (a, b) in pairs.items():
        s = got[k]
        assert s.same == same(a, b), k
        if s.same or not s.floating:
            continue
        assert (s.side(names), s.max_abs, s.magnitude) == (nonfinite_side(a, b, names), max_abs(a, b), magnitude(a)), k
