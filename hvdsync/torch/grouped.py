"""Grouped all-reduces in a few buckets, for models whose gradients are small (``sync.grouped_mb``).

``hvd.DistributedOptimizer`` hands each gradient to Horovod from a hook the moment backward produces it, so that big
gradients are reduced while backward computes the earlier layers'. For a small model (the 10 k-parameter CNN: 40 kB
of gradients, a backward of a few ms) there is nothing to hide behind, and the hooks only cost: each group of
tensors that happens to be ready in one of Horovod's cycles becomes its own round (a cycle's wait, a negotiation,
a ring, thread hand-offs), several per step. :class:`GroupedOptimizer` hands the gradients over in buckets fixed
once, like DDP's: each bucket is ONE ``hvd.grouped_allreduce_async_`` (one round, in place), started when backward
has produced its last gradient; a small model is one bucket, reduced after backward, which is what DDP does with a
model that fits its first bucket. It waits with :func:`hvdsync.torch.runtime.wait`: blocked on a condition
variable where the installed Horovod has hvdsync's patch 0005, else polling with short sleeps, never in an
unpatched Horovod's spinning ``hvd.synchronize``.

The result is the same sum as the hooks' (per element, the same two addends), so parameters match the hook path's.
"""
from __future__ import annotations

import warnings
from typing import Iterable

import horovod.torch as hvd
import torch

from hvdsync.core.train.runtime import REDUCE_OP_NAMES
from hvdsync.torch.compression import CodecCompressor, LocalOptimizerView
from hvdsync.core._moved import forward
from hvdsync.torch.runtime import wait as _wait
from hvdsync.torch.sparse import densify


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


# wait and POLL_S moved to hvdsync.torch.runtime (the one wait of every PyTorch path); taken from here they still
# work until 0.3.0, with a DeprecationWarning naming the new place.
_MOVED = ("wait", "POLL_S")
_forward = forward(__name__, "hvdsync.torch.runtime", until="0.3.0")


