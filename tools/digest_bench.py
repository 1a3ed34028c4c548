"""The lockstep's per-step weight digest (`repro.check.stepcheck.digest_words`: int64 words)
against a widening digest (int32 words summed into int64), on the real layer's two int8 expert
stacks (805 MB): device time and GB/s of each on a GPU, what checking the weights costs a step;
not a test.

    python tools/digest_bench.py [--device cuda]
"""
import argparse
import sys

import torch

from repro.check.stepcheck import digest_words


def widened(t: torch.Tensor) -> torch.Tensor:
    """The widening digest compared against: int32 words summed into int64."""
    return t.reshape(-1).view(torch.int32).sum(dtype=torch.int64)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--iters", type=int, default=20)
    a = ap.parse_args()
    dev = a.device
    if not getattr(torch, dev.split(":")[0]).is_available():
        print(f"digest_bench: no {dev} device here", file=sys.stderr)
        return 2
    ts = [torch.randint(-128, 127, (256, 1024, 2048), dtype=torch.int8, device=dev),   # gate_up
          torch.randint(-128, 127, (256, 2048, 512), dtype=torch.int8, device=dev)]    # down
    nbytes = sum(t.numel() for t in ts)
    backend = getattr(torch, torch.device(dev).type)
    for name, f in (("int32 words widened to int64", widened), ("digest_words (int64 words)", digest_words)):
        for _ in range(3):
            [f(t) for t in ts]
        backend.synchronize()
        start, end = backend.Event(enable_timing=True), backend.Event(enable_timing=True)
        start.record()
        for _ in range(a.iters):
            [f(t) for t in ts]
        end.record()
        backend.synchronize()
        ms = start.elapsed_time(end) / a.iters
        print(f"{name:30}: {ms * 1e3:8.1f} us for {nbytes / 1e6:.0f} MB = {nbytes / ms / 1e6:.0f} GB/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
