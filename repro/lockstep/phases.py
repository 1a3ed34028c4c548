"""Where a lockstep step's time goes, measured without adding a synchronisation."""
from __future__ import annotations

import time

import torch

PHASES = ("prepare", "eager", "replay", "compare", "weights", "read", "oracle", "reference")


class Phases:
    """Where a step's time goes, without adding a synchronisation: device events between phases
    on a GPU (read after the step's one read), host time elsewhere (on the CPU tape the two are
    the same). `prepare` (the next step's host tensors) and `read` are host time: on a GPU they
    overlap device work, so the fractions can add up to more than 1. Steps that captured a graph
    are counted in `us` (the result's eager/replay times) but left out of the steady figures."""

    def __init__(self, device):
        self.device = torch.device(device)
        backend = getattr(torch, self.device.type, None) if self.device.type in ("cuda", "xpu") else None
        self.Event = backend.Event if backend is not None else None
        self.events = self.Event is not None
        self.us = dict.fromkeys(PHASES, 0.0)  # every step
        self.steady = dict.fromkeys(PHASES, 0.0)  # steps that captured nothing
        self.wall = self.steady_wall = 0.0
        self.steps = self.steady_steps = 0
        self._marks: list = []
        self._pool: list = []  # events made once and recorded again each step (a new one costs host time)
        self._step: dict = {}

    def start(self) -> None:
        self._t0 = self._last = time.perf_counter()
        self._step = dict.fromkeys(PHASES, 0.0)
        self._marks = [(None, self._event())] if self.events else []

    def _event(self):
        """The step's next event, recorded now. Safe to record again: `stop` comes after the step's
        read, which synchronises, so every event of the last step has completed."""
        i = len(self._marks)
        if i == len(self._pool):
            self._pool.append(self.Event(enable_timing=True))
        ev = self._pool[i]
        ev.record()
        return ev

    def mark(self, name: str) -> None:
        """End of device phase `name`."""
        if self.events:
            self._marks.append((name, self._event()))
        else:
            now = time.perf_counter()
            self._step[name] += (now - self._last) * 1e6
            self._last = now

    def host(self, name: str, t0: float) -> None:
        """Host phase `name` began at `t0` and ends now."""
        now = time.perf_counter()
        self._step[name] += (now - t0) * 1e6
        if not self.events:
            self._last = now

    def stop(self, steady: bool = True) -> None:
        """After the step's read, every event has completed; a step cut short by an error (a replay
        the runner refused) has not read, so the last event is waited for first (timing an event
        still pending raises). `steady`: no capture in this step."""
        if self._marks:
            self._marks[-1][1].synchronize()
        for (_, a), (name, b) in zip(self._marks, self._marks[1:]):
            self._step[name] += a.elapsed_time(b) * 1e3
        self._marks = []
        wall = time.perf_counter() - self._t0
        self.wall += wall
        self.steps += 1
        for k, v in self._step.items():
            self.us[k] += v
            if steady:
                self.steady[k] += v
        if steady:
            self.steady_wall += wall
            self.steady_steps += 1

    def to_json(self) -> dict:
        """Steady-state figures (steps without a capture) and the whole run's steps/s."""
        n = max(self.steady_steps, 1)
        wall_us = self.steady_wall / n * 1e6
        return {"steps": self.steps, "steady_steps": self.steady_steps,
                "steps_per_s": round(self.steps / self.wall, 2) if self.wall else None,
                "steady_steps_per_s": round(self.steady_steps / self.steady_wall, 2) if self.steady_wall else None,
                "step_us": round(wall_us, 1), "timing": "device events" if self.events else "host clock",
                "us_per_step": {k: round(v / n, 2) for k, v in self.steady.items()},
                "fractions": {k: round(v / n / wall_us, 4) if wall_us else None for k, v in self.steady.items()}}

    def queued(self, name: str, fn, *args):
        """`fn(*args)`, device work: its phase ends at the mark after it."""
        out = fn(*args)
        self.mark(name)
        return out

    def timed(self, name: str, fn, *args):
        """`fn(*args)`, host work: its phase is the host time it took."""
        t = time.perf_counter()
        out = fn(*args)
        self.host(name, t)
        return out
