"""FLA fused_recurrent_gated_delta_rule, varlen decode: is the nondeterminism FLA's, or our call's?

Imports only torch and fla. One GPU run; prints figures, asserts nothing.

Hypothesis H1 (ours): fla-core 0.6.0's signature is (q, k, v, g, gk, gv, beta, scale, ...), so a
  call `fr(q, k, v, g, beta, ...)` passes beta as `gk`, a per-key log-decay the kernel reads as
  [B, T, HV, K]: 128x past the end of a [1, B, HV] tensor, and beta defaults to ones.
  Predicts: A) positional calls vary with what lies after beta's storage; B) a positional call with
  a controlled tail equals, bit for bit, a keyword call gk=<beta followed by that tail>, beta=None;
  C) the keyword call is deterministic, insensitive to freed memory and matches an fp32 reference.
Hypothesis H2 (FLA/Triton): the kernel itself is nondeterministic or reads uninitialised memory.
  Predicts: C) fails too (keyword calls differ call to call, or follow a NaN fill of free memory).

Also measured for the keyword call, per dtype of q/k/v: (a) same inputs twice, bitwise;
(b) rows at B=n vs the same rows inside a padded batch of 8; (c) CUDA graph replay at B=8 vs eager
at B=8.
"""
import inspect
import sys

import torch
import triton
import fla
from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule as fr

dev = "cuda"
H, D, P = 32, 128, 8
print(f"torch {torch.__version__} (CUDA {torch.version.cuda}), triton {triton.__version__}, "
      f"fla {fla.__version__}, GPU {torch.cuda.get_device_name()}, python {sys.version.split()[0]}")
print("fused_recurrent_gated_delta_rule parameters:", list(inspect.signature(fr).parameters)[:8], "...")
print("chunk_gated_delta_rule parameters:         ", list(inspect.signature(chunk_gated_delta_rule).parameters)[:8], "...")


def inputs(B, dtype=torch.bfloat16, seed=1, Hq=H):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, B, Hq, D, generator=g).to(dev, dtype)
    k = torch.randn(1, B, Hq, D, generator=g).to(dev, dtype)
    v = torch.randn(1, B, H, D, generator=g).to(dev, dtype)
    gate = (-torch.rand(1, B, H, generator=g)).to(dev)          # log-space decay, fp32
    beta = torch.rand(1, B, H, generator=g).to(dev)              # post-sigmoid, fp32
    h0 = (torch.randn(B, H, D, D, generator=g) * 0.1).to(dev)    # [N, HV, K, V] fp32
    return q, k, v, gate, beta, h0


def cu(B):
    return torch.arange(B + 1, device=dev)                        # int64


def positional(q, k, v, gate, beta, h0):
    """The positional call, as the first probes and the `fla` provider (kernels/gdn/fla.py) made it before the fix."""
    return fr(q, k, v, gate, beta, scale=D ** -0.5, initial_state=h0, output_final_state=True,
              cu_seqlens=cu(q.shape[1]), use_qk_l2norm_in_kernel=True)


def keyword(q, k, v, gate, beta, h0, cu_seqlens=None):
    return fr(q, k, v, g=gate, beta=beta, scale=D ** -0.5, initial_state=h0, output_final_state=True,
              cu_seqlens=cu(q.shape[1]) if cu_seqlens is None else cu_seqlens, use_qk_l2norm_in_kernel=True)


def run(fn, args):
    o, ht = fn(*(a.clone() for a in args))
    torch.cuda.synchronize()
    return o[0].clone(), ht.clone()


def poison(fill):
    torch.cuda.empty_cache()
    junk = torch.full((64 << 20,), fill, device=dev)              # 256 MiB, large pool
    small = [torch.full((1 << 16,), fill, device=dev) for _ in range(16)]  # 256 KiB each, small pool
    del junk, small


def reference(q, k, v, gate, beta, h0):
    """fp32 (and fp64) recurrence, one token per sequence: what our op promises."""
    out, st = [], []
    for dt in (torch.float32, torch.float64):
        qf, kf, vf = (x[0].to(dt) for x in (q, k, v))                       # [B, H, D]
        qf = qf * torch.rsqrt((qf * qf).sum(-1, keepdim=True) + 1e-6) * D ** -0.5
        kf = kf * torch.rsqrt((kf * kf).sum(-1, keepdim=True) + 1e-6)
        S = h0.to(dt) * torch.exp(gate[0].to(dt))[..., None, None]          # [B, H, K, V]
        delta = beta[0].to(dt)[..., None] * (vf - (kf[..., None, :] @ S)[..., 0, :])
        S = S + kf[..., :, None] * delta[..., None, :]
        out.append((qf[..., None, :] @ S)[..., 0, :]); st.append(S)
    return out, st


