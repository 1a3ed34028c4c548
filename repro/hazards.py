"""The hazard and repair knobs (DESIGN.md's table). Each names one mechanism in the runner or the
islands; `check` refuses a knob that cannot apply to the chosen island, mode or provider."""
from __future__ import annotations

from dataclasses import dataclass

from .errors import Refused


@dataclass(frozen=True)
class Hazard:
    name: str
    mechanism: str
    repairs: tuple[str, ...]  # any one of these clears it
    modes: tuple[str, ...] = ("piecewise", "full")
    device_only: bool = False
    islands: tuple[str, ...] = ("chain",)
    detected_as: str = "divergence"  # or "finding"
    cases: str = ""


HAZARDS = {h.name: h for h in [
    Hazard("stale-pad", "padded rows keep the last step's state indices and token ids", ("sanitize-pad",),
           modes=("full",), cases="vLLM 37728"),
    Hazard("pad-sentinel-mismatch", "the runner pads state indices with 0, the kernel skips only -1",
           ("sanitize-pad",), modes=("full",), cases="vLLM 35431, 39064"),
    Hazard("shared-pool-weakref", "graph 0's outputs are held by weak reference in the shared pool, so graph 1's "
           "capture places its tensors over them and a reader of graph 0's outputs sees them overwritten",
           ("private-pool", "clone-outputs"), modes=("piecewise",), cases="PyTorch 122192"),
    Hazard("output-alias", "graph 1 (reinplaced by a compiler) adds into graph 0's `residual` output in place",
           ("clone-outputs",), modes=("piecewise",), cases="lab notes 2026-06-14i (graph-0 output alias)"),
    Hazard("fresh-alloc-split-op", "the eager splitting op returns a fresh tensor; graph 1 reads the captured address",
           ("copy-inputs",), modes=("piecewise",), cases="vLLM 37363, 37361, 37395, 53915"),
    Hazard("frozen-python-state", "the MoE trims rows to the forward context's token count, a Python int the "
           "graph freezes at capture", ("recapture", "eager-family=moe"), cases="PyTorch 114844, vLLM 51928"),
    Hazard("undeclared-mutation", "the GDN decode op writes ssm_state but its schema declares no mutation",
           ("declare",), detected_as="finding", cases="torch.library.opcheck"),
    Hazard("side-stream-no-wait", "replay on a side stream, consumer on the main stream without an event",
           ("event-wait",), device_only=True),
    Hazard("async-output-copy", "a non-blocking device-to-host copy of outputs is read before it lands",
           ("sync-output-copy",), device_only=True, cases="lab: VLLM_XPU_SYNC_ASYNC_OUTPUT_COPY"),
    Hazard("escaped-capture", "submod0's z projection is issued on a stream the capture does not follow",
           ("capture-stream", "eager-family=submod0"), modes=("piecewise",),
           cases="PyTorch 196490, auto-round 2206"),
    Hazard("comm-noop-capture", "the all-reduce is a no-op while capturing, so replay never reduces",
           ("eager-family=comm",), islands=("forced_comm",), cases="lab: VLLM_XPU_GRAPH_NOOP_COMM_CAPTURE"),
    Hazard("comm-graph-then-eager", "a replayed captured all-reduce followed by an eager all-reduce", (),
           islands=("forced_comm",), cases="PyTorch 189403"),
    Hazard("allreduce-no-clone", "a registered-buffer all-reduce reads an input buffer that was overwritten",
           ("clone-input",), islands=("forced_comm",), cases="lab: VLLM_XPU_CUSTOM_ALLREDUCE_CLONE_INPUT=0"),
]}

REPAIRS = ("sanitize-pad", "clone-outputs", "private-pool", "copy-inputs", "recapture", "eager-family=moe",
           "eager-family=submod0", "eager-family=submod1", "eager-family=comm", "declare", "event-wait",
           "sync-output-copy", "capture-stream", "clone-input")


def check(hazards, repairs, mode: str, provider_name: str, island: str = "chain") -> None:
    for h in hazards:
        if h not in HAZARDS:
            raise Refused(f"unknown hazard {h!r} (known: {', '.join(HAZARDS)})")
        hz = HAZARDS[h]
        if mode not in hz.modes:
            raise Refused(f"hazard {h} applies to --mode {'/'.join(hz.modes)} only ({hz.mechanism})")
        if hz.device_only and provider_name == "cpu-tape":
            raise Refused(f"hazard {h} needs streams: the CPU tape has none (use --device cuda or xpu)")
        if island not in hz.islands and not (island in ("chain", "gdn_core", "submod0", "submod1") and "chain" in hz.islands):
            raise Refused(f"hazard {h} applies to island {'/'.join(hz.islands)}, not {island}")
    for r in repairs:
        if r not in REPAIRS:
            raise Refused(f"unknown repair {r!r} (known: {', '.join(REPAIRS)})")
        if r in ("event-wait", "sync-output-copy") and provider_name == "cpu-tape":
            raise Refused(f"repair {r} needs streams: the CPU tape has none")
        if r.startswith("eager-family=") and r != "eager-family=comm" and mode == "full":
            raise Refused(f"repair {r}: --mode full captures the decode chain as one graph, so no family "
                          "can run eagerly inside it (use --mode piecewise)")


def cleared_by(hazard: str) -> tuple[str, ...]:
    return HAZARDS[hazard].repairs
