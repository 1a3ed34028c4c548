"""FLA's fused_recurrent_gated_delta_rule "nondeterminism" is a call with beta in gk's place.

fla-core (0.3.2 .. 0.6.0 at least) defines
    fused_recurrent_gated_delta_rule(q, k, v, g=None, gk=None, gv=None, beta=None, scale=None, ...)
while chunk_gated_delta_rule is (q, k, v, g, beta, scale, ...). A call written for the latter order,
`fused_recurrent_gated_delta_rule(q, k, v, g, beta, ...)`, hands beta [1, T, HV] to `gk`, which the
kernel reads as [1, T, HV, K] (128x more floats than exist: what lies after beta's storage), as a
per-key log decay, and runs with beta = 1.

This script puts beta at the start of a larger buffer and changes only the bytes after it.
Exit 1: the positional call's result changes with those bytes (the misordered call's effect reproduces).
Exit 0: it does not. The keyword call is checked too (must be deterministic, memory-independent
and match an fp64 reference within bf16 output rounding). Imports only torch and fla.
"""
import importlib.metadata as md
import sys

import torch
from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule as fr

print(f"torch {torch.__version__} (CUDA {torch.version.cuda}), triton {md.version('triton')}, "
      f"fla-core {md.version('fla-core')}, {torch.cuda.get_device_name()}")
dev, B, H, D = "cuda", 5, 32, 128
gen = torch.Generator().manual_seed(1)
q, k, v = (torch.randn(1, B, H, D, generator=gen).to(dev, torch.bfloat16) for _ in range(3))
g = (-torch.rand(1, B, H, generator=gen)).to(dev)                 # log-space decay
beta = torch.rand(1, B, H, generator=gen).to(dev)
h0 = (torch.randn(B, H, D, D, generator=gen) * 0.1).to(dev)       # [N, HV, K, V]
cu = torch.arange(B + 1, device=dev)
common = dict(scale=D ** -0.5, output_final_state=True, cu_seqlens=cu, use_qk_l2norm_in_kernel=True)


def beta_followed_by(tail):
    buf = torch.full((B * H * D,), tail, device=dev)
    buf[:beta.numel()] = beta.flatten()
    return buf[:beta.numel()].view(1, B, H)                        # contiguous: fla does not copy it


def positional(tail):
    o, ht = fr(q, k, v, g, beta_followed_by(tail), initial_state=h0.clone(), **common)
    torch.cuda.synchronize()
    return o, ht


def keyword(tail):
    o, ht = fr(q, k, v, g=g, beta=beta_followed_by(tail), initial_state=h0.clone(), **common)
    torch.cuda.synchronize()
    return o, ht


def same(a, b):  # bitwise, NaN equal to NaN
    return torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(0.0), b.nan_to_num(0.0))


def desc(o, ht):
    return (f"mean|out| {o.float().abs().nanmean().item():.6f}, non-finite out {(~torch.isfinite(o)).sum().item()}"
            f"/{o.numel()}, state {(~torch.isfinite(ht)).sum().item()}/{ht.numel()}")


tails = (0.0, -1.0, float("nan"))
pos = {t: positional(t) for t in tails}
kw = {t: keyword(t) for t in tails}
for t in tails:
    print(f"bytes after beta = {t:>4}: positional (q, k, v, g, beta): {desc(*pos[t])}")
for t in tails:
    print(f"bytes after beta = {t:>4}: keyword (g=g, beta=beta):      {desc(*kw[t])}")
pos_varies = not all(same(pos[t][0], pos[0.0][0]) and same(pos[t][1], pos[0.0][1]) for t in tails)
kw_varies = not all(same(kw[t][0], kw[0.0][0]) and same(kw[t][1], kw[0.0][1]) for t in tails)

# what the positional call computes: gk = beta followed by the tail, beta = 1
buf = torch.full((B * H * D,), -1.0, device=dev); buf[:beta.numel()] = beta.flatten()
o_gk, h_gk = fr(q, k, v, g=g, gk=buf.view(1, B, H, D), beta=None, initial_state=h0.clone(), **common)
torch.cuda.synchronize()
print("positional call (tail -1.0) == fr(..., g=g, gk=<beta, tail> viewed [1, B, H, K], beta=None) bitwise:",
      same(pos[-1.0][0], o_gk) and same(pos[-1.0][1], h_gk))

# the keyword call against an fp64 reference of the gated delta rule
qd, kd, vd = (x[0].double() for x in (q, k, v))
qd = qd * torch.rsqrt((qd * qd).sum(-1, keepdim=True) + 1e-6) * D ** -0.5
kd = kd * torch.rsqrt((kd * kd).sum(-1, keepdim=True) + 1e-6)
S = h0.double() * torch.exp(g[0].double())[..., None, None]
delta = beta[0].double()[..., None] * (vd - (kd[..., None, :] @ S)[..., 0, :])
S = S + kd[..., :, None] * delta[..., None, :]
o_ref = (qd[..., None, :] @ S)[..., 0, :]
o, ht = kw[0.0]
ulp = o_ref.abs().max().item() * 2 ** -8
err_o, err_h = (o[0].double() - o_ref).abs().max().item(), (ht.double() - S).abs().max().item()
repeat = all(same(keyword(0.0)[i], kw[0.0][i]) for i in (0, 1))
print(f"keyword call vs fp64 reference: out max|d| {err_o:.3g} (bf16 rounding bound, max|out| * 2^-8: {ulp:.3g}), "
      f"state max|d| {err_h:.3g}; repeated call bitwise equal: {repeat}")
ok_kw = (not kw_varies) and repeat and err_o <= ulp and err_h <= 1e-5
print(f"positional call depends on memory after beta: {pos_varies}; keyword call does: {kw_varies}; "
      f"keyword call correct: {ok_kw}")
print("REPRODUCES: beta passed positionally lands in gk" if pos_varies else "does not reproduce")
sys.exit(1 if pos_varies else 0)