def mx(a, b):
    return (a.double() - b.double()).abs().max().item()


def same(a, b):
    return torch.equal(a, b) if a.shape == b.shape else False


# ---------------------------------------------------------------- A: the positional call (the misordered one)
print("\n== A: positional call fr(q, k, v, g, beta, ...) as first made ==")
for B in (3, 5, 8):
    args = inputs(B)
    r = [run(positional, args) for _ in range(3)]
    print(f"B={B}: call1 vs call2 out {mx(r[0][0], r[1][0]):.3g} state {mx(r[0][1], r[1][1]):.3g}; "
          f"call2 vs call3 out {mx(r[1][0], r[2][0]):.3g} state {mx(r[1][1], r[2][1]):.3g}")
args = inputs(5)
for fill in (0.0, float("nan"), 7.0, 0.0):
    poison(fill)
    o, ht = run(positional, args)
    print(f"positional B=5 after free memory filled with {fill}: mean|out[seq0]| {o[0].float().abs().mean().item():.6f}, "
          f"non-finite out {(~torch.isfinite(o)).sum().item()}, state {(~torch.isfinite(ht)).sum().item()}")

# ---------------------------------------------------------------- B: the mechanism
print("\n== B: what the positional call computes ==")
B = 5
q, k, v, gate, beta, h0 = inputs(B)
n = beta.numel()                                                   # B*H = 160 floats
for tail in (0.0, -1.0, float("nan")):
    buf = torch.full((B * H * D,), tail, device=dev)               # what gk [1, B, H, K] would need
    buf[:n] = beta.flatten()
    beta_view = buf[:n].view(1, B, H)                               # contiguous view: no copy by fla
    o_pos, h_pos = fr(q, k, v, gate, beta_view, scale=D ** -0.5, initial_state=h0.clone(),
                      output_final_state=True, cu_seqlens=cu(B), use_qk_l2norm_in_kernel=True)
    o_gk, h_gk = fr(q, k, v, g=gate, gk=buf.view(1, B, H, D), beta=None, scale=D ** -0.5,
                    initial_state=h0.clone(), output_final_state=True, cu_seqlens=cu(B),
                    use_qk_l2norm_in_kernel=True)
    torch.cuda.synchronize()
    print(f"tail after beta's storage = {tail}: positional == keyword(gk=beta+tail, beta=None) bitwise: "
          f"out {same(o_pos, o_gk)} state {same(h_pos, h_gk)}; mean|out| {o_pos.float().abs().mean().item():.6f}; "
          f"non-finite out {(~torch.isfinite(o_pos)).sum().item()}")
o_kw, h_kw = run(keyword, (q, k, v, gate, beta, h0))
o_b1, h_b1 = run(keyword, (q, k, v, gate, torch.ones_like(beta), h0))
poison(0.0)
buf = torch.zeros(B * H * D, device=dev); buf[:n] = beta.flatten()
o_p0, h_p0 = fr(q, k, v, gate, buf[:n].view(1, B, H), scale=D ** -0.5, initial_state=h0.clone(),
                output_final_state=True, cu_seqlens=cu(B), use_qk_l2norm_in_kernel=True)
torch.cuda.synchronize()
print(f"positional (zero tail) vs keyword beta=1: seq>=1 out {mx(o_p0[0, 1:], o_b1[1:]):.3g}; "
      f"positional vs correct keyword call: out {mx(o_p0[0], o_kw):.3g} state {mx(h_p0, h_kw):.3g}")

# ---------------------------------------------------------------- C: the keyword call
print("\n== C: keyword call fr(q, k, v, g=g, beta=beta, ...) ==")
for B in (3, 5, 8):
    args = inputs(B)
    r = [run(keyword, args) for _ in range(3)]
    (o32, o64), (s32, s64) = reference(*args)
    print(f"B={B}: 3 calls bitwise equal: out {same(r[0][0], r[1][0]) and same(r[1][0], r[2][0])} "
          f"state {same(r[0][1], r[1][1]) and same(r[1][1], r[2][1])}; vs fp64 reference: out {mx(r[0][0], o64):.3g} "
          f"(fp32 reference {mx(o32, o64):.3g}, bf16 ulp at max|out| {o64.abs().max().item() * 2 ** -8:.3g}), "
          f"state {mx(r[0][1], s64):.3g} (fp32 reference {mx(s32, s64):.3g}); max|state| {s64.abs().max().item():.3g}")
