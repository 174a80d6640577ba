"""Cross-rank consistency: are all ranks still training the same model?

A parameter fingerprint is a few float64 numbers per rank (sum, sum of squares, a position-weighted sum over
every parameter). Ranks all-gather them; any difference means a rank diverged (a missed broadcast, a codec bug,
a non-deterministic op that is not synchronised). Cheap enough to check every epoch.
"""
from __future__ import annotations

from typing import Iterable

import numpy as np


def fingerprint(params: Iterable[np.ndarray]) -> np.ndarray:
    """``[sum, sum of squares, position-weighted sum]`` over all parameters, in float64."""
    total = np.zeros(3, dtype=np.float64)
    offset = 0
    for p in params:
        flat = np.asarray(p, dtype=np.float64).ravel()
        weights = np.arange(offset + 1, offset + flat.size + 1, dtype=np.float64) / 1e6
        total += (flat.sum(), np.square(flat).sum(), (flat * weights).sum())
        offset += flat.size
    return total


def spread(gathered: np.ndarray) -> float:
    """Largest difference between any two ranks' rows of an all-gathered ``(world_size, ...)`` array."""
    gathered = np.asarray(gathered, dtype=np.float64)
    return float(np.max(gathered.max(axis=0) - gathered.min(axis=0))) if gathered.size else 0.0
