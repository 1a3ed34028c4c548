"""`kernels._math.tree_sum`: the order of its additions is fixed by the length alone (pairwise
halving over the length padded to a power of two with zeros), so a row sums to the same bits in any
batch and on any device; the reference kernels' batch invariance rests on it."""
import numpy as np
import torch
from hypothesis import given, settings, strategies as st

from kernels._math import tree_sum


def halving(v: np.ndarray) -> np.float32:
    """The documented order, written out in numpy float32: pad with zeros to a power of two, then
    x[:h] + x[h:] until one value is left."""
    n = len(v)
    p = 1 << max(n - 1, 0).bit_length()
    x = np.concatenate([v.astype(np.float32), np.zeros(p - n, np.float32)])
    while len(x) > 1:
        h = len(x) // 2
        x = (x[:h] + x[h:]).astype(np.float32)
    return x[0]


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 70), rows=st.integers(1, 5), seed=st.integers(0, 9999), dim=st.sampled_from([0, 1, -1]),
       keepdim=st.booleans())
def test_tree_sum_adds_in_the_documented_order_whatever_the_batch(device, n, rows, seed, dim, keepdim):
    g = torch.Generator().manual_seed(seed)
    # magnitudes 1e-3..1e8 mixed, so another order of additions rounds otherwise
    x = torch.randn(rows, n, generator=g) * 10.0 ** torch.randint(-3, 9, (rows, n), generator=g).float()
    x = x.to(device)
    t = x if dim in (1, -1) else x.t()  # the summed dim holds the n values
    got = tree_sum(t, dim, keepdim=keepdim)
    assert got.shape == (t.sum(dim, keepdim=keepdim)).shape
    got = got.reshape(rows).cpu()
    want = torch.tensor([halving(r) for r in x.cpu().numpy()])
    assert torch.equal(got, want)
    for r in range(rows):  # one row alone: the same bits as in the batch
        alone = tree_sum(x[r:r + 1], -1).cpu()
        assert torch.equal(alone, got[r:r + 1])


def test_tree_sum_of_nothing_is_zero(device):
    assert torch.equal(tree_sum(torch.zeros(3, 0, device=device), -1).cpu(), torch.zeros(3))