args = inputs(5)
base = run(keyword, args)
for fill in (0.0, float("nan"), 7.0):
    poison(fill)
    o, ht = run(keyword, args)
    print(f"keyword B=5 after free memory filled with {fill}: bitwise equal to before: out {same(o, base[0])} state {same(ht, base[1])}")
o_i32 = fr(*(a.clone() for a in args[:3]), g=args[3], beta=args[4], scale=D ** -0.5, initial_state=args[5].clone(),
           output_final_state=True, cu_seqlens=cu(5).to(torch.int32), use_qk_l2norm_in_kernel=True)
torch.cuda.synchronize()
print(f"cu_seqlens int32 vs int64: bitwise out {same(o_i32[0][0], base[0])} state {same(o_i32[1], base[1])}")
a16 = inputs(5, Hq=16)
exp = [x.repeat_interleave(2, dim=2) for x in a16[:2]] + list(a16[2:])
o_gva, h_gva = run(keyword, a16)
o_exp, h_exp = run(keyword, tuple(exp))
print(f"GVA: q, k with 16 heads vs expanded to 32 (repeat_interleave): bitwise out {same(o_gva, o_exp)} state {same(h_gva, h_exp)}")
# chunk_gated_delta_rule on the same single-token sequences (positional g, beta is its order)
oc = [chunk_gated_delta_rule(*(a.clone() for a in args[:5]), scale=D ** -0.5, initial_state=args[5].clone(),
                             output_final_state=True, cu_seqlens=cu(5), use_qk_l2norm_in_kernel=True) for _ in range(2)]
torch.cuda.synchronize()
print(f"chunk_gated_delta_rule B=5 (T=1 each): 2 calls bitwise out {same(oc[0][0], oc[1][0])}; vs fused_recurrent keyword: "
      f"out {mx(oc[0][0][0], base[0]):.3g} state {mx(oc[0][1], base[1]):.3g}")

# ---------------------------------------------------------------- (a) (b) (c) per dtype
print(f"\n== (a) (b) (c): keyword call, padded batch of {P} ==")
for dtype in (torch.bfloat16, torch.float16, torch.float32):
    full = inputs(P, dtype, seed=7)
    o8, h8 = run(keyword, full)
    o8b, h8b = run(keyword, full)
    a_ok = same(o8, o8b) and same(h8, h8b)
    worst_o = worst_h = 0.0
    bitwise_b = True
    for n in range(1, P):
        part = tuple(x[:, :n] for x in full[:5]) + (full[5][:n],)
        on, hn = run(keyword, part)
        worst_o, worst_h = max(worst_o, mx(on, o8[:n])), max(worst_h, mx(hn, h8[:n]))
        bitwise_b &= same(on, o8[:n]) and same(hn, h8[:n])
        # padding rows of zeros (and a zero state) instead of other requests
        zp = tuple(torch.cat([x[:, :n], torch.zeros_like(x[:, n:])], 1) for x in full[:5]) + \
            (torch.cat([full[5][:n], torch.zeros_like(full[5][n:])]),)
        oz, hz = run(keyword, zp)
        worst_o, worst_h = max(worst_o, mx(on, oz[:n])), max(worst_h, mx(hn, hz[:n]))
        bitwise_b &= same(on, oz[:n]) and same(hn, hz[:n])
    # (c) CUDA graph at the padded shape
    static = [x.clone() for x in full]
    cus = cu(P)
    keyword(*static, cu_seqlens=cus)                                 # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        og, hg = keyword(*static, cu_seqlens=cus)
    c_ok, c_max = True, 0.0
    for seed in (11, 12, 11):
        new = inputs(P, dtype, seed=seed)
        for s, x in zip(static, new):
            s.copy_(x)
        graph.replay()
        oe, he = run(keyword, new)
        c_ok &= same(og[0], oe) and same(hg, he)
        c_max = max(c_max, mx(og[0], oe), mx(hg, he))
    print(f"q/k/v {str(dtype).split('.')[1]} (out {o8.dtype}, state {h8.dtype}): (a) twice bitwise {a_ok}; "
          f"(b) B=1..7 vs padded {P} (other rows / zero rows): bitwise {bitwise_b}, max|d| out {worst_o:.3g} state {worst_h:.3g}; "
          f"(c) replay vs eager at B={P}, 3 input sets: bitwise {c_ok}, max|d| {c_max:.3g}")
print("\ndone")
