"""Batch-norm statistics of a batch spread over ranks, from one all-reduce of per-rank sums.

Each rank reduces its share to per-channel ``[sum, sum of squares, count]``; one all-reduce (sum) of that stack
gives the global sums, and this turns them into the mean and variance of the whole global batch. Summing counts
(rather than averaging each rank's mean) keeps the result exact when ranks hold different, even zero, numbers of
samples, as on the last step of an epoch (see :mod:`hvdsync.core.train._plan`). Works on numpy arrays and on both
frameworks' tensors: the adapter passes its element-wise ``maximum``.
"""
from __future__ import annotations

from typing import Any, Callable


def global_moments(total: Any, maximum: Callable[[Any, Any], Any]) -> tuple[Any, Any]:
    """``(mean, variance)`` from all-reduced ``total = stack([sum, sum_of_squares, count])`` (per channel)."""
    count = maximum(total[2], 1.0)  # no sample anywhere: zero statistics rather than NaN
    mean = total[0] / count
    # Var[x] = E[x^2] - E[x]^2 (what a single reduction round allows); clipped at 0 against rounding.
    variance = maximum(total[1] / count - mean * mean, 0.0)
    return mean, variance


def whole_batches(data, world: int, batch_sizes) -> Any:
    """``data`` (a :class:`~hvdsync.core.train.data.Dataset`) with its training set cut to a multiple of every global
    batch ``world * b``: no rank then gets a one-sample last batch, which local batch norm cannot normalise (PyTorch
    refuses it in training; a variance of one sample is 0)."""
    import dataclasses

    import numpy as np

    step = world * int(np.lcm.reduce([int(b) for b in batch_sizes]))
    keep = len(data.x_train) - len(data.x_train) % step
    return dataclasses.replace(data, x_train=data.x_train[:keep], y_train=data.y_train[:keep])
