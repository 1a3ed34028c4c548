"""A kernel finding's own script: `repro_kernel.py` and `kernel_inputs.pt`.

A result holds which kernel call showed its first nondeterminism or batch variance (the
`kernel` of a kernel finding's first divergence), not the call's tensors. They are taken again
here: the case is re-run up to that step, on the run's device (the kernel may exist only there),
with the run's plugins imported and its kernel selection, and `kernelcase.locate` records the
call. This is the one other place a report runs the suite again (`repairs` is the first).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..errors import BadInput
from ..check.kernelcase import INPUTS, SCRIPT, write_kernel_script
from ..graphs import make_provider
from ..islands import Model
from ..job.cases import run_case
from .load import rerun_case, rerun_sequence


@dataclass
class KernelScript:
    finding: dict | None  # the first kernel finding with a located call (JSON), or None
    files: list  # names written
    note: str  # why nothing was written, or ""


def first_kernel_finding(r: dict) -> dict | None:
    found = [v["first"] for v in (r.get("kernel_findings") or {}).values() if (v["first"] or {}).get("kernel")]
    return min(found, key=lambda d: d["step"]) if found else None


def _device(doc: dict) -> str:
    prov = str(doc.get("graph_provider", ""))
    return "cuda" if prov == "cuda" else "xpu" if "xpu" in prov else "cpu"


def make_kernel_script(stage: Path, doc: dict, r: dict, steps: list, seqj: dict, layer, sentinel,
                       title: str) -> KernelScript:
    fd = first_kernel_finding(r)
    if fd is None:
        return KernelScript(None, [], "")
    from kernels import registry

    ck = doc.get("checkpoint")
    if not ck or not Path(ck).is_dir():
        return KernelScript(fd, [], "the checkpoint is not readable here: the kernel's inputs were not recorded")
    try:
        registry.load_plugins(doc.get("plugins") or [])
        provider = make_provider(_device(doc))
        model = Model(ck, provider.device, layer)
    except (BadInput, ValueError) as e:  # a plugin, kernel or device missing here (KernelSelectionError)
        return KernelScript(fd, [], f"not re-run here: {e}")
    upto = [s for i, s in enumerate(steps) if s.get("step", i) <= fd["step"]]
    seq = rerun_sequence(seqj, upto)
    sent = sentinel if sentinel is not None else doc.get("sentinel", 0)
    with registry.using(**(doc.get("kernels") or {})):
        res = run_case(model, provider, rerun_case(r), seq, sentinel=sent)
    entry = res.kernel_findings.get(fd["kind"])
    case = entry["first"].kernel if entry else None
    if case is None:
        return KernelScript(fd, [], f"the re-run up to step {fd['step']} did not show the {fd['kind']} again "
                                    "(a nondeterministic kernel may not vary on every run)")
    return KernelScript(fd, write_kernel_script(case, stage, title), "")


__all__ = ["INPUTS", "SCRIPT", "KernelScript", "first_kernel_finding", "make_kernel_script"]
