"""Where a checked lockstep step's host time goes: cProfile over one `repro bench --lockstep-rates`
case (the same `lockrates.run_checked`), or torch.profiler with `--torch-profiler`, with the
phases the lockstep measures itself and the host cost of one Triton launch. A checked step on a
GPU is host-bound, so this names the host calls to cut; not a test.

    python tools/lockstep_profile.py --device cuda --preset real-layer --kernels all=triton \
        --case chain:full --steps 200 [--top 40]
"""
import argparse
import cProfile
import io
import pstats
import sys
import time


def launch_cost(device: str, n: int = 2000) -> str:
    """Host microseconds per launch of a one-element Triton kernel through `kernel[grid](...)`."""
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def _touch(x, n, BLOCK: tl.constexpr):
        i = tl.arange(0, BLOCK)
        tl.store(x + i, tl.load(x + i, mask=i < n) + 1, mask=i < n)

    x = torch.zeros(16, device=device)
    for _ in range(10):
        _touch[(1,)](x, 16, BLOCK=16)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        _touch[(1,)](x, 16, BLOCK=16)
    host = (time.perf_counter() - t) / n * 1e6
    torch.cuda.synchronize()
    return f"triton {triton.__version__}: kernel[grid](...) {host:.1f} us of host per launch ({n} launches)"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--preset", default="real-layer")
    ap.add_argument("--kernels", default="all=triton")
    ap.add_argument("--case", default="chain:full", help="island:mode, as lockrates.CASES")
    ap.add_argument("--check", default="device")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--spec-tokens", type=int, default=0, help="K draft tokens a decode, as bench --spec-tokens")
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--torch-profiler", action="store_true",
                    help="torch.profiler (host time per op, custom ops included) instead of cProfile")
    ap.add_argument("--callers", default="",
                    help="cProfile: comma-separated function patterns ('to' of, pin_memory) whose callers to list")
    a = ap.parse_args()
    from kernels import registry
    from repro.bench.replay import checkpoint_for
    from repro.graphs import make_provider
    from repro.islands import Model
    from repro.job.cases import default_sequence
    from repro.bench.lockrates import run_checked

    island, mode = a.case.split(":")
    with registry.using(**registry.parse(a.kernels)):
        provider = make_provider(a.device)
        model = Model(checkpoint_for(a.preset, provider.device), provider.device)
        seq = default_sequence(0, a.steps, vocab=model.cfg.vocab_size)
        if a.spec_tokens:  # as lockrates.lockstep_rates builds its K > 0 sequence
            seq = default_sequence(0, a.steps, vocab=model.cfg.vocab_size, spec_tokens=a.spec_tokens,
                                   max_tokens=seq.max_tokens * (1 + a.spec_tokens))
        run_checked(model, provider, island, mode, seq, a.check)  # compiles, autotunes, captures
        if a.torch_profiler:
            import torch.profiler as tp
            acts = [tp.ProfilerActivity.CPU] + ([tp.ProfilerActivity.CUDA] if a.device.startswith("cuda") else [])
            with tp.profile(activities=acts) as prof:
                t = time.perf_counter()
                r = run_checked(model, provider, island, mode, seq, a.check)
                wall = time.perf_counter() - t
            print(f"{a.case} {a.check}, {r.steps} steps in {wall:.2f} s under torch.profiler")
            for key in ("self_cpu_time_total", "cpu_time_total"):
                print(f"==== by {key}")
                print(prof.key_averages().table(sort_by=key, row_limit=a.top, max_name_column_width=60))
            return 0
        prof = cProfile.Profile()
        t = time.perf_counter()
        prof.enable()
        r = run_checked(model, provider, island, mode, seq, a.check)
        prof.disable()
        wall = time.perf_counter() - t
    print(f"{a.case} K={a.spec_tokens} {a.check}, {r.steps} steps in {wall:.2f} s under cProfile ({r.steps / wall:.1f} steps/s); "
          f"phases: {r.phases.get('us_per_step')}")
    if a.device.startswith("cuda"):
        print(launch_cost(a.device))
    for key in ("tottime", "cumtime"):
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats(key).print_stats(a.top)
        print(f"==== by {key}")
        print(s.getvalue())
    for pattern in filter(None, a.callers.split(",")):
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_callers(pattern)
        print(f"==== callers of {pattern}")
        print(s.getvalue())
    return 0


if __name__ == "__main__":
    sys.exit(main())
