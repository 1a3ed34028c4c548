"""What clears a blind hunt's finding on the installed vLLM: after `repro hunt --control vllm` (no
hazard) shrank a failure of vLLM as installed and patched, each shipped patch (`patches/`) the hunt
did not apply is added on top and the minimal sequence run again, as the mirror's blind hunt sets
each rule to its fixed form (`blame.py`). A patch clears the finding when the rerun fails in no way
(a replay its assertion refuses still fails: that turns a silent fault loud, vLLM PR #55123's kind);
it is named with the change its docstring states. Then, for the V1 runner's decisions, the same
sequence under the V2 runner's (`--control vllm-v2`, 0.33.0's default runner as released): the known
rule of this suite's record that counts a resumed request's recompute as prefill. A finding no
shipped patch clears is a candidate upstream report."""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from ..job.cases import run_case
from ..knobs.control import Control
from ..lockstep.lockstep import REFUSED
from ..upstream.patches import read, shipped
from .blind import failure

V2_RULE = ("the V2 runner's decisions (`gather_batch_req_state`: a request is in its prefill phase until it has "
           "recomputed every token it kept, vLLM PR #51865)")


@dataclass(frozen=True)
class PatchBlame:
    clears: tuple[str, ...]  # shipped patches (paths) whose addition clears the failure
    loud: tuple[str, ...]  # shipped patches whose addition turns it into a refused replay
    tried: tuple[str, ...]  # every shipped patch tried
    titles: dict = field(default_factory=dict)  # path -> the change its docstring names
    v2_clears: bool | None = None  # the V2 runner's decisions clear it (None: not tried)

    def to_json(self) -> dict:
        return {"patches": {"clears": list(self.clears), "loud": list(self.loud), "tried": list(self.tried),
                            "titles": self.titles}, "v2_clears": self.v2_clears,
                "upstream": "; ".join(self.titles[p] for p in self.clears),
                "candidate": not self.clears}

    def lines(self, label: str) -> list[str]:
        name = lambda p: Path(p).stem  # noqa: E731
        if self.clears:
            out = [f"blame ({label}): {name(p)} clears it: {self.titles[p]}" for p in self.clears]
        else:
            out = [f"blame ({label}): no shipped patch clears it (tried {', '.join(map(name, self.tried)) or 'none'})"]
        out += [f"  {name(p)} turns it into a refused replay (a loud error): {self.titles[p]}" for p in self.loud]
        if self.v2_clears is not None:
            out.append(f"  {V2_RULE} {'clear' if self.v2_clears else 'do not clear'} it")
        if not self.clears:
            out.append("a candidate upstream report (`repro report` on the saved result writes it up)")
        return out


def blame_patches(model, provider, case, seq, sentinel: int) -> PatchBlame:
    """Rerun the minimal sequence `seq` of `case` (a vLLM source) with each shipped patch it does not
    apply added, and under the V2 runner (module docstring)."""
    have = {str(Path(p).resolve()) for p in case.control.patches}
    trial = [p for p in shipped() if str(Path(p).resolve()) not in have]
    clears, loud = [], []

    def outcome(control: Control):
        r = run_case(model, provider, replace(case, control=control), seq, sentinel=sentinel)
        return failure(r), any(f.get("kind") == REFUSED for f in r.findings)

    for p in trial:
        fail, refused = outcome(Control(case.control.source, case.control.patches + (p,)))
        if fail is None:
            clears.append(p)
        elif refused:
            loud.append(p)
    v2 = None
    if case.control.runner == "v1":
        v2 = outcome(Control("vllm-v2"))[0] is None
    return PatchBlame(tuple(clears), tuple(loud), tuple(trial), {p: read(p).title for p in trial}, v2)
