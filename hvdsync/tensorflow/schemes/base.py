"""What TensorFlow's sync-mode optimizers share: :class:`DistributedOptimizer`, the Keras 3 optimizer that all-reduces
gradients (``sync.mode: allreduce``), whose ``synchronize``/``step`` phases each other mode overrides (mirrors
``hvdsync/torch/schemes/base.py``).

Horovod 0.28.1's ``DistributedOptimizer``/``DistributedGradientTape`` fail on Keras 3 variables as released (hvdsync's
Horovod build patches them: scripts/horovod-patches/0008), and its tape cannot accumulate; this optimizer needs
neither. :class:`DistributedOptimizer` wraps any Keras 3 optimizer (as Keras' own ``LossScaleOptimizer`` does),
so ``model.compile(optimizer=distributed_optimizer(...))`` and ``model.fit`` work, eagerly, inside ``tf.function``
and with ``steps_per_execution > 1``; its collectives are Horovod's low-level ``grouped_allreduce`` and
``broadcast``, which work with Keras 3. Horovod's ops have no XLA kernels: compile with ``jit_compile=False`` where
Keras would pick XLA (``"auto"`` on a GPU). Build it with :func:`hvdsync.tensorflow.distributed_optimizer`.

It lives here, below :mod:`hvdsync.tensorflow.optimizer`, because the modes subclass it and the optimizer module
picks among them: neither imports the other's importer.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import horovod.tensorflow as hvd
import keras
import tensorflow as tf

from hvdsync.config import SyncConfig
from hvdsync.core.comm.codecs import WireCounter
from hvdsync.core.comm.codecs.base import Codec
from hvdsync.core.comm.codecs.registry import get_codec
from hvdsync.tensorflow.compression import make_reducer
from hvdsync.tensorflow.sparse import add_slices, allgather_rows


def allreduce_gradients(grads: Sequence[tf.Tensor], reducer) -> list[tf.Tensor]:
    """Combine ``grads`` across ranks with ``reducer`` (:func:`hvdsync.tensorflow.compression.make_reducer`):
    one grouped all-reduce for cast codecs, the codec's rounds of collectives for the others.

    Every gradient all-reduce of :class:`DistributedOptimizer` goes through here, eagerly or traced.
    """
    return reducer.reduce(list(grads))


class DistributedOptimizer(keras.optimizers.Optimizer):
    """A Keras 3 optimizer that all-reduces gradients across Horovod ranks before the wrapped optimizer's update.

    Gradients of ``accumulate`` consecutive calls are summed locally (in optimizer variables, so the sum survives
    between calls of a ``tf.function`` and is saved with the model) and all-reduced once, with ``op`` and
    ``compression``; then the wrapped optimizer updates with that sum (the accumulation rule of
    :func:`~hvdsync.tensorflow.optimizer.distributed_optimizer`, as PyTorch's). Build it with that function; built
    by hand it takes a checked :class:`~hvdsync.config.SyncConfig` and the codec built from its ``compression``.

    Three ways to drive it:

    * Keras: ``model.compile(optimizer=...)`` + ``model.fit``. Keras passes each batch's *mean* loss through
      :meth:`scale_loss`, which divides it by ``accumulate``: ``accumulate`` batches of ``b`` then weigh like one
      batch of ``accumulate*b``, as with Keras' own ``gradient_accumulation_steps``.
    * Your loop: ``apply_gradients(zip(grads, variables))`` once per backward pass, on the loss the rule asks for
      (summed, times :func:`~hvdsync.tensorflow.loss_scale`); every ``accumulate``-th call all-reduces and
      updates (a ``tf.cond``: no retrace). A loop on batch-mean losses (Keras' convention, e.g. with
      :class:`~hvdsync.tensorflow.PlanSampler`'s weights) passes each through :meth:`scale_loss`, as Keras does.
    * Phases: ``accumulate(grads)`` per pass, then ``synchronize()`` and ``step()``: the same, with the phases apart
      (the shared loop times them, like PyTorch's ``optimizer.synchronize()``/``step()``; it scales each pass's
      loss itself: :func:`hvdsync.tensorflow.loss_scale`).

    With ``accumulate=1`` (:attr:`direct`) ``apply_gradients`` all-reduces the gradients it is given and updates at
    once, as a raw Horovod loop does: the sum variables are neither written nor read (they stay zero), so the wrapper
    adds no variable traffic and no ``tf.cond`` to the step. The phases keep using the sums.

    Every rank must make the same calls in the same order: an all-reduce waits until all ranks have joined it.
    ``iterations`` and ``learning_rate`` are the wrapped optimizer's, so Keras learning-rate callbacks and schedules
    see the real ones; ``iterations`` counts updates, not backward passes.
    """

    # A subclass whose synchronize()/step() carry more than the all-reduce and the update (local SGD's schedule)
    # sets this: its apply() must go through the phases even at accumulate 1.
    _phases_in_apply = False

    def __init__(self, optimizer: keras.optimizers.Optimizer, sync: SyncConfig, codec: Codec,
                 counter: WireCounter | None = None, seed: int = 0, name: str | None = None) -> None:
        super().__init__(learning_rate=0.0, name=name or f"distributed_{optimizer.name}")
        self.inner_optimizer = optimizer
        self.sync, self.codec, self.seed = sync, codec, seed
        self.accumulate_steps = sync.accumulate
        self._counter = counter if counter is not None else WireCounter()
        self.reducer = None  # made in build(): a codec with state needs the gradients' shapes
        # Positions whose gradients came as IndexedSlices under sync.sparse allgather; seen when accumulate() is
        # traced, which is before synchronize() is (and alike on every rank: the same model, the same graph).
        self._sparse_at: set[int] = set()
        # Whether every rank holds rank 0's variables: set by broadcast_state (the broadcast callback, hvdsync's
        # backend), by an elastic state's sync, or by start_from_rank_zero at the first apply/accumulate.
        self.broadcast_done = False

    # ---- Keras' optimizer protocol ---------------------------------------------------------------------------
    def build(self, var_list) -> None:
        # Gradient sums between all-reduces and the pass counter: optimizer variables, so that broadcast_state,
        # checkpoints and tf.function (which may only create variables on its first trace) all see them.
        var_list = list(var_list)
        # The codec's state (residuals, ...) is made here, eagerly, like the sums.
        self.reducer = make_reducer(self.sync, self.codec, [tuple(v.shape) for v in var_list], self._counter,
                                    self.seed, self.inner_optimizer)
        # Named by position, not after the model's variables: Keras numbers layers per process ("dense_7"), so a
        # rank that built another model (an evaluation copy) names them differently, and Horovod pairs the ranks'
        # all-reduces by the names of the tensors handed to it: different names would wait for each other forever.
        self._grad_sums = [self.add_variable(shape=v.shape, dtype=v.dtype, name=f"hvdsync_grad_sum_{i}")
                           for i, v in enumerate(var_list)]
        self._passes = self.add_variable(shape=(), dtype="int64", name="hvdsync_backward_passes")
        if not self.inner_optimizer.built:
            self.inner_optimizer.build(var_list)
        super().build(var_list)

    @property
    def variables(self) -> list:
        return self._variables[:] + list(self.inner_optimizer.variables)

    @property
    def iterations(self):
        return self.inner_optimizer.iterations

    @property
    def learning_rate(self):
        return self.inner_optimizer.learning_rate

    @learning_rate.setter
    def learning_rate(self, learning_rate) -> None:
        self.inner_optimizer.learning_rate = learning_rate

    def scale_loss(self, loss):
        """Keras' hook for the batch-mean loss of its ``train_step`` (``compile``/``fit``), and the one place where
        Keras' averaging of the accumulated batches is applied: the loss is divided by ``accumulate``, so the SUM
        this optimizer applies is their mean (the accumulation rule). Then the wrapped optimizer's own scaling
        (the loss scale under fp16)."""
        if self.accumulate_steps > 1:
            loss = loss / self.accumulate_steps
        return self.inner_optimizer.scale_loss(loss)

    def apply_gradients(self, grads_and_vars):
        """Keras' call per backward pass; returns ``iterations`` (the wrapped optimizer's: it counts updates)."""
        grads, trainable_variables = zip(*grads_and_vars)
        self.apply(grads, trainable_variables)
        return self.iterations

    def start_from_rank_zero(self, slots: bool = True) -> None:
        """Broadcast rank 0's trained variables (and, with ``slots``, the wrapped optimizer's variables) to every
        rank, once, unless that was done already (:attr:`broadcast_done`, a flag: nothing is compared): replicas
        that never got rank 0's weights would train apart without a word (DDP's constructor broadcasts for the same
        reason). Called by the first :meth:`apply` or :meth:`accumulate`, eagerly even while ``tf.function``
        traces the step (``tf.init_scope``), so in ``fit`` and in a traced loop it runs before the first step
        executes: the numbers of a broadcast before training, and nothing added to the traced step. In an eager
        loop it runs before the first update (the first gradients were computed on each rank's own weights; every
        rank applies their average to rank 0's). ``slots=False`` when the optimizer was built in this very call:
        its variables are fresh, the same on every rank (and not readable yet inside the trace that made them).
        A model's non-trainable variables (batch-norm statistics) are not the optimizer's: broadcast them with
        :func:`~hvdsync.tensorflow.broadcast_state`."""
        if self.broadcast_done:
            return
        self.broadcast_done = True
        # Named by position: every rank lists the same variables in the same order. hvdsync's own sums and pass
        # counter start at zero on every rank.
        variables = [*self._trainable_variables, *(self.inner_optimizer.variables if slots else [])]
        with tf.init_scope():
            for i, v in enumerate(variables):
                v.assign(hvd.broadcast(v.value, root_rank=0, name=f"hvdsync.start.{i}"))

    def apply(self, grads, trainable_variables=None) -> None:
        """One backward pass's gradients; all-reduces and updates on every ``accumulate``-th call."""
        fresh = not self.built
        if fresh:
            if trainable_variables is None:
                raise ValueError("trainable_variables: None is not allowed before the optimizer is built; pass the "
                                 "variables with the first gradients (apply_gradients(zip(grads, variables)))")
            self.build(trainable_variables)
        self.start_from_rank_zero(slots=not fresh)
        if self.direct:
            self._reduce_and_apply(grads, trainable_variables)
            return
        self.accumulate(grads, trainable_variables)

        def sync_and_step() -> tf.Tensor:
            self.synchronize()
            self.step()
            return tf.constant(True)

        # Every rank counts the same passes, so every rank takes the same branch and joins the same all-reduce.
        tf.cond(self._passes % self.accumulate_steps == 0, sync_and_step, lambda: tf.constant(False))

    def finalize_variable_values(self, var_list) -> None:
        self.inner_optimizer.finalize_variable_values(var_list)

    def get_config(self) -> dict:
        return {"name": self.name, "optimizer": keras.saving.serialize_keras_object(self.inner_optimizer),
                "sync": dataclasses.asdict(self.sync), "seed": self.seed}

    @classmethod
    def from_config(cls, config: dict, custom_objects=None) -> "DistributedOptimizer":
        config = dict(config)
        inner = keras.saving.deserialize_keras_object(config.pop("optimizer"), custom_objects=custom_objects)
        sync = SyncConfig(**config.pop("sync"))  # settings read back from a file: checked again, as they are read
        return cls(inner, sync, get_codec(sync.compression), **config)

    @property
    def direct(self) -> bool:
        """Whether :meth:`apply` all-reduces each call's gradients straight into the update (``accumulate=1``),
        without the sum variables (the fast path); else it sums ``accumulate`` calls first."""
        return self.accumulate_steps == 1 and not self._phases_in_apply

    def _reduce_and_apply(self, grads, trainable_variables) -> None:
        # The fast path: what accumulate + synchronize + step do for one pass, on tensors instead of the sums.
        self.apply_reduced(self.reduce_pass(grads, trainable_variables))

    def apply_reduced(self, reduced: Sequence[tf.Tensor]) -> None:
        """Update with gradients already combined across ranks (:meth:`reduce_pass`), one per variable in build
        order."""
        self.inner_optimizer.apply(list(reduced), self._trainable_variables)

    def reduce_pass(self, grads, trainable_variables=None, keep: bool = False) -> list[tf.Tensor]:
        """One backward pass's gradients combined across ranks, one per variable in build order, without the sums
        (what :meth:`apply` does at ``accumulate=1``, before the update). ``keep``: also leave them in
        :attr:`gradient_sums`, as :meth:`synchronize` does (for a gradient norm read after the step)."""
        given = dict(zip(self._variable_index(trainable_variables), grads))
        dense = []
        for i, v in enumerate(self._trainable_variables):
            g = given.get(i)
            if g is None:  # untouched by the loss: zeros, so that every rank hands Horovod the same list
                g = tf.zeros(v.shape, v.dtype)
            elif isinstance(g, tf.IndexedSlices):
                if self.sync.sparse == "allgather":
                    self._sparse_at.add(i)
                g = tf.convert_to_tensor(g)  # rows summed, as add_slices sums them into a zero table
            dense.append(tf.cast(g, v.dtype))
        reduced = self._reduce(dense)
        if keep:
            for total, r in zip(self._grad_sums, reduced):
                total.assign(r)
        return reduced

    def _reduce(self, grads: list[tf.Tensor]) -> list[tf.Tensor]:
        """``grads`` (one per variable, in build order) combined across ranks: the dense ones in one reducer
        call, the sparse ones (``sync.sparse: allgather``) by their rows."""
        # Named by position, not after the tape's ops: Horovod pairs the ranks' requests by name (see build()).
        grads = [tf.identity(g, name=f"hvdsync_grad_{i}") for i, g in enumerate(grads)]
        dense_at = [i for i in range(len(grads)) if i not in self._sparse_at]
        reduced = dict(zip(dense_at, allreduce_gradients([grads[i] for i in dense_at], self.reducer) if dense_at else []))
        for i in sorted(self._sparse_at):  # sync.sparse allgather (a cast codec: the config allows no other)
            reduced[i] = allgather_rows(grads[i], f"hvdsync_sparse_{i}", self.sync.op == "average",
                                        self.reducer.compression, self._counter)
        return [reduced[i] for i in range(len(grads))]

    # ---- the phases ------------------------------------------------------------------------------------------
    @property
    def gradient_sums(self) -> list:
        """The gradient variables: this rank's sums between passes, the reduced gradients after :meth:`synchronize`
        (until :meth:`step` clears them, or with ``step(clear=False)`` until the next fresh pass). The fast path of
        :meth:`apply` (:attr:`direct`) does not use them."""
        return list(self._grad_sums)

    @property
    def counter(self) -> WireCounter:
        """What was handed to Horovod (tensors, bytes, dtypes), counted at run time, also inside graphs."""
        return self._counter

    def _variable_index(self, trainable_variables) -> list[int]:
        trainable_variables = None if trainable_variables is None else list(trainable_variables)
        if trainable_variables is None or len(trainable_variables) == len(self._grad_sums):
            return list(range(len(self._grad_sums)))  # all of them, in build order (what fit and most loops pass)
        position = {v.path: i for i, v in enumerate(self._trainable_variables)}
        try:
            return [position[v.path] for v in trainable_variables]
        except KeyError as missing:
            raise ValueError(f"trainable_variables: {missing} is not allowed; the optimizer was built over other "
                             "variables (build it over model.trainable_variables)") from None

    def accumulate(self, grads: Sequence[tf.Tensor | None], trainable_variables=None, fresh: bool = False) -> None:
        """Add one backward pass's gradients (for ``trainable_variables``, default: all, in build order). ``None``
        (a variable the loss does not touch) adds nothing; that variable still takes part in the all-reduce, so
        every rank hands Horovod the same list of tensors. ``fresh``: the first pass of an update; the sums start
        from these gradients (zeros where none), whatever ``step(clear=False)`` left in them."""
        self.start_from_rank_zero()
        given = set()
        for i, g in zip(self._variable_index(trainable_variables), grads):
            if g is None:
                continue
            given.add(i)
            total = self._grad_sums[i]
            if isinstance(g, tf.IndexedSlices) and self.sync.sparse == "allgather":
                self._sparse_at.add(i)
                if fresh:
                    total.assign(tf.zeros_like(total))
                add_slices(total, g)  # its rows only; synchronize() sends the rows it holds
                continue
            if isinstance(g, tf.IndexedSlices):  # embeddings under sync.sparse dense: Horovod's sparse_as_dense
                g = tf.convert_to_tensor(g)
            g = tf.cast(g, total.dtype)
            total.assign(g) if fresh else total.assign_add(g)  # assign: no read of the old sum, no zeroing pass
        if fresh:
            self.clear([i for i in range(len(self._grad_sums)) if i not in given])
        self._passes.assign_add(1)

    def clear(self, positions: Sequence[int] | None = None) -> None:
        """Set the gradient sums (at ``positions``, default: all) to zero."""
        for i in range(len(self._grad_sums)) if positions is None else positions:
            self._grad_sums[i].assign(tf.zeros_like(self._grad_sums[i]))

    def synchronize(self) -> None:
        """All-reduce the summed gradients across ranks, once for all the passes since the last step."""
        # The sum of the passes, not their mean (the accumulation rule; Keras' averaging is in scale_loss).
        for total, r in zip(self._grad_sums, self._reduce([s.value for s in self._grad_sums])):
            total.assign(r)

    def step(self, clear: bool = True) -> None:
        """Apply the (synchronized) gradients with the wrapped optimizer.

        Args:
            clear: start the next sum from zero now. ``False`` leaves the reduced gradients in
                :attr:`gradient_sums` (readable, e.g. for their norm) until the next update's first
                ``accumulate(..., fresh=True)`` overwrites them, or :meth:`clear` (as ``optimizer.zero_grad()`` at a
                PyTorch step's start): one pass over the sums fewer per step.
        """
        self.inner_optimizer.apply([s.value for s in self._grad_sums], self._trainable_variables)
        if clear:
            self.clear()
