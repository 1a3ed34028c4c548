"""Race amplification: make a stream hazard's bad interleaving happen on every step.

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
producer and reading, or a GPU shared with other processes: their time-sliced contexts hold the
consumer's queue while the delay (counted in clock cycles) runs out. The runner therefore checks
every amplified step's read for the poison, and the race log records, where the device can tell,
whether each step's read really came early (`RaceLog`). On the H200 the side-stream race was
caught at its first step in 10 of 10 runs alone, and late under `pytest -n 8`.
"""
from __future__ import annotations

import math
import time

import torch

from ..graphs.poison import is_poison, poison_
from .finding import Finding
from ..knobs.options import RunnerOptions

DELAY_US = RunnerOptions.amplify_us  # far above the host's issue-to-read time (tens of microseconds)
_CAL_CYCLES = 20_000_000  # ~10 ms of `_sleep` on a ~2 GHz part: launch overhead is noise against it
_BUSY_ELEMS = 16 << 20  # float32 scratch of the busy loop (64 MiB: ~0.1 ms an op at 1-2 TB/s)
_BUSY_CAL_OPS = 20
_BUSY_MAX_OPS = 20_000
_rates: dict = {}  # (device type, index) -> cycles/us (CUDA) or (scratch, us an op) (busy loop)


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


class RaceLog:
    """What the race amplifier forced for one racing pair (`race.py`): the steps it amplified, the
    steps whose early read held the poison (a wrong value produced by the race), and the first
    of them. Hits are counted on the host (a host read) or on the device (`hit_device`, a flag
    the consumer's stream computes: no synchronisation per step; read when the finding is made).

    Apart from the poison, the log records whether the bad order really happened, measured where
    the device can say so: the host read before the copy's event completed (`hit(..., early=)`),
    or the consumer's read finished before the producer's delay ended (`order_device`: two timed
    events, compared when the finding is made). A step whose early read was confirmed must hold
    the poison; a step that was not confirmed (the host stalled longer than the delay, or another
    process held the device) says why a race can be caught a step late."""

    def __init__(self, what: str, how: str):
        self.what, self.how = what, how  # the interleaving forced; how it was amplified
        self.steps = 0
        self.hits = 0
        self.first: int | None = None
        self.early = 0  # steps whose early read was confirmed
        self.first_early: int | None = None
        self.ordered = 0  # steps whose order was measured (0: nothing to confirm with)
        self._dev = None  # (hits, first) as device tensors
        self._pairs: list = []  # (step, read event, producer-start event), timed

    def hit(self, step: int, poisoned: bool, early: bool | None = None) -> None:
        self.steps += 1
        if poisoned:
            self.hits += 1
            if self.first is None:
                self.first = step
        if early is not None:
            self._early(step, early)

    def _early(self, step: int, early: bool) -> None:
        self.ordered += 1
        if early:
            self.early += 1
            if self.first_early is None:
                self.first_early = step

    def hit_device(self, step: int, flag: torch.Tensor) -> None:
        self.steps += 1
        if self._dev is None:
            self._dev = (torch.zeros((), dtype=torch.long, device=flag.device),
                         torch.full((), -1, dtype=torch.long, device=flag.device))
        hits, first = self._dev
        first.masked_fill_(flag & (first < 0), step)
        hits.add_(flag.long())

    def order_device(self, step: int, read, producer_start) -> None:
        """Timed events: `read` recorded after the consumer's read, `producer_start` after the
        delay, just before the producing work. The read was early if it completed first."""
        self._pairs.append((step, read, producer_start))

    def _settle(self) -> None:
        if self._dev is not None:
            hits, first = (int(t.item()) for t in self._dev)
            self._dev = None
            self.hits += hits
            if first >= 0 and self.first is None:
                self.first = first
        pairs, self._pairs = self._pairs, []
        for step, read, start in pairs:
            start.synchronize()
            read.synchronize()
            try:
                ms = read.elapsed_time(start)  # from the read to the producer's start
            except RuntimeError:  # a backend that cannot time these two: the step is not measured
                continue
            self._early(step, ms > 0)

    def finding(self) -> Finding | None:
        """A "race" finding once a read held the poison (None before, or when none did)."""
        self._settle()
        if not self.hits:
            return None
        confirmed = ""
        if self.ordered:
            first = "" if self.first_early is None else f", first at step {self.first_early}"
            confirmed = f"; the early read was confirmed at {self.early} of {self.ordered} measured steps{first}"
        return Finding("race", "runner", f"forced: {self.what}; amplified: {self.how}; the read held the poison "
                       f"at {self.hits} of {self.steps} amplified steps, first at step {self.first}{confirmed}")


class HostReadback:
    """The host's read of the last piece's outputs through one reused pinned buffer per output
    and shape: a non-blocking device-to-host copy, a synchronize when `synced`, then the host
    reads (a CPU clone is not ordered after the copy). With `amplify` each buffer is poisoned
    before the copy and the copy's stream is delayed by `delay_us` of device work, so an
    unsynchronised read sees the poison on every step; `log` counts the reads that did.

    Before poisoning, the host waits for the previous read's copies (an earlier step's, into the
    same buffers), so a late copy from step k-1 cannot land over step k's poison; it orders
    nothing of step k's own race."""

    def __init__(self, provider, synced: bool, amplify: bool = True, delay_us: float = 5000):
        self.provider, self.synced, self.amplify, self.delay_us = provider, synced, amplify, delay_us
        self.buffers: dict = {}
        self.log = RaceLog("the host read the pinned output buffers before the device-to-host copy landed",
                           f"pinned buffers poisoned with NaN (integers: their minimum) before each copy, the "
                           f"copy's stream delayed {delay_us:g} us by device work queued before it")
        self._last = None  # event recorded after the previous read's copies

    def _buffer(self, k: str, v: torch.Tensor) -> torch.Tensor:
        key = (k, tuple(v.shape), v.dtype)
        if key not in self.buffers:
            self.buffers[key] = torch.empty(v.shape, dtype=v.dtype, pin_memory=self.provider.device.type != "cpu")
        return self.buffers[key]

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """The device-to-host copy (a test's provider may land it late)."""
        dst.copy_(src, non_blocking=True)

    def read(self, out: dict, step: int = -1) -> dict:
        p = self.provider
        host = {k: self._buffer(k, v) for k, v in out.items()}
        if self.amplify:
            if self._last is not None:
                self._last.synchronize()
            for b in host.values():
                poison_(b)
            device_delay(p.device, self.delay_us)
        for k, v in out.items():
            self.copy(host[k], v)
        if self.amplify:
            self._last = p.new_event()
            self._last.record()
        if self.synced:
            p.synchronize()
        early = self.amplify and not self._last.query()  # the copy had not landed when the host read
        snap = {k: v.clone() for k, v in host.items()}  # the host's read
        if self.amplify:
            self.log.hit(step, any(bool(is_poison(v).any()) for v in snap.values()), early)
        return {k: v.to(out[k].device) for k, v in snap.items()}
