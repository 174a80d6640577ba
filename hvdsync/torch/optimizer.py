"""Horovod's DistributedOptimizer with hvdsync's codecs and counters, and the rank-0 broadcast."""
from __future__ import annotations

import horovod.torch as hvd
import torch

from hvdsync.core.comm.codecs import WireCounter, get_codec
from hvdsync.core.train.runtime import REDUCE_OP_NAMES
from hvdsync.torch.compression import CodecCompressor, CodecOptimizer
from hvdsync.torch.grouped import GroupedOptimizer, groups_after_backward
from hvdsync.torch.sparse import use_sparse_allgather


def _sync_config(sync, compression: str | None, accumulate: int | None, op: str | None, sparse: str | None = None):
    """A :class:`~hvdsync.config.SyncConfig` from ``sync`` with the keyword arguments that were given winning;
    validated like a config (a bad value fails with the field's name)."""
    import dataclasses

    from hvdsync.config import SyncConfig  # here: hvdsync.config imports the core, not the adapters

    given = {k: v for k, v in (("compression", compression), ("accumulate", accumulate), ("op", op),
                                               ("sparse", sparse)) if v is not None}
    return SyncConfig(**{**dataclasses.asdict(sync if sync is not None else SyncConfig()), **given})


def distributed_optimizer(optimizer: torch.optim.Optimizer, model: torch.nn.Module | None = None, sync=None, *,
                          compression: str | None = None, accumulate: int | None = None, op: str | None = None,
                          sparse: str | None = None, counter: WireCounter | None = None,
                          seed: int = 0) -> torch.optim.Optimizer:
    """Wrap ``optimizer`` so that gradients are all-reduced by Horovod (like ``hvd.DistributedOptimizer``).

    Args:
        optimizer: the local optimizer over the model's parameters.
        model: the model; its parameter names label Horovod's tensors (which helps in timelines). Optional for
            cast codecs; the codecs that change a gradient's shape and the other sync modes need it.
        sync: a :class:`~hvdsync.config.SyncConfig` (optional; the keyword arguments below win over it).
        compression: codec on the wire (``none``, ``fp16``, ``topk:0.01``, ...; :mod:`hvdsync.core.comm.codecs`).
        accumulate: backward passes per all-reduce (Horovod's ``backward_passes_per_step``: gradients are summed
            locally and all-reduced once per ``accumulate`` passes).
        op: ``average``, ``sum`` or ``adasum``.
        sparse: sparse gradients (``nn.Embedding(sparse=True)``): ``dense`` (Horovod's ``sparse_as_dense``) or
            ``allgather`` (the touched rows only; :mod:`hvdsync.torch.sparse`).
        counter: a :class:`~hvdsync.core.comm.codecs.WireCounter` that records what is handed to Horovod.
        seed: the global seed for the codecs' shared random choices (rand-k positions, PowerSGD's first Q).

    Gradients that total at most ``sync.grouped_mb`` MiB (default 25, DDP's bucket) are all-reduced in one grouped
    call after the backward pass (:class:`~hvdsync.torch.grouped.GroupedOptimizer`); larger models get
    ``hvd.DistributedOptimizer``'s per-tensor hooks, whose all-reduces overlap the rest of backward.

    A ``sync.mode`` other than ``allreduce`` (parameter server, gossip) gets its optimizer from the registry in
    :mod:`hvdsync.torch.schemes` instead.

    Example:
        >>> opt = distributed_optimizer(torch.optim.SGD(model.parameters(), 0.1), model,   # doctest: +SKIP
        ...                             compression="fp16", accumulate=4)
    """
    sync = _sync_config(sync, compression, accumulate, op, sparse)
    needs_model = getattr(sync, "mode", "allreduce") != "allreduce" or not get_codec(sync.compression).cast
    if model is None and needs_model:
        raise ValueError(f"model: distributed_optimizer(compression={sync.compression!r}, "
                         f"mode={getattr(sync, 'mode', 'allreduce')!r}) needs the model")
    if getattr(sync, "mode", "allreduce") != "allreduce":
        from hvdsync.torch.schemes import scheme_optimizer

        return scheme_optimizer(optimizer, model, sync, counter)
    # ---- codecs that change the gradient's shape (top-k, rand-k, int8, PowerSGD): reduced after the backward
    # pass by hvdsync.torch.compression; cast codecs keep Horovod's asynchronous all-reduce below.
    if not get_codec(sync.compression).cast:
        return CodecOptimizer(optimizer, model.named_parameters(), sync, counter, seed)
    # ---- end of the codec dispatch
    # In place: Horovod (or the grouped call) reduces the returned wire tensor and hands it back to decompress,
    # which writes the result into p.grad; without it fp16 allocated a float16 and a float32 copy of every
    # gradient each step (benchmarks/fp16_step.py).
    compressor = CodecCompressor(sync.compression, counter, in_place=True)
    params = [p for g in optimizer.param_groups for p in g["params"]]
    if groups_after_backward(sync, params):
        return GroupedOptimizer(optimizer, model.named_parameters() if model is not None else None, sync, compressor)
    wrapped = hvd.DistributedOptimizer(
        optimizer,
        named_parameters=list(model.named_parameters()) if model is not None else None,
        compression=compressor,
        backward_passes_per_step=sync.accumulate,
        op=getattr(hvd, REDUCE_OP_NAMES[sync.op]),
        sparse_as_dense=sync.sparse == "dense",
    )
    if sync.sparse == "allgather":
        use_sparse_allgather(wrapped, compressor.counter)
    return wrapped


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
