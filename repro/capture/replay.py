"""How a captured piece is replayed, and how the host reads the last piece's outputs: the two
places stream hazards live.

`Replayer.replay` replays on the current stream, or (`RunnerOptions.side_stream`) on a side stream
that the main stream reads after, with an event between them only when `event_wait` asks for one.
With the race amplifier on (`race.py`), a side-stream replay's outputs are poisoned on the main
stream first and its stream is delayed by device work, so a reader that is not ordered after the
replay reads the poison on every step; `check` flags it on the reader's stream, with no
synchronisation. `Replayer.read` is the host's read of the outputs (`HostReadback`).
"""
from __future__ import annotations

import torch

from ..knobs.options import HostCopy, RunnerOptions
from .finding import Notes
from .piece import Graph
from ..graphs.poison import is_poison, poison_
from .race import HostReadback, RaceLog, device_delay


class Replayer:
    """Replays pieces for one runner; `opts()` gives the runner's options at each call (a scheduler
    may move the consumer to another stream between steps)."""

    def __init__(self, provider, opts, notes: Notes):
        self.provider, self.opts, self.notes = provider, opts, notes
        amplify_us = opts().amplify_us
        self.side_race = RaceLog(
            "the main stream read graph outputs before the side-stream replay that writes them landed",
            f"outputs poisoned with NaN on the main stream before each replay, the side stream delayed "
            f"{amplify_us:g} us by device work queued before the replay")
        self.host: HostReadback | None = None
        self.replays = 0
        self._side = None
        self.amplified = False  # this step replayed on a delayed side stream
        self._producer_start = None  # timed event before this step's last delayed replay

    def begin_step(self) -> None:
        self.amplified, self._producer_start = False, None

    def replay(self, piece: Graph) -> dict:
        self.replays += 1
        o = self.opts()
        if not o.side_stream:
            return piece.replay()
        p = self.provider
        main = p.current_stream()
        if self._side is None:
            self._side = p.new_stream()
        if o.amplify:
            # On the main stream, so the side stream's wait below orders the replay's writes after
            # it; every output is rewritten by the replay (or, piecewise, `core_out` by the main
            # stream after it: `forward.clear_core_out`).
            for v in piece.outputs.values():
                poison_(v)
            self.amplified = True
        self._side.wait_stream(main)  # inputs were written on the main stream
        with p.stream(self._side):
            if o.amplify:
                # device work queued ahead of the replay: the main stream's consumers, issued
                # microseconds later, run first on every step unless an event orders them after it
                device_delay(p.device, o.amplify_us)
                timed = getattr(p, "timed_event", None)
                if timed is not None:  # the last replay's start: the race log confirms the order with it
                    self._producer_start = timed()
                    self._producer_start.record(self._side)
            out = piece.replay()
        if o.event_wait:
            ev = p.new_event()
            ev.record(self._side)
            main.wait_event(ev)
        else:
            self.notes.add("stream", "runner", "graphs replay on a side stream and their outputs are read on the "
                           "main stream with no event between them")
        return out

    def check(self, step: int, out: dict) -> dict:
        """After an amplified step: a snapshot of what the consumer sees now (views would be read
        later in the queue, when a racing replay may have landed), with the poison flagged on the
        consumer's stream and, where the device can time it, the order confirmed."""
        if not self.amplified:
            return out
        out = {k: v.clone() for k, v in out.items()}
        floats = [is_poison(v).any() for v in out.values() if v.is_floating_point()]
        self.side_race.hit_device(step, torch.stack(floats).any())
        timed = getattr(self.provider, "timed_event", None)
        if timed is not None and self._producer_start is not None:
            read = timed()
            read.record()
            self.side_race.order_device(step, read, self._producer_start)
        return out

    def read(self, out: dict, step: int) -> dict:
        """How the host reads the last piece's outputs (`HostCopy`)."""
        o: RunnerOptions = self.opts()
        if o.host_copy is HostCopy.DIRECT:
            return out
        if self.host is None:
            self.host = HostReadback(self.provider, o.host_copy is HostCopy.ASYNC_SYNCED, o.amplify, o.amplify_us)
        return self.host.read(out, step)

    def findings(self) -> list:
        """What the race amplifier forced (read from the device here)."""
        logs = (self.side_race, self.host.log if self.host else None)
        return [f for f in (log.finding() for log in logs if log) if f is not None]
