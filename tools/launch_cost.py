"""Host microseconds per call of one op on the decode path, layer by layer: the `repro::` op (a
plain `Library` definition, `kernels/_library.py`, not a `torch.library.custom_op`), the
islands' call of it (`kernels._library.namespace`: the body without the dispatcher), the
same body behind a plain `torch.library.Library` op of this tool's own, the provider function (which
launches through `kernels.triton_launch.launch`), Triton's `kernel[grid](...)`, the launch cache's
`launch(...)` (a cache hit), the compiled kernel's own launcher, and its C launcher called with
addresses (what a cache hit calls); then the same three for the
autotuned W8A8 decode GEMV (`_w8a8_rows_kernel`, one row); then a step's output flags, per tensor and in
one kernel (`repro/check/outflags.py`), with the read that synchronises. The figures of
docs/BENCH.md section 4 (where an eager step's host time goes); not a test. The last line gives
the launch cache's hit count: 0 there means the `launch` rows measured the normal path (a fallback).

    python tools/launch_cost.py [--n 5000]
"""
import argparse
import os
import sys
import time

import torch


def per_call(fn, n: int) -> float:
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    us = (time.perf_counter() - t) / n * 1e6
    torch.cuda.synchronize()
    return us


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=5000)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("launch_cost: needs a CUDA device", file=sys.stderr)
        return 2
    import triton
    from triton.runtime import driver

    from kernels import registry
    from kernels import triton_launch as TL
    from kernels.norms import triton as kt
    from kernels.triton_helpers import _np2
    from kernels.w8a8_linear import triton as kw

    x = torch.randn(1, 2048, device="cuda").bfloat16()
    w = torch.randn(2048, device="cuda").bfloat16()
    out = torch.empty_like(x)
    lib = torch.library.Library("launch_cost", "DEF")
    lib.define("rms_norm(Tensor x, Tensor w, float eps) -> Tensor")
    lib.impl("rms_norm", lambda x, w, eps: kt.rms_norm(x, w, eps), "CompositeExplicitAutograd")
    args = (x, w, out, 2048, x.stride(0), out.stride(0), 1e-6)
    compiled = kt._rms_norm_kernel[(1,)](*args, BH=2048, num_warps=4)
    dev = driver.active.get_current_device()
    stream = driver.active.get_current_stream(dev)
    full = args + (2048,)

    def raw():
        compiled.run(1, 1, 1, stream, compiled.function, compiled.packed_metadata, None, None, None, *full)

    M, K, N = 1, 2048, 2048  # the decode GEMV: autotuned (key N, KD, MB), a `lambda meta:` grid
    xq = torch.randn(M, K, device="cuda").bfloat16()
    words = torch.randint(-128, 128, (N, K), dtype=torch.int8, device="cuda").view(torch.int32)
    ws = torch.rand(N, device="cuda") / 64 + 1e-3
    outq = torch.empty(M, N, dtype=xq.dtype, device="cuda")
    wargs = (xq, words, ws, ws, outq, N, xq.stride(0), words.stride(0), outq.stride(0), _np2(M))
    wmeta = dict(KD=K, HAS_BIAS=False)

    def wgrid(meta):
        return (M, triton.cdiv(N, meta["BN"]))
    wcompiled = kw._w8a8_rows_kernel[wgrid](*wargs, **wmeta)  # tunes once
    cfg = kw._w8a8_rows_kernel.best_config
    wfull = wargs + (K, False, cfg.kwargs["BN"], cfg.kwargs["BK"])
    wg = wgrid(cfg.kwargs)

    def wraw():
        wcompiled.run(wg[0], wg[1], 1, stream, wcompiled.function, wcompiled.packed_metadata, None, None, None,
                      *wfull)

    rows = []
    with registry.using(rms_norm="triton"), torch.inference_mode():
        rows.append(("torch.ops.repro.rms_norm", per_call(lambda: torch.ops.repro.rms_norm(x, w, 1e-6), a.n)))
        from kernels._library import namespace
        rows.append(("the islands' call (namespace: the body, direct)",
                     per_call(lambda: namespace.rms_norm(x, w, 1e-6), a.n)))
        rows.append(("torch.ops.launch_cost.rms_norm (Library)",
                     per_call(lambda: torch.ops.launch_cost.rms_norm(x, w, 1e-6), a.n)))
        rows.append(("provider function (kernels.norms.triton)",
                     per_call(lambda: kt.rms_norm(x, w, 1e-6), a.n)))
        rows.append(("kernel[grid](...)",
                     per_call(lambda: kt._rms_norm_kernel[(1,)](*args, BH=2048, num_warps=4), a.n)))
        rows.append(("triton_launch.launch (cached)",
                     per_call(lambda: TL.launch(kt._rms_norm_kernel, (1,), *args, BH=2048, num_warps=4), a.n)))
        try:
            rows.append(("CompiledKernel.run (the C launcher)", per_call(raw, a.n)))
        except Exception as e:  # the launcher's signature is Triton's internal API
            print(f"CompiledKernel.run: {type(e).__name__}: {e}")
        try:
            r = compiled.run
            ptrs = tuple(t.data_ptr() if isinstance(t, torch.Tensor) else t for t in full)
            rows.append(("its C launcher, addresses (a cache hit's call)",
                         per_call(lambda: r.launch(1, 1, 1, stream, compiled.function, r.launch_cooperative_grid,
                                                   r.launch_pdl, None, None, compiled.packed_metadata, None, None,
                                                   None, *ptrs), a.n)))
        except Exception as e:
            print(f"C launcher: {type(e).__name__}: {e}")
        rows.append(("w8a8 provider function (autotuned rows GEMV)",
                     per_call(lambda: kw.w8a8_linear(xq, words.view(torch.int8), ws, None), a.n)))
        rows.append(("w8a8 rows: kernel[grid](...) (autotuned)",
                     per_call(lambda: kw._w8a8_rows_kernel[wgrid](*wargs, **wmeta), a.n)))
        rows.append(("w8a8 rows: triton_launch.launch (cached)",
                     per_call(lambda: TL.launch(kw._w8a8_rows_kernel, wgrid, *wargs, **wmeta), a.n)))
        try:
            rows.append(("w8a8 rows: CompiledKernel.run", per_call(wraw, a.n)))
        except Exception as e:
            print(f"w8a8 rows CompiledKernel.run: {type(e).__name__}: {e}")
        from repro.check.stepcheck import StepCheck
        outs = {f"submod{i % 2}.o{i}": torch.randn(1, 2048, device="cuda").to(torch.bfloat16) for i in range(9)}
        outs["head.token_ids"] = torch.zeros(1, dtype=torch.int64, device="cuda")
        same = {k: v.clone() for k, v in outs.items()}
        for name, on in (("per-tensor", False), ("one kernel (outflags)", True)):
            check = StepCheck(outflags=on)
            rows.append((f"output flags, 10 outputs, {name}, launch + read",
                         per_call(lambda: check.read(check.launch(outs, same, {}, {})), a.n)))
        rows.append(("torch.empty_like", per_call(lambda: torch.empty_like(x), a.n)))
        rows.append(("x.add(x) (one aten kernel)", per_call(lambda: x.add(x), a.n)))
    for name, us in rows:
        print(f"{name:45} {us:7.1f} us of host per call")
    print(f"launch cache: {TL.stats} (verified for this triton: {TL.VERIFIED}; "
          f"{TL.ENV}={os.environ.get(TL.ENV, 'unset')})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
