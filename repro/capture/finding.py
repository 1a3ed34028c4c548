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


class Notes:
    """A runner's findings, each (kind, detail) once, in the order first seen."""

    def __init__(self):
        self.items: list[Finding] = []
        self._seen: set = set()

    def add(self, kind: str, island: str, detail: str) -> None:
        if (kind, detail) not in self._seen:
            self._seen.add((kind, detail))
            self.items.append(Finding(kind, island, detail))
