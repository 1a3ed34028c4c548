"""Capture sizes and how a step's token count maps onto them (vLLM's capture sizes and padding)."""
from __future__ import annotations

DEFAULT_SIZES = (1, 2, 4, 8, 16)


def pad_size(n: int, sizes) -> int | None:
    """The smallest capture size that holds `n` rows (None: run eagerly)."""
    return next((s for s in sorted(sizes) if s >= n), None)
