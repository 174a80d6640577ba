"""``sync.mode`` for TensorFlow/Keras 3: local SGD built from Horovod's collectives (mirrors
``hvdsync/torch/schemes/``).

:func:`hvdsync.tensorflow.distributed_optimizer` looks ``sync.mode`` up in :data:`SCHEMES` and, for any mode but
``allreduce``, returns one of these optimizers instead of :class:`~hvdsync.tensorflow.optimizer.DistributedOptimizer`.
They *are* that optimizer (a Keras 3 ``Optimizer``) with other ``synchronize``/``step`` phases, so Keras
``compile``/``fit``, ``apply_gradients`` in the user's ``tf.function`` step and hvdsync's shared loop work unchanged.
When to communicate comes from :mod:`hvdsync.core.comm.schemes.local_sgd`; this module only moves tensors.

* :class:`LocalSGDOptimizer` (``sync.mode: local_sgd``): ``step`` is the local update; every ``sync.period``
  updates it then averages the trainable variables and the optimizer's slot variables (momentum, Adam's moments)
  in one ``hvd.grouped_allreduce``; with ``sync.warmup_steps`` the first updates all-reduce the gradients instead
  (post-local SGD).
"""
from __future__ import annotations

import horovod.tensorflow as hvd
import keras
import tensorflow as tf

from hvdsync.core.comm.codecs import WireCounter
from hvdsync.core.comm.schemes import local_sgd
from hvdsync.tensorflow.compression import record_all_on_wire
from hvdsync.tensorflow.optimizer import DistributedOptimizer


class LocalSGDOptimizer(DistributedOptimizer):
    """``sync.mode: local_sgd`` for Keras 3: local updates, and every ``period`` updates one grouped all-reduce
    that averages the model's trainable variables and the optimizer's slot variables.

    Args:
        optimizer: the user's local Keras optimizer.
        period: updates between averagings (``sync.period``).
        warmup_steps: first updates that all-reduce their gradients (post-local SGD; ``sync.warmup_steps``).
        accumulate: backward passes per update (summed locally; never straddles an averaging).
        average_accumulated: as :class:`~hvdsync.tensorflow.optimizer.DistributedOptimizer`.
        counter: records every tensor handed to Horovod.

    :attr:`rounds` is the number of all-reduces issued, counted in an optimizer variable as they are issued (also
    inside ``tf.function``); :meth:`average` makes the ranks agree now (every rank must call it).
    """

    _phases_in_apply = True  # its synchronize() and step() carry the averaging schedule

    def __init__(self, optimizer: keras.optimizers.Optimizer, period: int = 1, warmup_steps: int = 0,
                 accumulate: int = 1, average_accumulated: bool = True, counter: WireCounter | None = None,
                 name: str | None = None) -> None:
        super().__init__(optimizer, "none", accumulate, "average", average_accumulated, counter,
                         name=name or f"local_sgd_{optimizer.name}")
        self.period, self.warmup_steps = int(period), int(warmup_steps)

    def build(self, var_list) -> None:
        super().build(var_list)
        # Updates taken and rounds issued: optimizer variables, so they live across tf.function calls and
        # every rank's copy moves in step (broadcast_state hands rank 0's zeros to all).
        self._local_steps = self.add_variable(shape=(), dtype="int64", name="hvdsync_local_steps")
        self._rounds = self.add_variable(shape=(), dtype="int64", name="hvdsync_rounds")

    @property
    def rounds(self) -> int:
        """All-reduces issued so far (gradient rounds of the warm-up, then averagings)."""
        return int(self._rounds.numpy())

    def _state_variables(self) -> list:
        # Slot variables (momentum, Adam's moments) have their parameter's shape; the scalars (iteration count,
        # learning rate) are equal on every rank already.
        return [v for v in self.inner_optimizer.variables if keras.backend.is_float_dtype(v.dtype) and len(v.shape) > 0]

    def _allreduce_average(self, variables: list, gradients: int, tag: str) -> None:
        values = [tf.identity(v.value if hasattr(v, "value") else v, name=f"hvdsync_{tag}_{i}")
                  for i, v in enumerate(variables)]
        # Slot variables ride in the parameters' round: their bytes count, the round once.
        record_all_on_wire(self.counter, values, [int(i < gradients) for i in range(len(values))])
        for v, r in zip(variables, hvd.grouped_allreduce(values, op=hvd.Average)):
            v.assign(r)
        self._rounds.assign_add(1)

    def average(self) -> None:
        """Replace the trainable variables and slot variables by their average over ranks (one all-reduce)."""
        self._allreduce_average(list(self._trainable_variables) + self._state_variables(),
                                len(self._trainable_variables), "local_sgd_average")

    def synchronize(self) -> None:
        """All-reduce the summed gradients during the synchronous warm-up; a local update needs nothing."""
        if self.warmup_steps:
            def reduce() -> tf.Tensor:
                self._allreduce_average(self._grad_sums, len(self._grad_sums), "local_sgd_grad")
                return tf.constant(True)

            tf.cond(local_sgd.synchronous(self._local_steps + 1, self.warmup_steps), reduce,
                    lambda: tf.constant(False))
        if self.average_accumulated and self.accumulate_steps > 1:  # Keras' mean-loss convention, as the base
            for total in self._grad_sums:
                total.assign(total / tf.cast(self.accumulate_steps, total.dtype))

    def step(self, clear: bool = True) -> None:
        """The local update, then the average when the schedule says so (every rank takes the same branch)."""
        super().step(clear)
        self._local_steps.assign_add(1)

        def average() -> tf.Tensor:
            self.average()
            return tf.constant(True)

        tf.cond(local_sgd.averages_after(self._local_steps, self.period, self.warmup_steps), average,
                lambda: tf.constant(False))

    def get_config(self) -> dict:
        config = super().get_config()
        for key in ("compression", "op", "seed", "error_feedback", "sparse"):
            config.pop(key)
        return {**config, "period": self.period, "warmup_steps": self.warmup_steps}


def _local_sgd(optimizer, sync, counter, average_accumulated) -> LocalSGDOptimizer:
    return LocalSGDOptimizer(optimizer, sync.period, sync.warmup_steps, sync.accumulate, average_accumulated, counter)


SCHEMES = {"local_sgd": _local_sgd}


def scheme_optimizer(optimizer: keras.optimizers.Optimizer, sync, counter: WireCounter | None = None,
                     average_accumulated: bool = True) -> DistributedOptimizer:
    """The Keras optimizer for ``sync.mode`` (any mode in :data:`SCHEMES`).

    Example (inside a Horovod worker)::

        opt = scheme_optimizer(keras.optimizers.SGD(0.1), SyncConfig(mode="local_sgd", period=4))
    """
    if sync.mode not in SCHEMES:
        raise ValueError(f"sync.mode: {sync.mode!r} is not allowed with train.framework 'tensorflow'; "
                         f"choose one of: allreduce, {', '.join(SCHEMES)}")
    return SCHEMES[sync.mode](optimizer, sync, counter, average_accumulated)


__all__ = ["SCHEMES", "scheme_optimizer", "LocalSGDOptimizer"]