def __getattr__(name: str):
    if name in _MOVED:
        return _forward(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


FIRST_BUCKET_BYTES = 2 ** 20  # DDP's first bucket (1 MiB): the output layers' gradients leave early


def buckets(parameters: list[torch.Tensor], cap_bytes: float) -> list[list[torch.Tensor]]:
    """The parameters in backward order (reverse registration), cut into buckets: the first up to
    :data:`FIRST_BUCKET_BYTES`, the others up to ``cap_bytes``; a tensor larger than a cap is a bucket of its own."""
    out: list[list[torch.Tensor]] = []
    size = 0.0
    for p in reversed(parameters):
        nbytes = p.numel() * p.element_size()
        cap = FIRST_BUCKET_BYTES if len(out) == 1 else cap_bytes
        if not out or (out[-1] and size + nbytes > cap):
            out.append([])
            size = 0.0
        out[-1].append(p)
        size += nbytes
    return out


def _own_hook(p: torch.Tensor, hook) -> None:
    """Register ``hook`` for after ``p.grad`` is accumulated, replacing the one an earlier GroupedOptimizer put on
    the same parameter (an elastic reset or a rebuilt optimizer would otherwise reduce the gradient twice)."""
    old = getattr(p, "_hvdsync_grouped_hook", None)
    if old is not None:
        old.remove()
    p._hvdsync_grouped_hook = p.register_post_accumulate_grad_hook(hook)


class GroupedOptimizer(LocalOptimizerView):
    """A distributed optimizer with ``hvd.DistributedOptimizer``'s calling convention that all-reduces the
    gradients in a few grouped Horovod calls (buckets), each started as soon as the last backward pass of a step has
    produced all of its gradients, like DDP's buckets; ``synchronize()`` (or ``step()``) waits for them.

    Buckets follow the backward pass: the parameters in reverse order of registration (the order autograd produces
    their gradients in), filled up to :data:`FIRST_BUCKET_BYTES` for the first bucket (DDP's first bucket: the last
    layers' small gradients go out while backward computes the rest) and up to ``sync.grouped_mb`` after it. A
    bucket of one tensor is reduced in place in that tensor, with no copy into Horovod's fusion buffer and back; the
    wide MLP's 16.8 MB weight is such a bucket (two copies of it saved per step, docs/measurements/link.md).

    Args:
        optimizer: the local optimizer.
        named_parameters: ``model.named_parameters()`` (their registration order, the same on every rank; names
            label nothing here). ``None``: the optimizer's parameters in their order.
        sync: a :class:`~hvdsync.config.SyncConfig` (``op``: average or sum; ``accumulate``: a bucket starts on the
            ``accumulate``-th backward pass of a step, once the passes have added into ``.grad``).
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
            params = [p for _, p in named_parameters]
        unique = {id(p): p for p in params if p.requires_grad}   # a tied weight is one tensor, reduced once
        self.parameters = list(unique.values())
        self.compressor = compressor
        self.counter = compressor.counter
        self.op = getattr(hvd, REDUCE_OP_NAMES[sync.op])
        self.accumulate = sync.accumulate
        self.buckets = buckets(self.parameters, sync.grouped_mb * 2 ** 20)
        self._bucket_of = {id(p): i for i, b in enumerate(self.buckets) for p in b}
        self._skip = False
        self._reduced = False
        self._reset_step()
        # Hooked whatever the world size (Horovod may not even be started yet when the optimizer is built); a
        # single rank has nothing to reduce and the hook returns at once.
        for p in self.parameters:
            _own_hook(p, self._ready)

    def _reset_step(self) -> None:
        self._passes = {id(p): 0 for p in self.parameters}
        self._waiting = [len(b) for b in self.buckets]
        self._pending: dict[int, tuple] = {}

    def _ready(self, p: torch.Tensor) -> None:
        """Autograd's hook: ``p.grad`` holds this pass's sum; on a step's last pass, count it into its bucket."""
        if hvd.size() == 1:
            return
        key = id(p)
        self._passes[key] += 1
        i = self._bucket_of[key]
        if i in self._pending:
            raise RuntimeError(f"a gradient was computed more than sync.accumulate={self.accumulate} times before "
                               "optimizer.step(): its bucket is already being all-reduced in place; call step() "
                               "every `accumulate` backward passes, or set sync.accumulate to the passes per step")
        if self._passes[key] % self.accumulate == 0:
            self._waiting[i] -= 1
            if self._waiting[i] == 0:
                self._start(i)

    def _start(self, i: int) -> None:
        bucket = self.buckets[i]
        for p in bucket:
            if p.grad is None:
                p.grad = torch.zeros_like(p)   # Horovod needs every rank's same list: an unused one adds zeros
            elif p.grad.is_sparse:             # sync.sparse dense (Horovod's sparse_as_dense)
                p.grad = densify(p.grad)
        wire, ctx = zip(*(self.compressor.compress(p.grad) for p in bucket))
        # In place: with no codec the wire tensors *are* the gradients, so the result lands in .grad directly.
        handle = hvd.grouped_allreduce_async_(list(wire), name=f"hvdsync.grouped.{i}", op=self.op)
        self._pending[i] = (handle, wire, ctx)

    @torch.no_grad()
    def synchronize(self) -> None:
        """Wait for every bucket's all-reduce; a bucket whose gradients did not all arrive from backward (a parameter
        unused this step, fewer passes than ``accumulate``) starts here."""
        if hvd.size() == 1 or not self.parameters:
            self._reduced = True
            return
        for i in range(len(self.buckets)):
            if i not in self._pending:
                self._start(i)
        for i in sorted(self._pending):
            handle, wire, ctx = self._pending[i]
            _wait(handle)
            for p, w, c in zip(self.buckets[i], wire, ctx):
                out = self.compressor.decompress(w, c)
                if out is not p.grad:
                    p.grad.copy_(out)
        self._reset_step()
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
        # A step given up before step() (an exception, an elastic reset): its in-place reductions must finish before
        # the gradients they write into are cleared; their results are dropped with the gradients. After an elastic
        # reset Horovod was shut down and started again: its old handles are gone (ValueError), and so are the
        # reductions that would have written.
        for handle, _, _ in self._pending.values():
            try:
                _wait(handle)
            except (ValueError, hvd.HorovodInternalError):
                pass
        self._reset_step()
        self._reduced = False
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict:
        return self.optimizer.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state)
