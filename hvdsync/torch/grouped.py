"""One grouped all-reduce after the backward pass, for models whose gradients are small (``sync.grouped_mb``).

``hvd.DistributedOptimizer`` hands each gradient to Horovod from a hook the moment backward produces it, so that big
gradients are reduced while backward computes the earlier layers'. For a small model (the 10 k-parameter CNN: 40 kB
of gradients, a backward of a few ms) there is nothing to hide behind, and the hooks only cost: each group of
tensors that happens to be ready in one of Horovod's cycles becomes its own round (a cycle's wait, a negotiation,
a ring, thread hand-offs), several per step. :class:`GroupedOptimizer` waits for the whole backward, then hands every
gradient over in ONE ``hvd.grouped_allreduce_async_`` (one round, in place), which is what DDP does with a model
that fits its first 25 MB bucket. It waits by polling with short sleeps: an unpatched Horovod 0.28.1's
``hvd.synchronize`` spins on ``sched_yield`` and takes the core that Horovod's and Gloo's threads of both ranks need
(docs/measurements/allreduce.md, "Where the time goes", point 4). hvdsync's own build has patch 0005 (a condition
variable), where the two waits measured alike (benchmarks/step.py latency, quiet: 49.6 vs 50.5 ms a step); the poll
keeps a Horovod built elsewhere, such as a cluster's own, from spinning.

The result is the same sum as the hooks' (per element, the same two addends), so parameters match the hook path's.
"""
from __future__ import annotations

import time
import warnings
from typing import Iterable

import horovod.torch as hvd
import torch

from hvdsync.core.train.runtime import REDUCE_OP_NAMES
from hvdsync.torch.compression import CodecCompressor, LocalOptimizerView
from hvdsync.torch.sparse import densify

POLL_S = 50e-6  # between polls of the pending all-reduce: well under a cycle (1 ms), long enough to free the core


def gradient_bytes(parameters: Iterable[torch.Tensor]) -> int:
    """Bytes of the gradients of ``parameters`` that train (what one step all-reduces before any codec)."""
    return sum(p.numel() * p.element_size() for p in parameters if p.requires_grad)


def groups_after_backward(sync, parameters: Iterable[torch.Tensor]) -> bool:
    """The rule: one grouped call after backward when the gradients total at most ``sync.grouped_mb`` MiB.

    Adasum combines tensors pairwise as they come (no grouped form in Horovod) and ``sync.sparse: allgather``
    gathers rows from the hooks, so both keep the hooks whatever the size.
    """
    if sync.grouped_mb <= 0 or sync.op == "adasum" or sync.sparse == "allgather":
        return False
    return gradient_bytes(parameters) <= sync.grouped_mb * 2 ** 20


def wait(handle, poll_s: float = POLL_S):
    """``hvd.synchronize(handle)`` without its spinning wait: sleep between polls, then collect the result."""
    while not hvd.poll(handle):
        time.sleep(poll_s)
    return hvd.synchronize(handle)


class GroupedOptimizer(LocalOptimizerView):
    """A distributed optimizer with ``hvd.DistributedOptimizer``'s calling convention that all-reduces every
    gradient in one grouped Horovod call in ``synchronize()`` (or ``step()``), after all backward passes of a step.

    Args:
        optimizer: the local optimizer.
        named_parameters: ``model.named_parameters()``; sorted by name, so every rank hands over the same list
            whatever order it was given in. ``None``: the optimizer's parameters in their order.
        sync: a :class:`~hvdsync.config.SyncConfig` (``op``: average or sum; ``accumulate`` needs nothing here:
            backward passes add into ``.grad`` and the all-reduce runs once, when the step synchronizes).
        compressor: the cast codec's :class:`~hvdsync.torch.compression.CodecCompressor` (counts the wire).

    Example:
        >>> opt = GroupedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(),
        ...                        SyncConfig(), CodecCompressor("none"))                 # doctest: +SKIP
        >>> opt.zero_grad(); loss.backward(); opt.step()                                  # doctest: +SKIP
    """

    def __init__(self, optimizer: torch.optim.Optimizer, named_parameters: Iterable | None, sync,
                 compressor: CodecCompressor) -> None:
        self.optimizer = optimizer
        if named_parameters is None:
            params = [p for g in optimizer.param_groups for p in g["params"]]
        else:
            params = [p for _, p in sorted(named_parameters, key=lambda kv: kv[0])]
        self.parameters = [p for p in params if p.requires_grad]
        self.compressor = compressor
        self.counter = compressor.counter
        self.op = getattr(hvd, REDUCE_OP_NAMES[sync.op])
        self._skip = False
        self._reduced = False

    @torch.no_grad()
    def synchronize(self) -> None:
        """All-reduce every parameter's ``.grad`` in one call (a parameter without one contributes zeros, as in
        Horovod: every rank must hand over the same list)."""
        if hvd.size() == 1 or not self.parameters:
            self._reduced = True
            return
        for p in self.parameters:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            elif p.grad.is_sparse:  # sync.sparse dense (Horovod's sparse_as_dense)
                p.grad = densify(p.grad)
        wire, ctx = zip(*(self.compressor.compress(p.grad) for p in self.parameters))
        # In place: with no codec the wire tensors *are* the gradients, so the result lands in .grad directly.
        wait(hvd.grouped_allreduce_async_(list(wire), name="hvdsync.grouped", op=self.op))
        for p, w, c in zip(self.parameters, wire, ctx):
            out = self.compressor.decompress(w, c)
            if out is not p.grad:
                p.grad.copy_(out)
        self._reduced = True

    def step(self, closure=None):
        if not self._skip:
            if self._reduced:
                warnings.warn("optimizer.step() after optimizer.synchronize() outside optimizer.skip_synchronize(): "
                              "the gradients are already reduced and are not reduced again", stacklevel=2)
            else:
                self.synchronize()
        self._reduced = False
        return self.optimizer.step(closure)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self._reduced = False
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict:
        return self.optimizer.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state)
