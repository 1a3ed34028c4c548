"""Host microseconds per call of one op on the decode path, layer by layer: the `repro::` op (a
`torch.library.custom_op` before `kernels/_library.py`, a plain `Library` definition since), the
same body behind a plain `torch.library.Library` op of this tool's own, the provider function, Triton's
`kernel[grid](...)`, and the compiled kernel's own launcher. A GPU figure for issue 19 (where an
eager step's host time goes); not a test.

    python tools/launch_cost.py [--n 5000]
"""
import argparse
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
    from kernels.norms import triton as kt

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

    rows = []
    with registry.using(rms_norm="triton"), torch.inference_mode():
        rows.append(("torch.ops.repro.rms_norm", per_call(lambda: torch.ops.repro.rms_norm(x, w, 1e-6), a.n)))
        rows.append(("torch.ops.launch_cost.rms_norm (Library)",
                     per_call(lambda: torch.ops.launch_cost.rms_norm(x, w, 1e-6), a.n)))
        rows.append(("provider function (kernels.norms.triton)",
                     per_call(lambda: kt.rms_norm(x, w, 1e-6), a.n)))
        rows.append(("kernel[grid](...)",
                     per_call(lambda: kt._rms_norm_kernel[(1,)](*args, BH=2048, num_warps=4), a.n)))
        try:
            rows.append(("CompiledKernel.run (the C launcher)", per_call(raw, a.n)))
        except Exception as e:  # the launcher's signature is Triton's internal API
            print(f"CompiledKernel.run: {type(e).__name__}: {e}")
        from kernels.w8a8_linear import triton as kw
        wq = torch.randint(-127, 127, (8192, 2048), dtype=torch.int8, device="cuda")
        wsc = torch.rand(8192, device="cuda")
        rows.append(("w8a8 provider, autotuned, M=1 2048->8192",
                     per_call(lambda: kw.w8a8_linear(x, wq, wsc, None), a.n)))
        words = wq.view(torch.int32)
        o = torch.empty(1, 8192, dtype=x.dtype, device="cuda")
        rows.append(("  its Autotuner kernel[grid](...)", per_call(
            lambda: kw._w8a8_rows_kernel[lambda meta: (1, triton.cdiv(8192, meta["BN"]))](
                x, words, wsc, wsc, o, 8192, x.stride(0), words.stride(0), o.stride(0), 1, KD=2048,
                HAS_BIAS=False), a.n)))
        rows.append(("torch.empty_like", per_call(lambda: torch.empty_like(x), a.n)))
        rows.append(("x.add(x) (one aten kernel)", per_call(lambda: x.add(x), a.n)))
    for name, us in rows:
        print(f"{name:45} {us:7.1f} us of host per call")
    return 0


if __name__ == "__main__":
    sys.exit(main())
