"""The runners' control paths from the installed vLLM (`repro.capture.control` says what a path
answers): `VllmPaths` is what a case with `--control vllm` or `vllm-v2` hands its runners.

`VllmPaths(control, checkpoint, ...)` is a context manager: entered, it loads vLLM (`load.load()`)
and applies the case's patch files (`patches.applied`) for as long as the case runs; `graph(...)`
makes a replay copy's path (`v1.V1Path` or `v2.V2Path`) over a `VllmConfig` of the runner's
geometry (mode, K, capture sizes, sequences, step budget, the case's block size), and `eager(...)`
an eager copy's (the same config with `cudagraph_mode=NONE`: a builder that never stages).

vLLM pads with its null block (`NULL_BLOCK_ID` 0) and chooses its own capture sizes where none are
asked for: a runner whose sentinel or pad rule says otherwise is refused (a hazard that changes
them is a mirror knob: under vLLM, change vLLM with a patch).
"""
from __future__ import annotations

from pathlib import Path

from ..control.shape import StepShape
from ..errors import BadInput
from ..knobs.control import Control
from .case import Case
from .config import vllm_config
from .load import TOX_ENV, UpstreamMissing, installed, load, why_not
from .metadata import NULL_BLOCK_ID
from .patches import applied, read
from .v1 import V1EagerPath, V1Path
from .v2 import V2EagerPath, V2Path


DRIVES = "0.33.0"  # the release whose model runners `v1.py` and `v2.py` drive


class VllmPaths:
    """The installed vLLM's control paths for one case (module docstring). `checkpoint`: the model
    folder the config reads; `block_size`: the case's (None: mamba cache mode "none")."""

    def __init__(self, control: Control, checkpoint: Path, block_size: int | None = None, max_model_len: int = 4096):
        self.control, self.checkpoint, self.block_size, self.max_model_len = control, checkpoint, block_size, \
            max_model_len
        self.source = control.source
        for p in control.patches:  # refused before any work: the contract needs no vLLM
            read(p)
        self.up = None
        self._patched = None

    def __enter__(self) -> "VllmPaths":
        self.up = load()
        self._patched = applied(self.up, self.control.patches)
        self._patched.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._patched.__exit__(*exc)

    def config(self, mode: str, shape: StepShape):
        case = Case(mode=mode, spec_tokens=shape.spec_tokens, sizes=shape.sizes, max_num_seqs=shape.max_num_seqs,
                    max_num_batched_tokens=shape.max_tokens, block_size=self.block_size, checkpoint=self.checkpoint,
                    max_model_len=self.max_model_len)
        return vllm_config(self.up, case)

    def graph(self, mode, shape: StepShape, device, sentinel: int, pad: int | None):
        if sentinel != NULL_BLOCK_ID or pad != NULL_BLOCK_ID:
            raise BadInput(f"--control {self.source}: vLLM pads with its null block {NULL_BLOCK_ID} and its kernels skip "
                           f"it (this run pads with {pad}, sentinel {sentinel}); a pad or sentinel hazard is a mirror "
                           "knob")
        cfg = self.config(mode.name, shape)
        if self.control.runner == "v2":
            return V2Path(self.up, cfg, device)
        return V1Path(self.up, cfg, device)

    def eager(self, spec_tokens: int, device, sentinel: int):
        cfg = self.config("none", StepShape(spec_tokens))  # the eager copy's: nothing captured
        return (V2EagerPath if self.control.runner == "v2" else V1EagerPath)(self.up, cfg, device)


def why_not_drive() -> str | None:
    """Why a vLLM control source would be refused here (one line), or None: vLLM missing, or a release
    other than `DRIVES` (the runners' decisions are rebuilt around 0.33.0's V1 and V2 model runners;
    0.26.0's seam serves the conformance run and its scheduler only)."""
    problem = why_not()
    if problem is None and installed() != DRIVES:
        problem = (f"vLLM {installed()} is installed; the runners' decisions are driven from vLLM {DRIVES}'s model "
                   f"runners (`tox -e {TOX_ENV[DRIVES]}`)")
    return problem


def ready(control: Control) -> None:
    """Refuse, before any work, a vLLM source where vLLM is missing or another release than `DRIVES`
    (one line naming the tox environment that installs it) or a patch file that breaks the contract
    (`patches.read`)."""
    if not control.upstream:
        return
    problem = why_not_drive()
    if problem:
        raise UpstreamMissing(f"--control {control.source}: {problem}")
    for p in control.patches:
        read(p)


def control_json(control: Control) -> dict:
    """What a result file records of its control source: nothing for the mirror (its files keep their
    keys), else the source, the vLLM release and each patch's path and title."""
    if not control.upstream:
        return {}
    return {"control": control.source, "vllm": installed(),
            "patches": [{"path": p, "title": read(p).title} for p in control.patches]}
