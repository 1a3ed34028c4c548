"""What every island shares: a name, its weights on a device, named inputs and outputs, the
state it declares it mutates, and the Python-side attributes the graph runtime watches."""
from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

from ..knobs.options import IslandOptions
from ..model.weights import Linear

from kernels._library import namespace as ops  # torch.ops.repro.*, called straight to the body when no mode is on


def linear(x: torch.Tensor, lin: Linear) -> torch.Tensor:
    if lin.quantized:
        return ops.w8a8_linear(x, lin.weight, lin.scale, None)
    return F.linear(x, lin.weight)


class ForwardContext:
    """Per-step host values the runner sets before a call (vLLM's forward context). Reads are
    recorded, so the runner knows which values a capture froze."""

    def __init__(self):
        object.__setattr__(self, "_values", {})
        object.__setattr__(self, "reads", set())

    def __getattr__(self, key):
        self.reads.add(key)
        return self._values.get(key)

    def __setattr__(self, key, value):
        raise AttributeError("use ForwardContext.set(...)")

    def set(self, **values) -> None:
        self._values.update(values)

    def values(self) -> dict:
        return dict(self._values)


class Island:
    """A piece of the model. `forward(**inputs) -> dict[str, Tensor]`, token-major (dim 0)."""

    name = "island"
    inputs: tuple[str, ...] = ()
    outputs: tuple[str, ...] = ()

    def __init__(self):
        # Set by the runner before every call; a graph freezes whatever forward reads from it.
        self.ctx = ForwardContext()
        self.opts = IslandOptions()  # what the case's knobs change in this copy's code
        # A context whose work the capture does not follow (another stream / queue); the
        # runner sets it for the replay copy, eager runs get a no-op.
        self.escape = contextlib.nullcontext

    def state(self) -> dict[str, torch.Tensor]:
        """Tensors this island declares it mutates (by its ops' schemas)."""
        return {}

    def watched(self) -> dict:
        """Python attributes a capture freezes (for the capture-time lint)."""
        return {k: v for k, v in vars(self).items() if isinstance(v, (int, float, bool, str, type(None)))}

    def __call__(self, **inputs) -> dict[str, torch.Tensor]:
        return self.forward(**inputs)
