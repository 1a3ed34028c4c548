"""Which rule of a stack is at fault: after a blind hunt shrank a failure on a stack profile, each
rule where the profile departs from the fixed form is set to its fixed form and the minimal
sequence run again, one rule at a time, then pairs (a delta-debugging pass over the rules); the
smallest sets that clear the failure are the faulty rules, and the hazards that set any of those
rules name the upstream bug. A failure no set of rules clears is a candidate upstream report."""
from __future__ import annotations

from dataclasses import dataclass, replace
from itertools import combinations

from ..knobs.hazards import HAZARDS
from ..knobs.options import ControlRules
from ..knobs.stacks import differs


@dataclass(frozen=True)
class Blame:
    rules: tuple[str, ...]  # the rules whose fixed forms clear the failure (empty: none does)
    hazards: tuple[str, ...]  # the public record's hazards that set any of those rules
    upstream: str  # their upstream issues, or what to do with an unexplained failure
    tried: int  # minimal-sequence runs made

    def line(self) -> str:
        if not self.rules and not self.tried:
            return "no rule of the stack explains it (it departs from the fixed form in none): a candidate upstream report"
        if not self.rules:
            return (f"no rule of the stack explains it ({self.tried} runs, each rule and pair set to its fixed form): "
                    "a candidate upstream report")
        return (f"rule {' + '.join(self.rules)} (its fixed form clears the failure; {self.tried} runs): "
                f"{self.upstream or 'no hazard of the public record sets it'}")


def fixed_form(rules: ControlRules, names) -> ControlRules:
    """`rules` with the named rules set as the fixed stack has them."""
    fixed = ControlRules()
    return replace(rules, **{n: getattr(fixed, n) for n in names})


def explain(names) -> tuple[tuple[str, ...], str]:
    """The record hazards that set any of the rules `names`, and their upstream issues. Any, not
    all: a hazard may set a rule and its guard together (shape-only uniform decode and no FULL
    replay assertion, vLLM #53051), and the blame names the rule alone when the guard only turns
    the failure into a refused replay."""
    hit = [h for h in HAZARDS.values() if h.record and set(h.rules) & set(names)]
    return tuple(h.name for h in hit), "; ".join(f"{h.cases} (hazard {h.name})" for h in hit)


def blame(rules: ControlRules, fails) -> Blame:
    """`fails(rules) -> bool`: the minimal sequence still fails under these rules."""
    suspects = differs(rules)
    tried = 0
    for size in (1, 2):
        found = []
        for combo in combinations(suspects, size):
            tried += 1
            if not fails(fixed_form(rules, combo)):
                found.append(combo)
        if found:
            names = tuple(dict.fromkeys(n for combo in found for n in combo))
            hazards, upstream = explain(names)
            return Blame(names, hazards, upstream, tried)
    return Blame((), (), "", tried)
