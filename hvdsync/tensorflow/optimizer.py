"""A distributed optimizer for Keras 3 configured from :class:`hvdsync.config.SyncConfig`, and the rank-0 broadcast.

Horovod 0.28.1's ``DistributedOptimizer``/``DistributedGradientTape`` fail on Keras 3 variables and cannot
accumulate; this is the same idea on Horovod's low-level ``grouped_allreduce``. Everything here works eagerly and
inside ``tf.function``.
"""
from __future__ import annotations

from typing import Iterable, Sequence

import horovod.tensorflow as hvd
import keras
import tensorflow as tf

from hvdsync.core.codecs import WireCounter
from hvdsync.tensorflow.compression import make_reducer


def allreduce_gradients(grads: Sequence[tf.Tensor], reducer) -> list[tf.Tensor]:
    """Combine ``grads`` across ranks with ``reducer`` (:func:`hvdsync.tensorflow.compression.make_reducer`):
    one grouped all-reduce for cast codecs, the codec's rounds of collectives for the others."""
    return reducer.reduce(list(grads))


class DistributedOptimizer:
    """A Keras 3 optimizer whose gradients are summed locally over ``sync.accumulate`` backward passes and then
    all-reduced once, with the configured op and compression, before the update.

    Two ways to drive it:

    * ``apply_gradients(zip(grads, variables))`` once per backward pass, like a Keras optimizer: it counts the passes
      and all-reduces and updates on every ``accumulate``-th call (a ``tf.cond``, so it also works in ``tf.function``).
    * ``accumulate(grads)`` per pass, then ``synchronize()`` and ``step()``: the same, with the phases apart (the
      training loop times them separately, like PyTorch's ``optimizer.synchronize()``/``step()``).

    Every rank must make the same calls in the same order: an all-reduce waits until all ranks have joined it.
    """

    def __init__(self, optimizer: keras.optimizers.Optimizer, variables: Iterable, sync,
                 counter: WireCounter | None = None, seed: int = 0) -> None:
        self.optimizer = optimizer
        self.variables = list(variables)
        self.accumulate_steps = sync.accumulate
        # ---- gradient codec (hvdsync.tensorflow.compression): its state (residuals, ...) is made here, eagerly.
        self.reducer = make_reducer(sync, [tuple(v.shape) for v in self.variables], counter, seed)
        if not optimizer.built:
            # Keras 3 creates slot variables (momentum, Adam moments) lazily; build them now, so that they exist
            # when rank 0's state is broadcast and are not created later inside a tf.function.
            optimizer.build(self.variables)
        # Gradient sums between all-reduces. Variables (not Python state) so that they carry over between calls
        # of a tf.function; created here, eagerly, because a tf.function may only create variables on first trace.
        self._sums = [tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False, name="hvdsync_grad_sum")
                      for v in self.variables]
        self._passes = tf.Variable(0, dtype=tf.int64, trainable=False, name="hvdsync_backward_passes")

    @property
    def counter(self) -> WireCounter:
        return self.reducer.counter

    def accumulate(self, grads: Sequence[tf.Tensor | None]) -> None:
        """Add one backward pass's gradients (``None``, for a variable the loss does not touch, counts as zero:
        every rank must still all-reduce the same list of tensors)."""
        for total, g in zip(self._sums, grads):
            if g is not None:
                total.assign_add(tf.convert_to_tensor(g))
        self._passes.assign_add(1)

    def synchronize(self) -> None:
        """All-reduce the summed gradients across ranks, once for all the passes since the last step."""
        reduced = allreduce_gradients([s.read_value() for s in self._sums], self.reducer)
        for total, r in zip(self._sums, reduced):
            total.assign(r)

    def step(self) -> None:
        """Apply the (synchronized) gradients with the wrapped optimizer and start the next sum from zero."""
        self.optimizer.apply_gradients(zip([s.read_value() for s in self._sums], self.variables))
        for total in self._sums:
            total.assign(tf.zeros_like(total))

    def apply_gradients(self, grads_and_vars) -> tf.Tensor:
        """Keras-style call per backward pass; returns whether this call all-reduced and updated."""
        grads = [g for g, _ in grads_and_vars]
        self.accumulate(grads)

        def sync_and_step() -> tf.Tensor:
            self.synchronize()
            self.step()
            return tf.constant(True)

        # Every rank counts the same passes, so every rank takes the same branch and joins the same all-reduce.
        return tf.cond(self._passes % self.accumulate_steps == 0, sync_and_step, lambda: tf.constant(False))


def distributed_optimizer(optimizer: keras.optimizers.Optimizer, model: keras.Model, sync,
                          counter: WireCounter | None = None, seed: int = 0) -> DistributedOptimizer:
    """Wrap ``optimizer`` so that ``model``'s gradients are all-reduced by Horovod.

    Args:
        optimizer: the local Keras 3 optimizer.
        model: the model; its ``trainable_variables`` are what the optimizer updates.
        sync: a :class:`~hvdsync.config.SyncConfig`: ``compression``, ``accumulate`` (backward passes per
            all-reduce and update) and the reduce ``op``.
        counter: a :class:`~hvdsync.core.codecs.WireCounter` that records what is handed to Horovod.
        seed: the global seed for the codecs' shared random choices (rand-k positions, PowerSGD's first Q).

    Example:
        >>> opt = distributed_optimizer(keras.optimizers.SGD(0.1), model, cfg.sync)  # doctest: +SKIP
        >>> broadcast_state(model, opt)                                             # doctest: +SKIP
    """
    return DistributedOptimizer(optimizer, model.trainable_variables, sync, counter, seed)


def broadcast_state(model: keras.Model, optimizer=None, root_rank: int = 0) -> None:
    """Make every rank start from rank 0's model variables (trainable and not, e.g. batch-norm statistics) and
    optimizer variables (step count, learning rate, momentum or Adam moments).

    Without this, ranks that initialised differently would all-reduce gradients of *different* models and drift
    apart silently. ``optimizer`` may be a :class:`DistributedOptimizer` or a Keras optimizer; a Keras optimizer that
    was not built yet is built first, since its slot variables are created lazily.
    """
    variables = list(model.variables)
    if optimizer is not None:
        keras_optimizer = getattr(optimizer, "optimizer", optimizer)
        if not keras_optimizer.built:
            keras_optimizer.build(model.trainable_variables)
        variables += list(keras_optimizer.variables)
    for i, v in enumerate(variables):
        # Named by position: every rank lists the same variables in the same order, and Horovod pairs the ranks'
        # requests by name.
        v.assign(hvd.broadcast(v.value, root_rank=root_rank, name=f"hvdsync.broadcast.{i}"))
