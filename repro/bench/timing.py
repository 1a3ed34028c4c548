"""Measuring on a device for `repro bench`: a clock (warm-up, then the median of samples; CUDA
events around each call, the L2 cache flushed before it), the copy bandwidth, and a per-kernel
profile of replays. Nothing here asserts a timing."""
from __future__ import annotations

import statistics
import time

import torch

FLUSH_BYTES = 256 << 20  # written before every timed CUDA call, so weights are not read from L2


class Clock:
    """Median time of a call in microseconds (see the module doc)."""

    def __init__(self, device: torch.device, iters: int = 50, warmup: int = 5, flush: bool | None = None):
        self.device, self.iters, self.warmup = torch.device(device), max(1, iters), max(0, warmup)
        self.cuda = self.device.type == "cuda"
        flush = self.cuda if flush is None else flush
        self.scratch = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device=self.device) if flush else None

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)
        elif self.device.type == "xpu":
            torch.xpu.synchronize(self.device)

    def __call__(self, fn) -> float:
        for _ in range(self.warmup):
            fn()
        self.sync()
        samples = []
        for _ in range(self.iters):
            if self.scratch is not None:
                self.scratch.zero_()
            self.sync()
            if self.cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                samples.append(start.elapsed_time(end) * 1e3)
            else:
                t0 = time.perf_counter()
                fn()
                self.sync()
                samples.append((time.perf_counter() - t0) * 1e6)
        return statistics.median(samples)


def copy_bandwidth(device, nbytes_: int | None = None, iters: int = 20) -> float:
    """Device copy bandwidth in bytes/s: bytes read + written by `dst.copy_(src)`, median."""
    device = torch.device(device)
    if nbytes_ is None:
        nbytes_ = (1 << 30) if device.type in ("cuda", "xpu") else (64 << 20)
    src = torch.empty(nbytes_, dtype=torch.uint8, device=device).fill_(1)
    dst = torch.empty_like(src)
    clock = Clock(device, iters=iters, warmup=3, flush=False)
    us = clock(lambda: dst.copy_(src))
    return 2 * nbytes_ / (us * 1e-6)


def kernel_profile(fn, device, replays: int = 20, top: int = 25) -> dict:
    """What one call of `fn` spends its time in, from torch.profiler over `replays` calls: on a GPU
    the device kernels (CUPTI sees the kernels a graph replays), on the CPU each op's self time.
    Rows per distinct name, largest first: calls and microseconds per call of `fn`."""
    from torch.profiler import ProfilerActivity, profile
    device = torch.device(device)
    gpu = device.type in ("cuda", "xpu")
    acts = [ProfilerActivity.CPU]
    if device.type == "cuda":
        acts.append(ProfilerActivity.CUDA)
    elif device.type == "xpu":
        acts.append(ProfilerActivity.XPU)
    clock = Clock(device, iters=1, warmup=0, flush=False)
    fn()
    clock.sync()
    with profile(activities=acts) as prof:
        for _ in range(replays):
            fn()
        clock.sync()
    rows = []
    for ev in prof.key_averages():
        us = (getattr(ev, "self_device_time_total", 0) if gpu else ev.self_cpu_time_total)
        if gpu and getattr(ev, "device_type", None) is not None and ev.device_type.name == "CPU":
            continue  # host-side op records (their device time is their kernels', counted once below)
        if us <= 0 and gpu:
            continue
        rows.append({"name": ev.key, "calls_per_replay": round(ev.count / replays, 2),
                     "us_per_replay": round(us / replays, 3)})
    rows.sort(key=lambda k: -k["us_per_replay"])
    total = sum(k["us_per_replay"] for k in rows)
    return {"replays": replays, "what": "device kernels" if gpu else "CPU ops, self time",
            "total_us_per_replay": round(total, 3), "launches_per_replay": round(sum(k["calls_per_replay"] for k in rows), 1),
            "kernels": rows[:top] if top else rows,
            "rest_us_per_replay": round(sum(k["us_per_replay"] for k in rows[top:]) if top else 0.0, 3)}
