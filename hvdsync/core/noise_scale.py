"""The gradient noise scale (McCandlish et al. 2018, "An Empirical Model of Large-Batch Training", appendix A).

The simple noise scale ``B_noise = tr(Σ) / |G|²`` (Σ: the per-sample gradient covariance, G: the true gradient) is
the batch size past which a larger batch stops cutting the number of steps nearly in proportion: the batch a
growing-batch rule should aim for. Data-parallel training already has what it needs, at no extra communication
beyond one small all-gather: each rank's gradient over its own ``B_small`` samples (before the all-reduce) and the
all-reduced gradient over the global ``B_big`` samples. For a mean over ``B`` samples,
``E|g_B|² = |G|² + tr(Σ) / B``, so two batch sizes give two unbiased estimates:

    |G|²   ≈ (B_big |g_big|² - B_small |g_small|²) / (B_big - B_small)
    tr(Σ)  ≈ (|g_small|² - |g_big|²) / (1 / B_small - 1 / B_big)

Each is noisy from one step, so :class:`NoiseScale` keeps exponential moving averages of both and divides the
averages (the paper's advice: the ratio of averages, not the average of ratios). Framework-free: it takes squared
norms as floats.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np


def noise_estimates(small_sq_norms: Sequence[float], small_batch: float, big_sq_norm: float,
                    big_batch: float) -> tuple[float, float]:
    """One step's unbiased estimates ``(|G|², tr(Σ))``.

    Args:
        small_sq_norms: each rank's squared gradient norm over its own ``small_batch`` samples (all-gathered);
            their mean is the small-batch estimate.
        big_sq_norm: the squared norm of the all-reduced (averaged) gradient over ``big_batch`` samples.

    Example:
        >>> noise_estimates([2.0, 2.0], 10, 1.1, 20)   # |G|² = 0.2, tr(Σ) = 18
        (0.2, 18.0)
    """
    if not 0 < small_batch < big_batch:
        raise ValueError(f"small_batch, big_batch: {small_batch!r}, {big_batch!r} are not allowed; expected "
                         "0 < small_batch < big_batch (the per-rank and the global batch)")
    small = float(np.mean(np.asarray(small_sq_norms, dtype=np.float64)))
    g2 = (big_batch * big_sq_norm - small_batch * small) / (big_batch - small_batch)
    trace = (small - big_sq_norm) / (1.0 / small_batch - 1.0 / big_batch)
    return round(float(g2), 12), round(float(trace), 12)


class NoiseScale:
    """Moving averages of ``|G|²`` and ``tr(Σ)`` over steps, and ``B_noise`` from them.

    Args:
        decay: the averages' weight on the past per step (0.95: about the last 20 steps count).

    Example:
        >>> ns = NoiseScale()
        >>> ns.update([2.0, 2.0], 10, 1.1, 20)
        >>> round(ns.b_noise, 6)
        90.0
    """

    def __init__(self, decay: float = 0.95) -> None:
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"decay: {decay!r} is not allowed; expected 0 <= decay < 1")
        self.decay = decay
        self._g2 = self._trace = 0.0
        self._weight = 0.0  # the sum of the averages' weights: divides out the start at zero (bias correction)

    def update(self, small_sq_norms: Sequence[float], small_batch: float, big_sq_norm: float,
               big_batch: float) -> None:
        """Add one step (the arguments of :func:`noise_estimates`)."""
        g2, trace = noise_estimates(small_sq_norms, small_batch, big_sq_norm, big_batch)
        d = self.decay
        self._g2, self._trace = d * self._g2 + (1 - d) * g2, d * self._trace + (1 - d) * trace
        self._weight = d * self._weight + (1 - d)

    @property
    def b_noise(self) -> float:
        """``tr(Σ) / |G|²`` from the averages; ``inf`` while the averaged ``|G|²`` is not positive (noise only)."""
        if self._weight == 0.0:
            raise ValueError("b_noise: no step was added yet; call update() first")
        g2 = self._g2 / self._weight
        return float(self._trace / self._weight / g2) if g2 > 0 else float("inf")
