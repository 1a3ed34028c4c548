"""The race amplifier's poison: a recognisable value an early reader gets instead of last step's
values (which may coincide with this step's). Plain tensor functions, so the islands that poison
their own buffers and the runner that poisons graph outputs share them."""
from __future__ import annotations

import torch


def poison_value(dtype: torch.dtype):
    """The value an early read gives: NaN for floats, the minimum for integers, None for bool
    (no value of a bool is recognisable)."""
    if dtype.is_floating_point or dtype.is_complex:
        return float("nan")
    if dtype == torch.bool:
        return None
    return torch.iinfo(dtype).min


def poison_(t: torch.Tensor) -> torch.Tensor:
    """Fill `t` with its dtype's poison (in place, on the current stream for a device tensor)."""
    v = poison_value(t.dtype)
    if v is not None:
        t.fill_(v)
    return t


def is_poison(t: torch.Tensor) -> torch.Tensor:
    """Elementwise: holds the poison."""
    v = poison_value(t.dtype)
    if v is None:
        return torch.zeros_like(t, dtype=torch.bool)
    return torch.isnan(t) if isinstance(v, float) else t == v
