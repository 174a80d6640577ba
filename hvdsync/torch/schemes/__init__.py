"""``sync.mode`` for PyTorch: a parameter server and gossip averaging built from Horovod's collectives.

:func:`hvdsync.torch.distributed_optimizer` looks ``sync.mode`` up in :data:`SCHEMES` and, for any mode but
``allreduce``, returns one of these optimizers instead of Horovod's ``DistributedOptimizer``. They have the same
surface as Horovod's (``zero_grad``, ``synchronize``, ``skip_synchronize``, ``step``, ``param_groups``,
``state_dict``), so the training step, the user's own loop and an LR scheduler work unchanged. The plans (who owns
which shard, who talks to whom, how much) come from :mod:`hvdsync.core.comm.schemes`; this module only moves tensors.

* :class:`ParameterServerOptimizer` (``sync.mode: ps``): ``synchronize`` pushes the gradients to the shard owners
  (``hvd.alltoall`` with splits, then each owner adds its shard's pieces: :func:`~hvdsync.torch.schemes.ps.push`); ``step`` updates
  the owned shard with the user's optimizer class (its state lives only at the owner) and pulls the parameters back
  (``hvd.allgather``, or ``hvd.broadcast`` from the single server).
* :class:`GossipOptimizer` (``sync.mode: gossip``): every ``sync.period`` steps ``synchronize`` exchanges the
  parameters with the ring neighbours (``hvd.alltoall`` with splits) and mixes them; ``step`` is the local step
  on the local gradient (D-PSGD).
* :class:`LocalSGDOptimizer` (``sync.mode: local_sgd``): ``step`` is the local step; every ``sync.period`` steps it
  then averages the parameters and the optimizer state in one ``hvd.allreduce``; with ``sync.warmup_steps`` the
  first steps all-reduce the gradients instead (post-local SGD).

Both count the bytes each rank sends and receives (:attr:`SchemeOptimizer.traffic`) from the tensors and splits
they hand to Horovod.
"""
from __future__ import annotations

import horovod.torch as hvd
import torch

from hvdsync.core.comm.codecs import WireCounter
from hvdsync.torch.schemes.base import SchemeOptimizer
from hvdsync.torch.schemes.gossip import GossipOptimizer
from hvdsync.torch.schemes.local_sgd import LocalSGDOptimizer
from hvdsync.torch.schemes.ps import ParameterServerOptimizer

SCHEMES: dict[str, type[SchemeOptimizer]] = {"ps": ParameterServerOptimizer, "gossip": GossipOptimizer,
                                             "local_sgd": LocalSGDOptimizer}


def scheme_optimizer(optimizer: torch.optim.Optimizer, model: torch.nn.Module, sync,
                     counter: WireCounter | None = None) -> SchemeOptimizer:
    """The optimizer for ``sync.mode`` (any mode in :data:`SCHEMES`).

    Example (inside a Horovod worker)::

        opt = scheme_optimizer(torch.optim.SGD(model.parameters(), lr=0.1), model, SyncConfig(mode="ps"))
    """
    if sync.mode == "ps" and not 0 <= sync.ps_servers <= hvd.size():
        raise ValueError(f"sync.ps_servers: {sync.ps_servers!r} is not allowed with {hvd.size()} workers; "
                         f"expected 0 to {hvd.size()}")
    return SCHEMES[sync.mode](optimizer, model, sync, counter)


__all__ = ["SCHEMES", "scheme_optimizer", "SchemeOptimizer", "ParameterServerOptimizer", "GossipOptimizer",
           "LocalSGDOptimizer"]
