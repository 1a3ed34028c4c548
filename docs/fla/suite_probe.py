"""The suite's `fla` GDN provider (kernels/gdn/fla.py, keyword call) against the suite's reference,
through torch.ops.repro. Run from a checkout: `python3 docs/fla/suite_probe.py` (needs fla and CUDA).

Prints, per op and shape: max |fla - reference| for the output and the fp32 state, the same scaled
by max |reference|, whether three calls agree bit for bit, the batch variance of decode rows
(B=n vs the same rows padded with sentinel rows to 8), and CUDA graph replay vs eager at the
padded shape.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch

from kernels import registry
from kernels.samples import sample_args

print("fla provider:", registry.providers("gated_delta_rule_decode")["fla"])
dec, pre = torch.ops.repro.gated_delta_rule_decode, torch.ops.repro.gated_delta_rule_prefill


def clone(args):
    return [a.clone() if isinstance(a, torch.Tensor) else a for a in args]


def d(a, b):
    return (a.double() - b.double()).abs().max().item()


def rel(a, b):
    return d(a, b) / max(b.double().abs().max().item(), 1e-30)


for name, op, dims in [
    ("decode", dec, dict(sentinel=-1)),
    ("decode", dec, dict(sentinel=0, B=6, S=3)),
    ("decode", dec, dict(sentinel=0, B=8, S=9, Hk=16, Hv=32, dk=128, dv=128)),
    ("prefill", pre, dict(sentinel=0, B=6, S=9)),
    ("prefill", pre, dict(sentinel=0, B=8, S=9, Hk=16, Hv=32, dk=128, dv=128)),
]:
    args = sample_args(f"gated_delta_rule_{name}", device="cuda", seed=3, **dims)
    with registry.using(gdn="reference"):
        ra = clone(args); ro = op(*ra)
    runs = []
    for _ in range(3):
        with registry.using(gdn="fla"):
            fa = clone(args); fo = op(*fa)
        torch.cuda.synchronize()
        runs.append((fo, fa[5]))
    det = all(torch.equal(runs[0][0], r[0]) and torch.equal(runs[0][1], r[1]) for r in runs[1:])
    print(f"{name} {dims}: fla vs reference: out max|d| {d(runs[0][0], ro):.3g} (rel {rel(runs[0][0], ro):.3g}), "
          f"state max|d| {d(runs[0][1], ra[5]):.3g} (rel {rel(runs[0][1], ra[5]):.3g}); 3 fla calls bitwise {det}")

# decode batch variance and graph replay through the op, at the model's dims
dims = dict(Hk=16, Hv=32, dk=128, dv=128, S=9, sentinel=0)
P = 8
full = sample_args("gated_delta_rule_decode", device="cuda", seed=5, B=P, **dims)
full[6][:] = torch.arange(1, P + 1, device="cuda", dtype=full[6].dtype)      # 8 live distinct slots
worst_o = worst_s = 0.0
bitwise = True
for n in range(1, P):
    exact = [x[:n].clone() if i < 5 or i == 6 else x for i, x in enumerate(full)]
    padded = clone(full)
    padded[6][n:] = 0                                                          # sentinel rows
    with registry.using(gdn="fla"):
        ea = clone(exact); eo = dec(*ea)
        pa = clone(padded); po = dec(*pa)
    torch.cuda.synchronize()
    worst_o, worst_s = max(worst_o, d(eo, po[:n])), max(worst_s, d(ea[5], pa[5]))
    bitwise &= torch.equal(eo, po[:n]) and torch.equal(ea[5], pa[5])
print(f"decode B=1..7 vs padded to {P} with sentinel rows (fla): bitwise {bitwise}, out max|d| {worst_o:.3g}, "
      f"state cache max|d| {worst_s:.3g}")

with registry.using(gdn="fla"):
    static = clone(full)
    dec(*clone(full))
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        gout = dec(*static)
    ok = True
    for seed in (6, 7, 6):
        new = sample_args("gated_delta_rule_decode", device="cuda", seed=seed, B=P, **dims)
        for s, x in zip(static, new):
            if isinstance(s, torch.Tensor):
                s.copy_(x)
        graph.replay()
        ea = clone(new); eo = dec(*ea)
        torch.cuda.synchronize()
        ok &= torch.equal(gout, eo) and torch.equal(static[5], ea[5])
print(f"decode graph replay vs eager at B={P} (fla, 3 input sets): bitwise {ok}")
