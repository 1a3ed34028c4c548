"""vLLM's graph modes (`vllm/config/compilation.py: CUDAGraphMode`) and how a requested mode resolves
for a model whose attention backend captures only uniform batches, as the GDN backend declares.

A mode is a pair: the runtime mode for uniform-decode batches and the one for every other batch.
`NONE`, `PIECEWISE` and `FULL` use one mode for both; `FULL_DECODE_ONLY` is (FULL, NONE) and
`FULL_AND_PIECEWISE` is (FULL, PIECEWISE). In PIECEWISE the GDN core is a splitting op and runs
eagerly between the graphs; a FULL graph holds the whole decode chain, the GDN core's metadata
buffers included.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

from ..errors import BadInput


class Runtime(enum.IntEnum):
    """A step's runtime mode (`CUDAGraphMode.NONE/PIECEWISE/FULL`), ordered as vLLM's DP sync orders them."""
    NONE = 0
    PIECEWISE = 1
    FULL = 2

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class GraphMode:
    """One of vLLM's `CUDAGraphMode` values: (uniform-decode mode, mixed mode)."""
    name: str
    decode: Runtime
    mixed: Runtime

    @property
    def separate_routine(self) -> bool:
        """A pair with its own uniform-decode routine (`CUDAGraphMode.separate_routine`)."""
        return self.name in ("FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")

    def has(self, runtime: Runtime) -> bool:
        return runtime in (self.decode, self.mixed)

    def __str__(self) -> str:
        return self.name


MODES: dict[str, GraphMode] = {m.name: m for m in (
    GraphMode("NONE", Runtime.NONE, Runtime.NONE),
    GraphMode("PIECEWISE", Runtime.PIECEWISE, Runtime.PIECEWISE),
    GraphMode("FULL", Runtime.FULL, Runtime.FULL),
    GraphMode("FULL_DECODE_ONLY", Runtime.FULL, Runtime.NONE),
    GraphMode("FULL_AND_PIECEWISE", Runtime.FULL, Runtime.PIECEWISE),
)}


# What a default run covers: the pieces alone, and vLLM's default for GDN (FULL decode graphs, pieces
# for the rest).
DEFAULT_MODES = ("piecewise", "full_and_piecewise")


def resolve(mode: GraphMode) -> GraphMode:
    """What a GDN model runs when `mode` is asked for (`CompilationConfig.resolve_cudagraph_mode_and_sizes`):
    a FULL mixed mode needs a backend that captures every batch (`AttentionCGSupport.ALWAYS`); the GDN
    backend captures uniform batches only (`GDNAttentionMetadataBuilder._cudagraph_support =
    UNIFORM_BATCH`), and with the attention ops as splitting ops a FULL request becomes
    FULL_AND_PIECEWISE."""
    if mode.mixed is Runtime.FULL:
        return MODES["FULL_AND_PIECEWISE"]
    return mode


def mode_name(text: str) -> str:
    """The resolved mode's name as cases and results spell it (`full` -> `full_and_piecewise`)."""
    return parse_mode(text).name.lower()


def parse_mode(text: str) -> GraphMode:
    """A `--mode` value in vLLM's spelling, in any case (`full_and_piecewise`), resolved for GDN;
    `full` is vLLM's FULL, which resolves to FULL_AND_PIECEWISE."""
    key = text.strip().upper().replace("-", "_")
    if key not in MODES:
        raise BadInput(f"unknown mode {text!r} (choose from {', '.join(m.lower() for m in MODES)})")
    return resolve(MODES[key])
