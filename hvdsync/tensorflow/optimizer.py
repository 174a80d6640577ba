"""The distributed optimizer of a Keras 3 model and the rank-0 broadcast of model and optimizer state.

:func:`distributed_optimizer` wraps any Keras 3 optimizer in :class:`DistributedOptimizer` (which all-reduces
gradients; :mod:`hvdsync.tensorflow.schemes.base`) or, for another ``sync.mode``, in that mode's optimizer
(:mod:`hvdsync.tensorflow.schemes`): ``model.compile(optimizer=distributed_optimizer(...))`` and ``model.fit``
work, eagerly, inside ``tf.function`` and with ``steps_per_execution > 1``. Horovod's ops have no XLA kernels:
compile with ``jit_compile=False`` where Keras would pick XLA (``"auto"`` on a GPU).
"""
from __future__ import annotations

import horovod.tensorflow as hvd
import keras

from hvdsync.adapter import states_the_accumulation_rule, sync_settings
from hvdsync.core.comm.codecs import WireCounter
from hvdsync.core.comm.codecs.registry import get_codec
from hvdsync.tensorflow.schemes import scheme_optimizer
from hvdsync.tensorflow.schemes.base import DistributedOptimizer, allreduce_gradients

__all__ = ["DistributedOptimizer", "allreduce_gradients", "distributed_optimizer", "broadcast_state"]


@states_the_accumulation_rule
def distributed_optimizer(optimizer: keras.optimizers.Optimizer, model: keras.Model | None = None, sync=None, *,
                          compression: str | None = None, accumulate: int | None = None, op=None,
                          sparse: str | None = None, counter: WireCounter | None = None,
                          seed: int = 0) -> DistributedOptimizer:
    """Wrap a Keras 3 optimizer so that gradients are all-reduced by Horovod (Horovod's ``DistributedOptimizer``).

    Args:
        optimizer: the local Keras 3 optimizer (its learning rate, schedule and slots are used as they are).
        model: optional: build the optimizer over ``model.trainable_variables`` now (so that
            :func:`broadcast_state` sees its slot variables before the first step).
        sync: a :class:`~hvdsync.config.SyncConfig`, e.g. ``cfg.sync`` (a ``mode`` other than ``allreduce``
            returns that mode's optimizer from :mod:`hvdsync.tensorflow.schemes`); the keyword arguments below win
            over it (:func:`hvdsync.adapter.sync_settings`). Default: hvdsync's defaults.
        compression: codec on the wire (``"none"``, ``"fp16"``, ``"topk:0.01"``, ...: :mod:`hvdsync.core.comm.codecs`;
            Horovod's ``hvd.Compression.fp16`` is accepted too).
        accumulate: backward passes per all-reduce and update (Horovod's ``backward_passes_per_step``).
        op: ``"average"`` (default), ``"sum"``, ``"adasum"``, or Horovod's ``hvd.Average``/``hvd.Sum``/``hvd.Adasum``.
        sparse: ``IndexedSlices`` gradients (embeddings): ``"dense"`` (Horovod's ``sparse_as_dense``) or
            ``"allgather"`` (the touched rows only; :mod:`hvdsync.tensorflow.sparse`).
        counter: a :class:`~hvdsync.core.comm.codecs.WireCounter` that records what is handed to Horovod.
        seed: the global seed for the codecs' shared random choices (rand-k positions, PowerSGD's first Q).

    {accumulation_rule}

    Every rank starts from rank 0's variables, as with DDP: unless :func:`broadcast_state` (the broadcast callback,
    an elastic state) did it, the optimizer broadcasts rank 0's trained variables and its own once, at its first
    update, eagerly while ``fit`` traces the step, so before the first step runs
    (:meth:`DistributedOptimizer.start_from_rank_zero`).

    Example:
        >>> model.compile(optimizer=distributed_optimizer(keras.optimizers.SGD(0.1), accumulate=4),  # doctest: +SKIP
        ...               loss="sparse_categorical_crossentropy", metrics=["accuracy"], jit_compile=False)
        >>> model.fit(dataset, callbacks=[BroadcastGlobalVariablesCallback(0)])                    # doctest: +SKIP
    """
    sync = sync_settings(sync, compression=compression, accumulate=accumulate, op=op, sparse=sparse, horovod=hvd)
    if sync.mode != "allreduce":  # local SGD (hvdsync.tensorflow.schemes): the same optimizer, other phases
        return scheme_optimizer(optimizer, model, sync, counter)
    # This optimizer's one codec: its state (residuals, PowerSGD's Q) and SGD's momentum under correction live in it.
    wrapped = DistributedOptimizer(optimizer, sync, get_codec(sync.compression), counter, seed)
    if model is not None:
        wrapped.build(model.trainable_variables)
    return wrapped


def broadcast_state(model: keras.Model, optimizer: keras.optimizers.Optimizer | None = None,
                    root_rank: int = 0) -> None:
    """Make every rank start from rank 0's model variables (trainable and not, e.g. batch-norm statistics) and
    optimizer variables (step count, learning rate, momentum or Adam moments, gradient sums).

    Without this, ranks that initialised differently would all-reduce gradients of *different* models and drift
    apart silently (hvdsync's :class:`DistributedOptimizer` broadcasts before its first update when nobody did:
    this marks it done, so it does not broadcast again). An optimizer that was not built yet is built over the
    model's trainable variables first, since Keras 3 creates slot variables lazily.
    """
    variables = list(model.variables)
    if optimizer is not None:
        if not optimizer.built:
            optimizer.build(model.trainable_variables)
        variables += list(optimizer.variables)
        if hasattr(optimizer, "broadcast_done"):
            optimizer.broadcast_done = True
    for i, v in enumerate(variables):
        # Named by position: every rank lists the same variables in the same order, and Horovod pairs the ranks'
        # requests by name.
        v.assign(hvd.broadcast(v.value, root_rank=root_rank, name=f"hvdsync.broadcast.{i}"))
