"""The conv arithmetic both providers share (one float order, so they agree bit for bit)."""
from __future__ import annotations

from typing import Sequence

import torch

from kernels._math import silu


def weight_2d(weight: torch.Tensor) -> torch.Tensor:
    """[C, K] or the checkpoint's [C, 1, K] -> fp32 [C, K]."""
    return weight.reshape(weight.shape[0], weight.shape[-1]).float()


def conv_taps(taps: Sequence[torch.Tensor], w: torch.Tensor) -> torch.Tensor:
    """silu(sum_j w[:, j] * taps[j]) with the sum taken left to right in fp32.

    taps[j]: fp32 [..., C], the input j - (K-1) steps back (taps[K-1] is the current token).
    """
    acc = taps[0] * w[:, 0]
    for j in range(1, len(taps)):
        acc = acc + taps[j] * w[:, j]
    return silu(acc)
