"""Race amplification: make a stream hazard's bad interleaving happen on every step (issue 20).

A stream hazard is a race; whether a run catches it depends on how fast the kernels around it
finish (an H200 with Triton kernels let async-output-copy's copy land before the host read it,
and the run said MISSED). The amplifier (`RunnerOptions.amplify`, on by default) does two things
to each racing pair, and neither changes a correctly ordered run:

- poison: what the reader would read too early is filled with a recognisable value first (NaN,
  or the dtype's minimum for integers), so an early read always gives a wrong value, never last
  step's values (which may coincide with this step's);
- delay: the producer's queue is held back by `delay_us` microseconds of device work queued just
  before the producing work, so the early read happens on every step, whatever the speed of the
  kernels around it. A correctly ordered reader (an event wait, a synchronize) waits for the
  delay too, so it reads the real values; it only costs time (`repro bench` reports how much).

The delay is device work, not a host sleep: on CUDA `torch.cuda._sleep(cycles)` (one spinning
kernel; cycles per microsecond are measured once per device); elsewhere (XPU has no `_sleep`) a
busy loop of in-place multiplies on a 64 MiB scratch tensor, each one long against its own launch
cost, counted from a one-off measurement. The XPU path follows the documented API and was not run
here (no Intel GPU). On the CPU there is no queue to delay: `device_delay` does nothing.

What the amplifier cannot force is a host that stalls longer than `delay_us` between issuing the
producer and reading; the runner therefore checks every amplified step's read for the poison and
reports how many were forced (`runner.RaceLog`).
"""
from __future__ import annotations

import math
import time

import torch

from .options import RunnerOptions

DELAY_US = RunnerOptions.amplify_us  # far above the host's issue-to-read time (tens of microseconds)
_CAL_CYCLES = 20_000_000  # ~10 ms of `_sleep` on a ~2 GHz part: launch overhead is noise against it
_BUSY_ELEMS = 16 << 20  # float32 scratch of the busy loop (64 MiB: ~0.1 ms an op at 1-2 TB/s)
_BUSY_CAL_OPS = 20
_BUSY_MAX_OPS = 20_000
_rates: dict = {}  # (device type, index) -> cycles/us (CUDA) or (scratch, us an op) (busy loop)


def poison_value(dtype: torch.dtype):
    """The value an early read gives: NaN for floats, the minimum for integers, None for bool
    (no value of a bool is recognisable)."""
    if dtype.is_floating_point or dtype.is_complex:
        return float("nan")
    if dtype == torch.bool:
        return None
    return torch.iinfo(dtype).min


def poison_(t: torch.Tensor) -> torch.Tensor:
    """Fill `t` with its dtype's poison (in place, on the current stream for a device tensor)."""
    v = poison_value(t.dtype)
    if v is not None:
        t.fill_(v)
    return t


def is_poison(t: torch.Tensor) -> torch.Tensor:
    """Elementwise: holds the poison."""
    v = poison_value(t.dtype)
    if v is None:
        return torch.zeros_like(t, dtype=torch.bool)
    return torch.isnan(t) if isinstance(v, float) else t == v


def device_delay(device, us: float) -> float:
    """Queue about `us` microseconds of device work on the current stream of `device` (nothing on
    the CPU). Returns the microseconds queued (0.0 on the CPU)."""
    device = torch.device(device)
    if device.type == "cpu" or us <= 0:
        return 0.0
    if device.type == "cuda" and hasattr(torch.cuda, "_sleep"):
        torch.cuda._sleep(max(1, int(us * _cuda_cycles_per_us(device))))
        return float(us)
    scratch, per_op = _busy_rate(device)
    for _ in range(min(_BUSY_MAX_OPS, max(1, math.ceil(us / per_op)))):
        scratch.mul_(1.0)
    return float(us)


def _key(device: torch.device):
    if device.index is not None:
        return device.type, device.index
    return device.type, getattr(torch, device.type).current_device()


def _cuda_cycles_per_us(device: torch.device) -> float:
    key = _key(device)
    if key not in _rates:
        with torch.cuda.device(device):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            torch.cuda._sleep(_CAL_CYCLES)
            end.record()
            end.synchronize()
            us = start.elapsed_time(end) * 1e3
        # an unreadable measurement falls back to 2 GHz (a slower clock only lengthens the delay)
        _rates[key] = _CAL_CYCLES / us if us > 0 else 2000.0
    return _rates[key]


def _busy_rate(device: torch.device):
    key = _key(device)
    if key not in _rates:
        mod = getattr(torch, device.type)
        scratch = torch.zeros(_BUSY_ELEMS, dtype=torch.float32, device=device)
        mod.synchronize(device)
        t0 = time.perf_counter()
        for _ in range(_BUSY_CAL_OPS):
            scratch.mul_(1.0)
        mod.synchronize(device)
        _rates[key] = (scratch, max(1.0, (time.perf_counter() - t0) * 1e6 / _BUSY_CAL_OPS))
    return _rates[key]
