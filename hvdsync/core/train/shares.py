"""Unequal shares of a global step (stragglers) and a global batch that grows over training: the maths.

Straggler-aware shares. In lock-step training every global step waits for the slowest rank. If rank r reads
``shares[r]`` of each global step instead of ``1 / W``, and the shares follow the ranks' measured throughput
(samples per second of *work*: a step's time minus its wait in the all-reduce, from the phase timers), every rank
finishes its piece at about the same time. :class:`~hvdsync.core.train._plan.ShardPlan` cuts each global step by the
shares (:func:`split_counts`); nothing else changes: the same global step (so the same update), the same number of
steps and micro-batches on every rank (so no rank waits in an all-reduce another never joins), every sample once per
epoch, and the loss scale already weighs each rank by its local count (``Step.weight``, summing to one).

:func:`balanced_shares` turns all-gathered ``(samples, work seconds)`` into shares. Every rank computes them from
the same gathered numbers with the same arithmetic, so the plans agree bit for bit without a broadcast.
:class:`hvdsync.core.train.adaptive.AdaptiveShares` does it at every epoch boundary in the shared loop; the samplers'
``rebalance(work_seconds)`` does it in a user's own loop.

A growing batch. ``growth`` lists ``(epoch, factor)``: from that epoch on each rank's batch is ``factor`` times
``data.batch_size`` (Smith et al. 2018, "Don't decay the learning rate, increase the batch size"); the epoch then has
``factor`` times fewer steps, hence fewer all-reduces. The learning rate follows by
:func:`hvdsync.core.train._scaling.grown_lr` (``linear`` or ``sqrt``).
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

SHARE_RULES = ("equal", "adaptive")
# A rank's share never drops below this fraction of an equal share: it keeps reading (so its throughput stays
# measured and it can win its samples back when it recovers), and a wild measurement cannot starve it.
MIN_SHARE_OF_EQUAL = 0.2


def check_shares(name: str, shares: Sequence[float], world_size: int) -> tuple[float, ...]:
    """``shares`` as a tuple normalised to sum to one; fails naming ``name`` when they cannot be shares."""
    try:
        values = np.asarray([float(x) for x in shares], dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{name}: {shares!r} is not allowed; expected {world_size} non-negative numbers") from None
    if len(values) != world_size or not np.all(np.isfinite(values)) or np.any(values < 0) or values.sum() <= 0:
        raise ValueError(f"{name}: {tuple(shares)!r} is not allowed; expected {world_size} non-negative numbers "
                         "(one per rank) with a positive sum")
    return tuple(float(x) for x in values / values.sum())


def parse_growth(name: str, growth: Any) -> tuple[tuple[int, int], ...]:
    """A batch schedule as sorted ``((epoch, factor), ...)``, from a mapping ``{epoch: factor}`` (what a YAML config
    holds: ``data.batch_growth: {2: 2, 4: 4}``) or pairs. Epochs are integers >= 1 (epoch 0 runs ``batch_size``),
    factors integers >= 1 that never shrink the batch.

    Example:
        >>> parse_growth("data.batch_growth", {4: 4, 2: 2})
        ((2, 2), (4, 4))
    """
    items = list(growth.items()) if isinstance(growth, Mapping) else growth
    try:
        pairs = sorted((e, f) for e, f in items)
    except (TypeError, ValueError):
        raise ValueError(f"{name}: {growth!r} is not allowed; expected a mapping of epoch to batch factor, "
                         "e.g. {2: 2, 4: 4}") from None
    last = 1
    for epoch, factor in pairs:
        for what, value, low in (("epoch", epoch, 1), ("factor", factor, 1)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
                raise ValueError(f"{name}: {growth!r} is not allowed; each {what} must be an integer >= {low} "
                                 "(e.g. {2: 2, 4: 4}: twice the batch from epoch 2, four times from epoch 4)")
        if factor < last:
            raise ValueError(f"{name}: {growth!r} is not allowed; the batch factor must not shrink over the epochs")
        last = factor
    return tuple((int(e), int(f)) for e, f in pairs)


def split_counts(total: int, shares: Sequence[float]) -> np.ndarray:
    """``total`` samples cut by ``shares`` (largest remainders; ties go to the lower rank): integers summing to
    ``total``, each within one of ``total * share``. Equal shares give the same sizes as ``numpy.array_split``.

    Example:
        >>> split_counts(10, (2 / 3, 1 / 3)).tolist()
        [7, 3]
    """
    exact = np.asarray(shares, dtype=np.float64) * total
    counts = np.floor(exact + 1e-9).astype(np.int64)  # 1e-9: 0.1 * 30 must be 3, not 2.999...
    left = int(total - counts.sum())
    if left > 0:
        # stable sort: among equal remainders the lower rank comes first
        counts[np.argsort(-(exact - counts), kind="stable")[:left]] += 1
    return counts


def share_slice(total: int, rank: int, world_size: int, shares: Sequence[float] | None = None) -> slice:
    """Rank ``rank``'s contiguous part of ``total`` items cut by ``shares`` (:func:`split_counts`; equal when None):
    how a rank's part of the test set follows the shares of its training steps.

    Example:
        >>> share_slice(10, 1, 2, (2 / 3, 1 / 3))
        slice(7, 10, None)
    """
    weights = np.ones(world_size) if shares is None else np.asarray(shares, dtype=np.float64)
    counts = split_counts(total, weights / weights.sum())  # split_counts needs shares that sum to one
    start = int(counts[:rank].sum())
    return slice(start, start + int(counts[rank]))


def balanced_shares(samples: Sequence[float], seconds: Sequence[float],
                    previous: Sequence[float] | None = None) -> tuple[float, ...]:
    """Shares proportional to each rank's throughput, ``samples[r] / seconds[r]`` of work.

    Args:
        samples: samples each rank read in the measured interval (all-gathered: the same array on every rank).
        seconds: each rank's work seconds in it (reading, forward and backward; not the all-reduce wait).
        previous: the shares in force; kept for a rank that has no measurement (it read nothing, or took no time).

    Each share is at least :data:`MIN_SHARE_OF_EQUAL` of an equal share. The result is rounded to 1e-9 so that it
    prints and records cleanly; every rank computes it from the same numbers, so all ranks agree.

    Example:
        >>> balanced_shares([100, 100], [1.0, 2.0])   # rank 1 is twice as slow
        (0.666666667, 0.333333333)
    """
    samples = np.asarray(samples, dtype=np.float64)
    seconds = np.asarray(seconds, dtype=np.float64)
    world = len(samples)
    prev = np.full(world, 1.0 / world) if previous is None else np.asarray(previous, dtype=np.float64)
    measured = (samples > 0) & (seconds > 0)
    if not measured.any():
        return tuple(float(x) for x in prev)
    rate = np.where(measured, samples / np.where(measured, seconds, 1.0), 0.0)
    # A rank without a measurement keeps its previous share; the measured ones split the rest by throughput.
    rest = 1.0 - prev[~measured].sum()
    shares = np.where(measured, rest * rate / rate[measured].sum(), prev)
    floor = MIN_SHARE_OF_EQUAL / world
    if np.any(shares < floor):
        low = shares < floor
        shares = np.where(low, floor, shares * (1.0 - floor * low.sum()) / shares[~low].sum())
    shares = np.round(shares / shares.sum(), 9)
    return tuple(float(x) for x in shares)


def local_weights(steps: Sequence[Any]) -> np.ndarray:
    """Each rank's weight in one global step (``steps[r]`` is rank r's :class:`~hvdsync.core.train._plan.Step`): its
    samples over the step's. They sum to one; the loss scale gives each rank's summed loss exactly this weight."""
    return np.array([s.weight for s in steps], dtype=np.float64)


def rebalanced(plan: Any, epoch: int, rank: int, work_seconds: float, allgather: Any) -> tuple[float, ...]:
    """The shares for the next epoch from this rank's ``work_seconds`` in ``epoch`` (a user's own loop).

    Every rank calls it at the same point (it all-gathers): the samples each rank read in ``epoch`` come from the
    plan, the work seconds from the caller (reading, forward and backward, not the all-reduce wait: the phases of a
    :class:`~hvdsync.core.telemetry.profiling.PhaseTimer`).

    Args:
        plan: the :class:`~hvdsync.core.train._plan.ShardPlan` that ``epoch`` ran with.
        allgather: ``allgather(np.ndarray) -> np.ndarray`` of shape ``(world_size, 2)``.
    """
    samples = sum(s.local_count for s in plan.epoch(epoch, rank))
    gathered = np.asarray(allgather(np.array([samples, work_seconds], dtype=np.float64))).reshape(-1, 2)
    return balanced_shares(gathered[:, 0], gathered[:, 1], previous=plan.shares)
