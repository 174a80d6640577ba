"""Horovod's DistributedOptimizer with hvdsync's codecs and counters, and the rank-0 broadcast."""
from __future__ import annotations

import types

import horovod.torch as hvd
import torch

from hvdsync.adapter import states_the_accumulation_rule, sync_settings
from hvdsync.core.comm.codecs import WireCounter
from hvdsync.core.comm.codecs.registry import get_codec
from hvdsync.core.train.runtime import REDUCE_OP_NAMES
from hvdsync.torch.compression import CodecCompressor, CodecOptimizer
from hvdsync.torch.grouped import GroupedOptimizer, groups_after_backward
from hvdsync.torch.sparse import use_sparse_allgather


def _needs_model(sync) -> ValueError:
    return ValueError(f"model: distributed_optimizer(compression={sync.compression!r}, mode={sync.mode!r}) needs "
                      "the model")


@states_the_accumulation_rule
def distributed_optimizer(optimizer: torch.optim.Optimizer, model: torch.nn.Module | None = None, sync=None, *,
                          compression: str | None = None, accumulate: int | None = None, op: str | None = None,
                          sparse: str | None = None, counter: WireCounter | None = None,
                          seed: int = 0) -> torch.optim.Optimizer:
    """Wrap ``optimizer`` so that gradients are all-reduced by Horovod (like ``hvd.DistributedOptimizer``).

    Args:
        optimizer: the local optimizer over the model's parameters.
        model: the model; its parameter names label Horovod's tensors (which helps in timelines). Optional for
            cast codecs; the codecs that change a gradient's shape and the other sync modes need it.
        sync: a :class:`~hvdsync.config.SyncConfig`, e.g. ``cfg.sync`` (optional; the keyword arguments below win
            over it: :func:`hvdsync.adapter.sync_settings`).
        compression: codec on the wire (``none``, ``fp16``, ``topk:0.01``, ...; :mod:`hvdsync.core.comm.codecs`;
            Horovod's ``hvd.Compression.fp16`` is accepted too).
        accumulate: backward passes per all-reduce (Horovod's ``backward_passes_per_step``: gradients are summed
            locally and all-reduced once per ``accumulate`` passes).
        op: ``average``, ``sum`` or ``adasum`` (or Horovod's ``hvd.Average``/``hvd.Sum``/``hvd.Adasum``).
        sparse: sparse gradients (``nn.Embedding(sparse=True)``): ``dense`` (Horovod's ``sparse_as_dense``) or
            ``allgather`` (the touched rows only; :mod:`hvdsync.torch.sparse`).
        counter: a :class:`~hvdsync.core.comm.codecs.WireCounter` that records what is handed to Horovod.
        seed: the global seed for the codecs' shared random choices (rand-k positions, PowerSGD's first Q).

    {accumulation_rule}

    Every rank starts from rank 0's parameters and optimizer state, as with DDP: unless :func:`broadcast_state`
    (or an elastic state's sync) did it already, they are broadcast once, before the first training forward pass
    of ``model`` (``model.training`` and gradients enabled), or, without ``model``, before the first ``step()``.

    Gradients that total at most ``sync.grouped_mb`` MiB (default 25, DDP's bucket) are all-reduced in one grouped
    call after the backward pass (:class:`~hvdsync.torch.grouped.GroupedOptimizer`); larger models get
    ``hvd.DistributedOptimizer``'s per-tensor hooks, whose all-reduces overlap the rest of backward.

    A ``sync.mode`` other than ``allreduce`` (parameter server, gossip) gets its optimizer from the registry in
    :mod:`hvdsync.torch.schemes` instead.

    Example:
        >>> opt = distributed_optimizer(torch.optim.SGD(model.parameters(), 0.1), model,   # doctest: +SKIP
        ...                             compression="fp16", accumulate=4)
        >>> for x, y in micro_batches:                                                      # doctest: +SKIP
        ...     (F.cross_entropy(model(x), y, reduction="sum") * loss_scale(global_count, hvd.size(), "average")
        ...      ).backward()
        >>> opt.step(); opt.zero_grad()                                                     # doctest: +SKIP
    """
    sync = sync_settings(sync, compression=compression, accumulate=accumulate, op=op, sparse=sparse, horovod=hvd)
    if sync.mode != "allreduce":
        if model is None:
            raise _needs_model(sync)
        from hvdsync.torch.schemes import scheme_optimizer

        return _starts_from_rank_zero(scheme_optimizer(optimizer, model, sync, counter), model)
    codec = get_codec(sync.compression)  # this optimizer's one codec: its state and momentum live in it
    # ---- codecs that change the gradient's shape (top-k, rand-k, int8, PowerSGD): reduced after the backward
    # pass by hvdsync.torch.compression; cast codecs keep Horovod's asynchronous all-reduce below.
    if not codec.cast:
        if model is None:
            raise _needs_model(sync)
        return _starts_from_rank_zero(CodecOptimizer(optimizer, model.named_parameters(), sync, codec, counter, seed),
                                      model)
    # ---- end of the codec dispatch
    # In place: Horovod (or the grouped call) reduces the returned wire tensor and hands it back to decompress,
    # which writes the result into p.grad; without it fp16 allocated a float16 and a float32 copy of every
    # gradient each step (benchmarks/step.py fp16).
    compressor = CodecCompressor(codec, counter, in_place=True)
    params = [p for g in optimizer.param_groups for p in g["params"]]
    if groups_after_backward(sync, params):
        return _starts_from_rank_zero(
            GroupedOptimizer(optimizer, model.named_parameters() if model is not None else None, sync, compressor), model)
    wrapped = hvd.DistributedOptimizer(
        optimizer,
        named_parameters=list(model.named_parameters()) if model is not None else None,
        compression=compressor,
        backward_passes_per_step=sync.accumulate,  # Horovod sums the passes in .grad: the rule above
        op=getattr(hvd, REDUCE_OP_NAMES[sync.op]),
        sparse_as_dense=sync.sparse == "dense",
    )
    if sync.sparse == "allgather":
        use_sparse_allgather(wrapped, compressor.counter)
    return _starts_from_rank_zero(wrapped, model)


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
    mark_broadcast_done(model, optimizer)


