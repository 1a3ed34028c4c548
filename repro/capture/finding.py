"""A runner finding: something the runner saw that needs no planted hazard to matter (Python state
frozen at capture, an undeclared mutation, pool bytes reused under held outputs, unordered streams,
a race the amplifier forced). Its own module so the runner and the race amplifier share it."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Finding:
    kind: str  # "python-state", "undeclared-mutation", "alias", "stream", "race"
    island: str
    detail: str

    def to_json(self):
        return {"kind": self.kind, "island": self.island, "detail": self.detail}
