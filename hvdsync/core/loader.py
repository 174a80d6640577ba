"""The framework-free half of a sharded loader: which planned steps this rank reads in which epoch.

An adapter's ``ShardedLoader`` subclasses :class:`PlanLoader` and only turns the planned index arrays into its
framework's tensors (``hvdsync/tensorflow/data.py``: a ``tf.data`` pipeline).
"""
from __future__ import annotations

import numpy as np

from hvdsync.core.sharding import ShardPlan, Step


class PlanLoader:
    """Arrays ``x``, ``y`` read by ``rank`` as ``plan`` says; ``set_epoch(e)`` before each epoch (like
    ``DistributedSampler``) picks that epoch's order."""

    def __init__(self, x: np.ndarray, y: np.ndarray, plan: ShardPlan, rank: int) -> None:
        self.x, self.y, self.plan, self.rank, self.epoch = x, y, plan, rank, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.plan.steps_per_epoch()

    def steps(self, epoch: int | None = None) -> list[Step]:
        """This rank's steps in ``epoch`` (default: the one ``set_epoch`` chose)."""
        return self.plan.epoch(self.epoch if epoch is None else epoch, self.rank)