def mark_broadcast_done(model: torch.nn.Module | None, optimizer=None) -> None:
    """Tell hvdsync's distributed optimizer that every rank holds rank 0's state now (a flag: nothing is compared),
    so that it does not broadcast before its first step (:func:`distributed_optimizer`)."""
    for owner in (model, optimizer):
        start = owner.__dict__.get(_START) if owner is not None else None
        if start is not None:
            start.done()


_START = "hvdsync_start_from_rank_zero"


class _StartFromRankZero:
    """The once-only broadcast of :func:`distributed_optimizer`: a forward pre-hook on the model (before the first
    training forward, so the first gradients are already those of rank 0's model: the same numbers as a
    :func:`broadcast_state` before training), or, without a model, a wrapper of the optimizer's ``step``. Either is
    removed once the broadcast is done, by it or by anyone else (:func:`mark_broadcast_done`): no cost after.

    A copy (``copy.deepcopy(model)`` for an average of the weights, ``torch.save(model)``) gets an inert one: the
    copy is not what the ranks train, and the optimizer must not travel with it."""

    def __init__(self, model: torch.nn.Module | None, optimizer) -> None:
        self.model, self.optimizer, self._hook = model, optimizer, None
        if model is not None:
            self._hook = model.register_forward_pre_hook(self._before_forward)
            model.__dict__[_START] = self
        else:
            optimizer.step = types.MethodType(_first_step, optimizer)  # the class's step comes back in done()
        optimizer.__dict__[_START] = self

    def __reduce__(self):
        return _inert, ()

    def _before_forward(self, module: torch.nn.Module, args) -> None:
        # An evaluation forward may run on one rank only (rank 0 checking a model): it must not start a collective.
        if self.optimizer is not None and module.training and torch.is_grad_enabled():
            self.run()

    def run(self) -> None:
        if self.optimizer is None:  # an inert copy
            return
        if self.model is not None:
            broadcast_state(self.model, self.optimizer)  # marks it done
            return
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        hvd.broadcast_parameters([(f"hvdsync.start.{i}", p) for i, p in enumerate(params)], root_rank=0)
        # The state as one object: Horovod's tensor broadcast would take a zero-gradient step to create a missing
        # state, which here, between backward and step, would overwrite the reduced gradients.
        inner = getattr(self.optimizer, "optimizer", self.optimizer)
        inner.load_state_dict(hvd.broadcast_object(inner.state_dict(), root_rank=0, name="hvdsync.start.optimizer"))
        self.done()

    def done(self) -> None:
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        if self.optimizer is None:
            return
        if isinstance(self.optimizer.__dict__.get("step"), types.MethodType) and \
                self.optimizer.__dict__["step"].__func__ is _first_step:
            del self.optimizer.__dict__["step"]
        for owner in (self.model, self.optimizer):
            if owner is not None and owner.__dict__.get(_START) is self:
                del owner.__dict__[_START]


def _inert() -> _StartFromRankZero:
    start = object.__new__(_StartFromRankZero)
    start.model = start.optimizer = start._hook = None
    return start


def _first_step(optimizer, *args, **kwargs):
    """The optimizer's ``step`` until the first broadcast (without a model): broadcast, then the class's step."""
    start = optimizer.__dict__.get(_START)
    if start is not None:
        start.run()
    return type(optimizer).step(optimizer, *args, **kwargs)


def _starts_from_rank_zero(optimizer, model: torch.nn.Module | None):
    _StartFromRankZero(model, optimizer)
    return optimizer
