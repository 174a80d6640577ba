"""Horovod's DistributedOptimizer configured from :class:`hvdsync.config.SyncConfig`, and the rank-0 broadcast."""
from __future__ import annotations

import horovod.torch as hvd
import torch

from hvdsync.core.codecs import WireCounter, get_codec
from hvdsync.core.runtime import REDUCE_OP_NAMES
from hvdsync.torch.compression import CodecCompressor, CodecOptimizer


def distributed_optimizer(optimizer: torch.optim.Optimizer, model: torch.nn.Module, sync,
                          counter: WireCounter | None = None, seed: int = 0) -> torch.optim.Optimizer:
    """Wrap ``optimizer`` so that gradients are ring-all-reduced by Horovod.

    Args:
        optimizer: the local optimizer over ``model.parameters()``.
        model: the model (its parameter names label Horovod's tensors, which helps in timelines).
        sync: a :class:`~hvdsync.config.SyncConfig`: compression, ``accumulate`` (Horovod's
            ``backward_passes_per_step``: gradients are summed locally and all-reduced once per ``accumulate``
            backward passes) and the reduce ``op``.
        counter: a :class:`~hvdsync.core.codecs.WireCounter` that records what is handed to Horovod.
        seed: the global seed for the codecs' shared random choices (rand-k positions, PowerSGD's first Q).

    A ``sync.mode`` other than ``allreduce`` (parameter server, gossip) gets its optimizer from the registry in
    :mod:`hvdsync.torch.schemes` instead.
    """
    if getattr(sync, "mode", "allreduce") != "allreduce":
        from hvdsync.torch.schemes import scheme_optimizer

        return scheme_optimizer(optimizer, model, sync, counter)
    # ---- codecs that change the gradient's shape (top-k, rand-k, int8, PowerSGD): reduced after the backward
    # pass by hvdsync.torch.compression; cast codecs keep Horovod's asynchronous all-reduce below.
    if not get_codec(sync.compression).cast:
        return CodecOptimizer(optimizer, model.named_parameters(), sync, counter, seed)
    # ---- end of the codec dispatch
    return hvd.DistributedOptimizer(
        optimizer,
        named_parameters=model.named_parameters(),
        compression=CodecCompressor(sync.compression, counter),
        backward_passes_per_step=sync.accumulate,
        op=getattr(hvd, REDUCE_OP_NAMES[sync.op]),
    )


def broadcast_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None, root_rank: int = 0) -> None:
    """Make every rank start from rank 0's parameters and optimizer state.

    Without this, ranks that initialised differently would all-reduce gradients of *different* models and drift
    apart silently (notebook 12 measures it).
    """
    hvd.broadcast_parameters(model.state_dict(), root_rank=root_rank)
    if optimizer is not None:
        # The optimizer a CodecOptimizer or a sync-mode optimizer (hvdsync.torch.schemes) wraps: Horovod's broadcast
        # may call step() to create the state, which must not run their collectives.
        hvd.broadcast_optimizer_state(getattr(optimizer, "optimizer", optimizer), root_rank=root_rank)
