"""Block-size and variant sweep for the decode GEMVs of the `triton` provider, on a GPU.

    python3 -m kernels.w8a8_linear.sweep [--json FILE]

For each decode shape of the real layer (W8A8 projections at one row), every config of the
production `dp4a` GEMV (`_w8a8_rows_kernel` in `kernels/w8a8_linear/triton.py`) and of an
int32-products GEMV (products in registers, for comparison) is checked bit for bit against the
autotuned production call and timed as a CUDA graph of `REPS` launches over rotating weight
copies (more bytes than the L2 holds, no launch gaps), so the time per launch is what a decode
graph would see. Prints the best config per (shape, variant) with its achieved bandwidth. A tool
for choosing the autotuning spaces in `triton.py`, not part of any test. On an H200 the `dp4a`
variant streamed a 16 MB weight at 2.5 TB/s and the int32-products one at 1.5-1.9, which is why
the production kernel uses `dp4a`.
"""
from __future__ import annotations

import argparse
import itertools
import json
import sys

import torch
import triton
import triton.language as tl

from kernels import triton_helpers as H
from kernels.w8a8_linear import triton as K

REPS = 8


@triton.jit
def gemv_unrolled(x_ptr, w_ptr, ws_ptr, o_ptr, N, sx, swn, so, KD: tl.constexpr, BN: tl.constexpr,
                  BK: tl.constexpr):
    """The GEMV without `dp4a`, for comparison: int32 products in registers, K loop unrolled."""
    t = tl.program_id(0)
    pid_n = tl.program_id(1)
    rk = tl.arange(0, BK)
    amax = tl.zeros((BK,), tl.float32)
    for k0 in tl.static_range(0, KD, BK):
        amax = tl.maximum(amax, tl.abs(tl.load(x_ptr + t * sx + k0 + rk).to(tl.float32)))
    scale = H._act_scale(tl.max(amax, axis=0))
    rn = pid_n * BN + tl.arange(0, BN)
    nm = rn < N
    acc = tl.zeros((BN,), tl.int32)
    for k0 in tl.static_range(0, KD, BK):
        q = H._quantize(tl.load(x_ptr + t * sx + k0 + rk).to(tl.float32), scale).to(tl.int32)
        wv = tl.load(w_ptr + rn[:, None] * swn + (k0 + rk)[None, :], mask=nm[:, None], other=0)
        acc += tl.sum(wv.to(tl.int32) * q[None, :], axis=1)
    ws = tl.load(ws_ptr + rn, mask=nm, other=0.0).to(tl.float32)
    out = H._mul(H._mul(acc.to(tl.float32), scale), ws)
    tl.store(o_ptr + t * so + rn, out.to(o_ptr.dtype.element_ty), mask=nm)


def _time_graph(launches) -> float:
    """Microseconds per launch: a graph of the launches, replayed, median of 20."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for f in launches:
            f()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for f in launches:
            f()
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(20):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / len(launches))
    times.sort()
    return times[len(times) // 2]


SPACE = list(itertools.product((4, 8, 16, 32), (512, 1024, 2048), (2, 4, 8), (2,)))


def sweep_gemv(N: int, Kd: int, log) -> list[dict]:
    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(N + Kd)
    x = torch.randn(1, Kd, device=dev, generator=g).to(torch.bfloat16)
    ws_ = [torch.randint(-128, 128, (N, Kd), device=dev, generator=g, dtype=torch.int8) for _ in range(REPS)]
    scale = (torch.rand(N, device=dev, generator=g) * 0.01 + 1e-3).float()
    ref = [K.w8a8_linear(x, w, scale, None) for w in ws_]
    out = torch.empty(1, N, dtype=torch.bfloat16, device=dev)
    rows = []
    # production (autotuned) kernel
    t = _time_graph([lambda w=w: K.w8a8_linear(x, w, scale, None) for w in ws_])
    rows.append({"variant": "production", "N": N, "K": Kd, "config": "autotuned", "us": t})
    for variant in ("int32-products", "dp4a"):
        best = None
        for BN, BK, nw, st in SPACE:
            if BK > Kd or (BN > N and BN > 4):
                continue
            grid = (1, triton.cdiv(N, BN))
            wv = [w.view(torch.int32) if variant == "dp4a" else w for w in ws_]
            try:
                def launch(w, variant=variant, BN=BN, BK=BK, nw=nw, st=st):
                    if variant == "dp4a":  # the production kernel, one config
                        K._w8a8_rows_kernel.fn[grid](x, w, scale, scale, out, N, x.stride(0), w.stride(0),
                                                     out.stride(0), 1, KD=Kd, HAS_BIAS=False, BN=BN, BK=BK,
                                                     num_warps=nw, num_stages=st)
                    else:
                        gemv_unrolled[grid](x, w, scale, out, N, x.stride(0), w.stride(0), out.stride(0), KD=Kd,
                                            BN=BN, BK=BK, num_warps=nw, num_stages=st)
                ok = True
                for w, r in zip(wv, ref):
                    launch(w)
                    ok = ok and torch.equal(out, r)
                if not ok:
                    log(f"  {variant} N={N} K={Kd} BN={BN} BK={BK} w={nw} s={st}: WRONG")
                    continue
                t = _time_graph([lambda w=w: launch(w) for w in wv])
            except Exception as e:  # a config that does not compile is skipped, and said
                log(f"  {variant} BN={BN} BK={BK} w={nw} s={st}: {type(e).__name__}: {str(e)[:120]}")
                continue
            if best is None or t < best["us"]:
                best = {"variant": variant, "N": N, "K": Kd, "config": f"BN={BN} BK={BK} warps={nw} stages={st}",
                        "us": t}
        if best:
            rows.append(best)
    for r in rows:
        r["GBps"] = round(N * Kd / (r["us"] * 1e-6) / 1e9, 1)
        r["us"] = round(r["us"], 2)
        log(f"N={N:5d} K={Kd:5d} {r['variant']:<10} {r['us']:8.2f} us {r['GBps']:8.1f} GB/s  {r['config']}")
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json")
    p.add_argument("--shapes", default="12352x2048,2048x4096,8192x2048,32x2048")
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    log = lambda s: print(s, flush=True)
    rows = []
    for shape in a.shapes.split(","):
        n, k = (int(v) for v in shape.split("x"))
        rows += sweep_gemv(n, k, log)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
