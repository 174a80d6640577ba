"""A non-finite gradient that reaches one rank only, after the exchange (tests/parallel/test_codecs.py): what the
rank-consistent skip of :class:`hvdsync.tensorflow.precision.RankConsistentLossScaleOptimizer` is there for.

Injected from outside, through the public optimizer: :func:`after_reduce` wraps the ``reduce`` of the backend's
distributed optimizer's reducer (``optimizer.reducer``, what every step's gradients go through, in the traced step
too) on that one object, so that once armed this rank's reduced gradients are inf when Keras' loss-scale optimizer
checks them. Its flag is a variable of this module's handle, in the step's graph only where the lab wraps a reducer:
hvdsync itself has no switch for it. Mirrors :mod:`hvdlab.torch.overflow`.

    overflow = after_reduce(backend)           # on every rank, after build, before the first step (its trace)
    if step == 3 and hvd.rank() == 0:
        overflow.arm()                         # the next step's reduced gradients on this rank: inf
    backend.train_step(micro, scale)
"""
from __future__ import annotations

import tensorflow as tf


class ReducedOverflow:
    """The handle :func:`after_reduce` returns: :meth:`arm` makes the next step's reduced gradients non-finite here."""

    def __init__(self) -> None:
        # Read and reset inside the traced step (a Python flag would be frozen into the graph at its trace).
        self.armed = tf.Variable(False, trainable=False, name="hvdlab_overflow_armed")
        self._fired = tf.Variable(0, dtype=tf.int64, trainable=False, name="hvdlab_overflow_fired")

    @property
    def fired(self) -> int:
        """How many steps it made non-finite."""
        return int(self._fired.numpy())

    def arm(self) -> None:
        """Make this rank's reduced gradients non-finite at the next reduction (once)."""
        self.armed.assign(True)


def after_reduce(backend) -> ReducedOverflow:
    """Wrap the reducer of ``backend.optimizer`` (a :class:`hvdsync.tensorflow.TensorFlowBackend`'s) so that, when
    armed, the first reduced gradient is inf on this rank, after the all-reduce.

    Raises:
        RuntimeError: the step's graphs were traced already (they hold the reducer as it was then), or the
            optimizer has no reducer yet (it is made when the optimizer is built: ``build`` with a broadcast does).
    """
    traced = [name for name, count in backend.traces().items() if count]
    if traced:
        raise RuntimeError(f"after_reduce: the step's graphs {traced} are traced already and would not see it; "
                           "wrap the reducer after build and before the first train_step")
    reducer = getattr(backend.optimizer, "reducer", None)
    if reducer is None:
        raise RuntimeError("after_reduce: the optimizer has no reducer yet; build it first "
                           "(hvdsync.tensorflow.build with broadcast=True, or broadcast_state(model, optimizer))")
    handle, reduce = ReducedOverflow(), reducer.reduce

    def reduce_then_overflow(grads):
        out = list(reduce(grads))
        # Ordered after the read by tf.function's automatic control dependencies (one variable, program order).
        bad = tf.where(handle.armed, tf.constant(float("inf"), out[0].dtype), tf.constant(0.0, out[0].dtype))
        handle._fired.assign_add(tf.cast(handle.armed, tf.int64))
        handle.armed.assign(False)
        out[0] = out[0] + bad
        return out

    reducer.reduce = reduce_then_overflow  # this object only: the class, and hvdsync, stay as they are
    return handle
