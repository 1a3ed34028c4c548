"""W8A8 linear: the quantisation rule on hand-made values, exact integer reference, torch == reference."""
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

from kernels import registry
from kernels.ops import linear, quantize_per_token, quantize_with_scale, w8a8_linear
from kernels.w8a8_linear.reference import int8_matmul_exact, w8a8_linear_reference
from kernels.w8a8_linear.torch_int_mm import int8_matmul_int_mm, w8a8_linear_int_mm
from repro.model.weights import Linear

bf16 = torch.bfloat16


def test_scale_is_amax_over_127_and_rounding_is_half_even():
    x = torch.tensor([[127.0, 2.5, -2.5, 3.5, 0.5, -0.5, 1.5, -126.5],
                      [3.0, -1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
                      [0.0] * 8], dtype=bf16)
    q, scale = quantize_per_token(x)
    assert scale.dtype == torch.float32 and q.dtype == torch.int8
    assert scale[0].item() == 1.0                                    # 127 / 127
    assert q[0].tolist() == [127, 2, -2, 4, 0, 0, 2, -126]           # ties to even
    assert scale[1] == torch.tensor(3.0) / 127                       # fp32 amax / 127
    assert q[1, :2].tolist() == [127, -42]                           # -1 / (3/127) = -42.33
    assert scale[2].item() == 1.0 and q[2].eq(0).all()               # zero row: scale 1, q 0


def test_saturation_and_minus_128():
    x = torch.tensor([[200.0, -300.0, 127.5, -128.5, -127.5, 126.5]])
    q = quantize_with_scale(x, torch.tensor([1.0]))
    assert q[0].tolist() == [127, -128, 127, -128, -128, 126]


def test_zero_row_gives_exact_zero_plus_bias():
    x = torch.zeros(2, 16, dtype=bf16)
    w = torch.randint(-128, 128, (8, 16), dtype=torch.int8)
    bias = torch.randn(8).to(bf16)
    for fn in (w8a8_linear_reference, w8a8_linear_int_mm):
        assert torch.equal(fn(x, w, torch.rand(8), bias), bias.expand(2, 8))


def test_reference_accumulator_is_exact_beyond_fp32():
    g = torch.Generator().manual_seed(0)
    K = 3 * 1024 + 5                                                 # several blocks, sums > 2**24
    a = torch.randint(-128, 128, (5, K), generator=g, dtype=torch.int8)
    b = torch.randint(-128, 128, (7, K), generator=g, dtype=torch.int8)
    a[0] = -128
    b[0] = -128                                                      # acc[0, 0] = K * 2**14 > 2**24
    expect = (a.long() @ b.long().t()).to(torch.int32)
    assert expect[0, 0].item() == K << 14
    assert torch.equal(int8_matmul_exact(a, b), expect)
    assert torch.equal(int8_matmul_int_mm(a, b), expect)
    # batched ([G, M, K] x [G, N, K], as the third copy's MoE groups its experts): the same integers
    b2 = torch.stack([b, b.flip(0)])
    assert torch.equal(int8_matmul_exact(torch.stack([a, a]), b2), torch.stack([expect, expect.flip(1)]))


def test_epilogue_order_is_the_documented_one():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4, 32, generator=g).to(bf16)
    w = torch.randint(-128, 128, (16, 32), generator=g, dtype=torch.int8)
    ws, bias = torch.rand(16, generator=g) / 50, torch.randn(16, generator=g).to(bf16)
    q, xs = quantize_per_token(x)
    acc = q.long() @ w.long().t()
    expect = ((acc.float() * xs[:, None]) * ws[None, :] + bias.float()).to(bf16)
    assert torch.equal(w8a8_linear_reference(x, w, ws, bias), expect)


@settings(max_examples=40, deadline=None)
@given(M=st.integers(1, 40), K=st.integers(1, 80), N=st.integers(1, 40), bias=st.booleans(),
       zero_rows=st.integers(0, 2), seed=st.integers(0, 2**16), mag=st.sampled_from([1e-3, 1.0, 300.0]))
def test_torch_provider_equals_reference_exactly(M, K, N, bias, zero_rows, seed, mag):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(M, K, generator=g) * mag).to(bf16)
    x[:min(zero_rows, M)] = 0
    w = torch.randint(-128, 128, (N, K), generator=g, dtype=torch.int8)
    ws = torch.rand(N, generator=g) / 100 + 1e-5
    b = torch.randn(N, generator=g).to(bf16) if bias else None
    outs = {}
    for provider in ("reference", "torch"):
        with registry.using(w8a8_linear=provider):
            outs[provider] = w8a8_linear(x, w, ws, b)
    assert outs["torch"].dtype == bf16 and outs["torch"].shape == (M, N)
    assert torch.equal(outs["torch"], outs["reference"])


def test_linear_helper_quantized_and_bf16():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, 3, 32, generator=g).to(bf16)
    w8 = torch.randint(-128, 128, (24, 32), generator=g, dtype=torch.int8)
    scale = torch.rand(24, generator=g) / 100
    y = linear(x, Linear(w8, scale))
    assert y.shape == (2, 3, 24)
    assert torch.equal(y, w8a8_linear(x.reshape(6, 32), w8, scale).reshape(2, 3, 24))
    wb = torch.randn(24, 32, generator=g).to(bf16)
    assert torch.equal(linear(x, Linear(wb)), F.linear(x, wb))


def test_bad_shapes_raise():
    with pytest.raises(ValueError):
        w8a8_linear(torch.zeros(2, 8, dtype=bf16), torch.zeros(4, 9, dtype=torch.int8), torch.ones(4))
