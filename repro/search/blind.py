"""The blind hunt: `repro hunt --stack S` with no `--hazard` searches the stack profile as it is
(no bug planted, every control rule as the release has it), and once a failure is shrunk asks
which rule is at fault (`blame.py`: each rule where the profile departs from the fixed form set
to its fixed form, the minimal sequence run again) and which upstream issue that rule maps to.

A told hunt (`--hazard H`) plants the bug on the stack; a blind hunt only says where to look: the
drafts a decode carries (K, 2 by default, as vLLM #53051's MTP packet ran) and whether an idle
data-parallel rank's dummy steps are in the sequences."""
from __future__ import annotations

from ..check.compare import Divergence
from ..knobs.modes import mode_name
from ..job.cases import run_case, sequence_needs
from ..knobs import hazards as hz
from .blame import Blame, blame

BLIND_SPEC = 2  # a blind hunt's drafts a decode without --spec-tokens (vLLM #53051 ran MTP with k = 2)
BLIND_MODE = "full"  # vLLM's default CUDAGraphMode for these models: FULL_AND_PIECEWISE


def is_blind(o) -> bool:
    """No hazard planted and a stack profile other than the fixed one, or the installed vLLM's own
    decisions (`--control vllm`): the profile, or vLLM as patched, is searched."""
    return not o.hazards and (o.stack != "fixed" or getattr(o, "control", "mirror") != "mirror")


def hunt_mode(o, default: str) -> str:
    """The mode asked for; a blind hunt's default is vLLM's (FULL_AND_PIECEWISE), a told one's `default`."""
    if o.mode:
        return o.mode
    return mode_name(BLIND_MODE) if is_blind(o) else default


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
    if r.detected and r.findings:
        return Found(r.findings[0])
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


def blame_lines(b: Blame, stack: str) -> list[str]:
    """What a blind hunt prints after the minimal sequence: the rule and its upstream issue, or
    that no rule of the profile explains the failure."""
    lines = [f"blame ({stack}): {b.line()}"]
    if not b.rules:
        lines.append("no rule of the stack profile explains this failure: a candidate upstream report "
                     "(`repro report` on the saved result writes it up)")
    return lines
