"""``sync.mode`` for TensorFlow/Keras 3: a parameter server, local SGD and gossip built from Horovod's collectives
(mirrors ``hvdsync/torch/schemes/`` file for file).

:func:`hvdsync.tensorflow.distributed_optimizer` looks ``sync.mode`` up in :data:`SCHEMES` and, for any mode but
``allreduce``, returns one of these optimizers instead of
:class:`~hvdsync.tensorflow.schemes.base.DistributedOptimizer`. They *are* that optimizer (a Keras 3 ``Optimizer``)
with other ``synchronize``/``step`` phases, so Keras ``compile``/``fit``, ``apply_gradients`` in the user's
``tf.function`` step and hvdsync's shared loop work unchanged. When and what to communicate comes from the plans in
:mod:`hvdsync.core.comm.schemes`; this package only moves tensors.

* :class:`ParameterServerOptimizer` (``sync.mode: ps``): ``synchronize`` pushes the summed gradients to the shard
  owners (``hvd.alltoall`` with splits, then each owner adds its shard's pieces:
  :func:`~hvdsync.tensorflow.schemes.ps.push`); ``step`` updates the owned shard with the wrapped optimizer (built
  over that shard only, so its slots live only at the owner) and pulls the parameters back (``hvd.allgather``, or
  ``hvd.broadcast`` from the single server).
* :class:`LocalSGDOptimizer` (``sync.mode: local_sgd``): ``step`` is the local update; every ``sync.period``
  updates it then averages the trainable variables and the optimizer's slot variables (momentum, Adam's moments)
  in one ``hvd.grouped_allreduce``; with ``sync.warmup_steps`` the first updates all-reduce the gradients instead
  (post-local SGD).
* :class:`GossipOptimizer` (``sync.mode: gossip``): every ``sync.period`` updates it first mixes the trainable
  variables with the ring neighbours' (one ``hvd.alltoall``), then updates on the local gradients.
"""
from __future__ import annotations

import keras

from hvdsync.core.comm.codecs import WireCounter
from hvdsync.core.comm.codecs.registry import get_codec
from hvdsync.tensorflow.schemes.base import DistributedOptimizer
from hvdsync.tensorflow.schemes.gossip import GossipOptimizer
from hvdsync.tensorflow.schemes.local_sgd import LocalSGDOptimizer
from hvdsync.tensorflow.schemes.ps import ParameterServerOptimizer

SCHEMES: dict[str, type[DistributedOptimizer]] = {"ps": ParameterServerOptimizer, "gossip": GossipOptimizer,
                                                  "local_sgd": LocalSGDOptimizer}


def scheme_optimizer(optimizer: keras.optimizers.Optimizer, model: keras.Model | None, sync,
                     counter: WireCounter | None = None) -> DistributedOptimizer:
    """The Keras optimizer for ``sync.mode`` (any mode in :data:`SCHEMES`), built over ``model``'s trainable
    variables when it is given (the same arguments as :func:`hvdsync.torch.schemes.scheme_optimizer`).

    Example (inside a Horovod worker)::

        opt = scheme_optimizer(keras.optimizers.SGD(0.1), model, SyncConfig(mode="local_sgd", period=4))
    """
    if sync.mode not in SCHEMES:
        raise ValueError(f"sync.mode: {sync.mode!r} is not allowed with train.framework 'tensorflow'; "
                         f"choose one of: allreduce, {', '.join(SCHEMES)}")
    # The parameter server pushes gradients through the configured codec (none or fp16); local SGD and gossip
    # average parameters, not gradients, so the config allows them only compression none.
    wrapped = SCHEMES[sync.mode](optimizer, sync, get_codec(sync.compression), counter)
    if model is not None:
        wrapped.build(model.trainable_variables)
    return wrapped


__all__ = ["SCHEMES", "scheme_optimizer", "ParameterServerOptimizer", "GossipOptimizer", "LocalSGDOptimizer"]
