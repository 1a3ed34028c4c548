"""Where a case's control decisions come from (`--control`, `--patch`): plain data a case carries.

- `mirror` (the default): the suite's mirror of vLLM's runner (`repro/control`), each rule a setting
  of `ControlRules` that a stack profile, a hazard or a repair sets. Needs no vLLM.
- `vllm`: the installed vLLM's own code for every decision of its V1 model runner
  (`vllm/v1/worker/gpu_model_runner.py`: what 0.33.0 runs without Triton or with
  `VLLM_USE_V2_MODEL_RUNNER=0`, and the runner vLLM PRs #53059, #47123 and #55123 change).
- `vllm-v2`: the installed vLLM's V2 model runner's decisions (`vllm/v1/worker/gpu/`: 0.33.0's
  default where Triton is present, 0.34.0's only runner), where they run on the host.

`patches`: Python files that change the installed vLLM when it is loaded (`repro.upstream.patches`
states the contract), in the order given; only with a vLLM source. Under a vLLM source the stack
profile and the hazards that set control rules do not apply: vLLM's code (as patched) decides.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import BadInput
from .hazards import HAZARDS, REPAIRS

SOURCES = {
    "mirror": "the suite's mirror of vLLM's runner (repro/control), under the stack's rules",
    "vllm": "the installed vLLM's V1 model runner (its own code through repro/upstream)",
    "vllm-v2": "the installed vLLM's V2 model runner (its host-side decisions through repro/upstream)",
}


@dataclass(frozen=True)
class Control:
    source: str = "mirror"
    patches: tuple[str, ...] = ()  # patch files, as the user named them

    def __post_init__(self):
        if self.source not in SOURCES:
            raise BadInput(f"unknown --control {self.source!r} (choose from {', '.join(SOURCES)})")
        if self.patches and self.source == "mirror":
            raise BadInput("--patch changes the installed vLLM: it needs --control vllm or vllm-v2 (the mirror's rules "
                           "are set with --stack, --hazard and --repair)")

    @property
    def upstream(self) -> bool:
        """The decisions are the installed vLLM's."""
        return self.source != "mirror"

    @property
    def runner(self) -> str:
        """vLLM's model runner whose decisions these are: "v1" or "v2" (the mirror mirrors V1's)."""
        return "v2" if self.source == "vllm-v2" else "v1"

    def label(self) -> str:
        """How a result names it: the source, and the patch files' names."""
        names = [p.rsplit("/", 1)[-1].removesuffix(".py") for p in self.patches]
        return self.source + "".join(f"+{n}" for n in names)


def decided_by_vllm(sets: dict) -> bool:
    """A knob (a hazard's or repair's settings) whose mechanism the control path decides: a control
    rule, the builder's padding, the kernels' sentinel. Under a vLLM source vLLM's code decides
    those; the knob is the mirror's."""
    return any(k.startswith("control.") or k in ("runner.pad", "kernel_sentinel") for k in sets)


def check(control: Control, stack: str = "fixed", hazards=(), repairs=(), sentinel: int = 0) -> None:
    """Refuse what a vLLM source cannot honour, in one line: the stack profile (vLLM as installed and
    patched is the stack), a knob vLLM's code decides (`decided_by_vllm`), a sentinel other than vLLM's
    null block 0."""
    if not control.upstream:
        return
    flag = f"--control {control.source}"
    if stack != "fixed":
        raise BadInput(f"--stack {stack}: {flag} runs the installed vLLM's own rules (change them with --patch); "
                       "a stack profile is the mirror's")
    for what, names, table in (("--hazard", hazards, HAZARDS), ("--repair", repairs, REPAIRS)):
        for n in names:
            if n in table and decided_by_vllm(table[n].sets):
                raise BadInput(f"{what} {n}: under {flag} vLLM's own code makes that decision (plant a change to it "
                               "with --patch FILE)")
    if sentinel != 0:
        raise BadInput(f"--sentinel {sentinel}: under {flag} the kernels skip vLLM's null block 0")
