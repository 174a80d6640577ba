"""``sync.mode: local_sgd`` for Keras 3: local updates, then the trainable and slot variables averaged (mirrors
``hvdsync/torch/schemes/local_sgd.py``)."""
from __future__ import annotations

import horovod.tensorflow as hvd
import keras
import tensorflow as tf

from hvdsync.config import SyncConfig
from hvdsync.core.comm.codecs import WireCounter
from hvdsync.core.comm.codecs.base import Codec
from hvdsync.core.comm.schemes import local_sgd
from hvdsync.tensorflow.compression import record_all_on_wire
from hvdsync.tensorflow.schemes.base import DistributedOptimizer


class LocalSGDOptimizer(DistributedOptimizer):
    """``sync.mode: local_sgd`` for Keras 3: local updates, and every ``period`` updates one grouped all-reduce
    that averages the model's trainable variables and the optimizer's slot variables.

    Args:
        optimizer: the user's local Keras optimizer.
        sync: the checked settings: ``sync.period`` updates between averagings, the first ``sync.warmup_steps``
            updates all-reduce their gradients (post-local SGD), ``sync.accumulate`` backward passes per update
            (summed locally, as :class:`~hvdsync.tensorflow.schemes.base.DistributedOptimizer` does; never straddles
            an averaging).
        codec: the codec built from ``sync.compression`` (``none``: parameters, not gradients, are averaged).
        counter: records every tensor handed to Horovod.

    :attr:`rounds` is the number of all-reduces issued, counted in an optimizer variable as they are issued (also
    inside ``tf.function``); :meth:`average` makes the ranks agree now (every rank must call it).
    """

    _phases_in_apply = True  # its synchronize() and step() carry the averaging schedule

    def __init__(self, optimizer: keras.optimizers.Optimizer, sync: SyncConfig, codec: Codec,
                 counter: WireCounter | None = None, seed: int = 0, name: str | None = None) -> None:
        super().__init__(optimizer, sync, codec, counter, seed, name=name or f"local_sgd_{optimizer.name}")
        self.period, self.warmup_steps = sync.period, sync.warmup_steps

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

    def step(self, clear: bool = True) -> None:
        """The local update, then the average when the schedule says so (every rank takes the same branch)."""
        super().step(clear)
        self._local_steps.assign_add(1)

        def average() -> tf.Tensor:
            self.average()
            return tf.constant(True)

        tf.cond(local_sgd.averages_after(self._local_steps, self.period, self.warmup_steps), average,
                lambda: tf.constant(False))
