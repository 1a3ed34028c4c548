"""The blind hunt: `repro hunt` with no `--hazard` searches a stack profile as it is (no bug
planted, every control rule as the release has it: `--stack S`, the fixed one by default), and
once a failure is shrunk asks which rule is at fault (`blame.py`: each rule where the profile
departs from the fixed form set to its fixed form, the minimal sequence run again) and which
upstream issue that rule maps to. A failure no rule explains, on any profile (the fixed one
departs in none), is said to be so, with the rules in force: a candidate upstream report.

A told hunt (`--hazard H`) plants the bug on the stack in the hazard's mode; a blind hunt only says
where to look: the drafts a decode carries (K, 2 by default, as vLLM #53051's MTP packet ran),
whether an idle data-parallel rank's dummy steps are in the sequences, and, without `--mode`, every
graph mode the profile runs (`Stack.modes`), each example drawing one."""
from __future__ import annotations

from dataclasses import fields

from ..check.compare import Divergence
from ..knobs.modes import mode_name
from ..knobs.stacks import stack as stack_profile
from ..job.cases import run_case, sequence_needs
from ..knobs import hazards as hz
from .blame import Blame, blame

BLIND_SPEC = 2  # a blind hunt's drafts a decode without --spec-tokens (vLLM #53051 ran MTP with k = 2)


def is_blind(o) -> bool:
    """No hazard planted: the stack profile itself is searched (the fixed one too), or the installed
    vLLM as patched under its own decisions (`--control vllm`)."""
    return not o.hazards


def hunt_modes(o, default: str) -> tuple[str, ...]:
    """The modes a hunt searches: the one asked for; else every mode a blind hunt's profile runs
    (`Stack.modes`, its default first); else a told hunt's `default` (its hazard's)."""
    if o.mode:
        return (mode_name(o.mode),)
    return stack_profile(o.stack).modes if is_blind(o) else (default,)


def sequence_shape(o) -> tuple[int, bool]:
    """(K, data_parallel) of the sequences a hunt draws: `--spec-tokens` when given, else the
    hazards' own K (BLIND_SPEC for a blind hunt); dummy steps when a hazard needs them or the
    config asks for them (`data_parallel`)."""
    k, dp = sequence_needs(o.hazards, o.spec_tokens)
    if o.spec_tokens is None and is_blind(o):
        k = BLIND_SPEC
    if o.data_parallel is not None:
        dp = o.data_parallel
    return k, dp


class Found:
    """A finding (an undeclared mutation, a refused replay) as the hunt's target: it has no step, only a line."""

    step = None

    def __init__(self, f: dict):
        self.f = f

    def line(self) -> str:
        return f"finding {self.f['kind']} in {self.f.get('island')}: {self.f['detail']}"


def failure(r):
    """What a hunt counts as failing in a case result: its divergence, else a finding that detects
    a bug, else None."""
    if r.diverged:
        fd = r.first_divergence
        return Divergence(fd["step"], fd["island"], fd["tensor"], fd["row"], fd["request"], fd["slot"],
                          fd["max_abs"], fd.get("context", {}))
    if r.detected and r.findings:  # the finding that detects it, not a note beside it
        return Found(next((f for f in r.findings if f["kind"] in hz.FINDING_KINDS), r.findings[0]))
    return None


def blame_minimal(model, provider, case, seq, sentinel: int) -> Blame:
    """Blame the stack's rules for the minimal sequence's failure: a rule set "still fails" when the
    rerun fails as the hunt counts failing (`failure`). A replay the fixed form of
    `assert_full_past_prompt` refuses (vLLM PR #55123) is a failure too: that assertion turns a
    silent corruption into a loud error, and the rule that dispatched the batch is the one at fault."""
    rules = hz.options_for(case.hazards, case.repairs, case.stack).control

    def fails(r) -> bool:
        return failure(run_case(model, provider, case, seq, sentinel=sentinel, rules=r)) is not None
    return blame(rules, fails)


def blame_json(b: Blame) -> dict:
    return {"rules": list(b.rules), "hazards": list(b.hazards), "upstream": b.upstream, "tried": b.tried}


def rules_in_force(rules) -> str:
    """Every control rule and its setting, as the run had them."""
    return ", ".join(f"{f.name}={getattr(getattr(rules, f.name), 'value', getattr(rules, f.name))}"
                     for f in fields(rules))


def blame_lines(b: Blame, stack: str, rules) -> list[str]:
    """What a blind hunt prints before the minimal sequence: the rule and its upstream issue, or
    that no known rule explains the failure, with the rules in force (`rules`, a `ControlRules`)."""
    lines = [f"blame ({stack}): {b.line()}"]
    if not b.rules:
        lines.append(f"no known rule explains this failure: a candidate upstream report (`repro report` on the saved "
                     f"result writes it up); the rules in force ({stack}): {rules_in_force(rules)}")
    return lines
