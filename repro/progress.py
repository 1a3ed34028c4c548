"""Progress of long work on stderr, so a 90-230 s run (or a hung rank) is never silent.

On a terminal: one bar, redrawn in place and erased (`clear`) before anything else prints, so
the results table never starts on the bar's line. Without a terminal (CI logs, pipes): one plain
line per finished case, never a carriage return.

Callers (the run loop, hunt, the TP supervisor) use the same three calls:

    p = progress.for_cases(n)              # n cases ahead
    step_cb = p.start("chain full stale-pad")   # returns f(done, total) for per-step updates
    ...
    p.finish("detected")                   # one line per case without a terminal
    p.clear()                              # before printing the table
"""
from __future__ import annotations

import sys
import time


class Progress:
    """Progress over `total` cases on `stream` (stderr). `tty` None: ask the stream."""

    WIDTH = 24

    def __init__(self, total: int, stream=None, tty: bool | None = None, quiet: bool = False):
        self.total = total
        self.stream = stream or sys.stderr
        self.tty = (self.stream.isatty() if hasattr(self.stream, "isatty") else False) if tty is None else tty
        self.quiet = quiet
        self.index = 0
        self.label = ""
        self.t0 = time.monotonic()
        self._drawn = 0  # characters of the bar on screen

    def start(self, label: str):
        """A case begins; returns the per-step callback `f(done, total)` (None when it would do nothing)."""
        self.index += 1
        self.label = label
        self.t0 = time.monotonic()
        if self.quiet or not self.tty:
            return None
        self._draw(0, 0)
        return self._draw

    def _draw(self, done: int, total: int) -> None:
        k = int(self.WIDTH * done / total) if total else 0
        bar = f"[{self.index}/{self.total}] {self.label[:40]} [{'#' * k}{'.' * (self.WIDTH - k)}] {done}/{total or '?'}"
        pad = max(0, self._drawn - len(bar))
        self.stream.write("\r" + bar + " " * pad)
        self.stream.flush()
        self._drawn = len(bar)

    def finish(self, outcome: str = "done") -> None:
        """A case ended: without a terminal, one line `[i/n] label: outcome (s)`."""
        if self.quiet:
            return
        if self.tty:
            self.clear()
            return
        self.stream.write(f"repro: [{self.index}/{self.total}] {self.label}: {outcome} "
                          f"({time.monotonic() - self.t0:.1f} s)\n")
        self.stream.flush()

    def clear(self) -> None:
        """Erase the bar (terminal only), so the next output starts on a clean line."""
        if self.tty and self._drawn:
            self.stream.write("\r" + " " * self._drawn + "\r")
            self.stream.flush()
            self._drawn = 0


def for_cases(n: int, stream=None, tty: bool | None = None, quiet: bool = False) -> Progress:
    """The one entry point: progress over `n` cases."""
    return Progress(n, stream=stream, tty=tty, quiet=quiet)
