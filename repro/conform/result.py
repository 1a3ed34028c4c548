"""What one rule's comparison found: calls tried, differences, and the first of each spelled out.

A `RuleResult` holds one rule of the mirror compared with vLLM's function for it over every call a
family made: after each call, each field both sides return (or hold) is compared with `==`; a
difference is either explained (one of `explain.EXPLAINED`: a field the mirror computes for nothing
that reads it, or a deliberate start value, each with why it cannot change a verdict) or
unexplained, which fails a conformance run.
"""
from __future__ import annotations

import enum
from collections import Counter
from dataclasses import dataclass, field


def show(v) -> str:
    """A compared value as the table spells it: an enum by its name, anything else by its repr."""
    return v.name if isinstance(v, enum.Enum) else repr(v)


@dataclass(frozen=True)
class Difference:
    call: str  # the call, with its inputs and the case it ran under
    field: str
    vllm: object
    mirror: object

    def line(self) -> str:
        return f"{self.call}: {self.field} is {show(self.vllm)} in vLLM, {show(self.mirror)} in the mirror"

    def to_json(self) -> dict:
        return {"call": self.call, "field": self.field, "vllm": show(self.vllm), "mirror": show(self.mirror)}


@dataclass
class RuleResult:
    rule: str  # the mirror's rule
    function: str  # vLLM's function that decides it ("file: qualname")
    mirror: str  # the mirror's function
    calls: int = 0
    unexplained: int = 0
    first: Difference | None = None  # the first unexplained difference
    explained: Counter = field(default_factory=Counter)  # explanation key -> differences
    first_explained: dict = field(default_factory=dict)  # explanation key -> its first difference
    refused: int = 0  # inputs vLLM refuses (a config it rejects): not compared, counted
    refusal: str | None = None  # the first refusal's message

    def compare(self, call, pairs: dict, explain=None) -> bool:
        """One call: `pairs` maps each field to (vLLM's value, the mirror's); `explain(field, vllm,
        mirror)` names the explanation of a difference or returns None. `call` is a string or a
        function making it (spelled out only when something differs). True when nothing is
        unexplained."""
        self.calls += 1
        ok = True
        for name, (theirs, ours) in pairs.items():
            if theirs == ours:
                continue
            text = call() if callable(call) else call
            key = explain(name, theirs, ours) if explain else None
            d = Difference(text, name, theirs, ours)
            if key:
                self.explained[key] += 1
                self.first_explained.setdefault(key, d)
                continue
            ok = False
            self.unexplained += 1
            if self.first is None:
                self.first = d
        return ok

    def refuse(self, message: str) -> None:
        self.refused += 1
        if self.refusal is None:
            self.refusal = message.splitlines()[0][:200]

    def to_json(self) -> dict:
        return {"rule": self.rule, "vllm_function": self.function, "mirror_function": self.mirror,
                "calls": self.calls, "differences": self.unexplained,
                "first_difference": self.first.to_json() if self.first else None,
                "explained": dict(self.explained),
                "first_explained": {k: d.to_json() for k, d in self.first_explained.items()},
                "refused": self.refused, "refusal": self.refusal}
