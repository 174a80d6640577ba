"""A sharded ``tf.data`` pipeline built on the core plan (:mod:`hvdsync.core.sharding`)."""
from __future__ import annotations

from typing import Iterator

import tensorflow as tf

from hvdsync.core.loader import PlanLoader
from hvdsync.core.sharding import Step


class ShardedLoader(PlanLoader):
    """This rank's planned steps as a ``tf.data.Dataset``: one element per optimizer step.

    An element is a tuple of ``plan.accumulate`` ``(x, y)`` micro-batches plus the step's ``global_count`` (what
    :func:`hvdsync.core.scaling.loss_scale` needs). Micro-batches on the last step may be smaller, even empty, so
    the batch dimension is ``None``. Every rank gets the same number of steps and micro-batches, so collectives never
    wait on a rank that ran out of data. Iterating the loader itself yields ``(micro_batches, step)`` pairs, like
    :class:`hvdsync.torch.ShardedLoader`; call ``set_epoch(e)`` before each epoch.

    Example:
        >>> loader = ShardedLoader(x, y, ShardPlan(len(x), hvd.size(), 32), hvd.rank())  # doctest: +SKIP
        >>> for micro, global_count in loader.dataset(): ...                             # doctest: +SKIP
    """

    def dataset(self, epoch: int | None = None) -> tf.data.Dataset:
        """The steps of ``epoch`` (default: the one ``set_epoch`` chose), prefetched one step ahead."""
        return self._pipeline(self.steps(epoch))

    def __iter__(self) -> Iterator[tuple[list[tuple[tf.Tensor, tf.Tensor]], Step]]:
        steps = self.steps()
        for (micro, _), step in zip(self._pipeline(steps), steps):
            yield list(micro), step

    def _pipeline(self, steps: list[Step]) -> tf.data.Dataset:
        pair = (tf.TensorSpec((None,) + self.x.shape[1:], tf.as_dtype(self.x.dtype)),
                tf.TensorSpec((None,) + self.y.shape[1:], tf.as_dtype(self.y.dtype)))

        def gather():
            for step in steps:
                yield tuple((self.x[i], self.y[i]) for i in step.micro), step.global_count

        signature = (tuple(pair for _ in range(self.plan.accumulate)), tf.TensorSpec((), tf.int64))
        return tf.data.Dataset.from_generator(gather, output_signature=signature).prefetch(1)
