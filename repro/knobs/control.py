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
