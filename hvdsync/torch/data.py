"""A sharded loader for PyTorch built on the core plan (:mod:`hvdsync.core.sharding`)."""
from __future__ import annotations

from typing import Iterator

import torch

from hvdsync.core.loader import PlanLoader
from hvdsync.core.sharding import Step


class ShardedLoader(PlanLoader):
    """Yields this rank's planned steps as tensors: ``(micro_batches, step)`` per optimizer step.

    ``micro_batches`` is a list of ``plan.accumulate`` ``(x, y)`` tensor pairs (zero-copy views of the numpy
    arrays); ``step.global_count`` is what :func:`hvdsync.core.scaling.loss_scale` needs. Every rank gets the same
    number of steps and micro-batches, so collectives never wait on a rank that ran out of data. Call
    ``set_epoch(e)`` before each epoch (like ``DistributedSampler``).

    Example:
        >>> loader = ShardedLoader(x, y, ShardPlan(len(x), hvd.size(), 32), hvd.rank())  # doctest: +SKIP
        >>> for micro, step in loader: ...                                               # doctest: +SKIP
    """

    def __iter__(self) -> Iterator[tuple[list[tuple[torch.Tensor, torch.Tensor]], Step]]:
        for step in self.steps():
            yield [(torch.from_numpy(self.x[i]), torch.from_numpy(self.y[i])) for i in step.micro], step
