"""Sparse gradients in PyTorch (``nn.Embedding(sparse=True)``): the ``sync.sparse`` choice on Horovod's optimizer.

``dense`` is Horovod's ``sparse_as_dense=True`` (the densified gradient goes through hvdsync's compression hook,
counted like any gradient). ``allgather`` replaces Horovod's own sparse path, which sends the uncoalesced
gradient (one row per lookup, duplicates included, int64 indices) past the compression hook, so nothing counts
it: here each rank coalesces first (one row per distinct index), sends int32 indices and the rows encoded by the
cast codec, and every byte is recorded. Formulas: :mod:`hvdsync.core.comm.sparse`.
"""
from __future__ import annotations

import types

import horovod.torch as hvd
import torch

from hvdsync.core.comm.codecs import WireCounter
from hvdsync.torch.runtime import wait


def sparse_allgather_async(grad: torch.Tensor, name: str, average: bool, compressor, counter: WireCounter):
    """Start the allgather of a sparse COO gradient's distinct rows; returns a callable giving the combined sparse
    gradient (the sum over ranks, divided by the world size if ``average``), identical on every rank.

    Args:
        grad: a sparse COO tensor whose first dimension is the table's rows (what ``nn.Embedding`` gives).
        name: Horovod's name for the pair of allgathers (the same on every rank).
        average: divide by the world size (``sync.op: average``).
        compressor: a cast codec's :class:`~hvdsync.torch.compression.CodecCompressor`: encodes the values
            (``fp16`` halves them) and records them in ``counter``.
        counter: records the indices (the values are recorded by ``compressor``).
    """
    if grad.shape[0] >= 2**31:
        raise ValueError(f"sync.sparse: 'allgather' is not allowed for a table of {grad.shape[0]} rows; int32 "
                         "row indices reach 2**31 rows: choose dense")
    g = grad.coalesce()  # duplicate lookups summed here, once, instead of sent row by row
    rows = g.indices()[0].to(torch.int32)
    wire, ctx = compressor.compress(g.values())
    counter.record(rows.numel(), rows.element_size(), "int32", gradients=0)
    # Values first: Horovod's own sparse path synchronizes values before indices (horovod issue 2961).
    values_handle = hvd.allgather_async(wire, name=f"{name}.values")
    rows_handle = hvd.allgather_async(rows, name=f"{name}.rows")

    def result() -> torch.Tensor:
        values = compressor.decompress(wait(values_handle), ctx)
        gathered = wait(rows_handle).long()
        if average:
            values = values / hvd.size()
        # Uncoalesced on purpose: a row touched on several ranks is summed by the optimizer's update (index_add).
        return torch.sparse_coo_tensor(gathered.unsqueeze(0), values, grad.shape)

    return result


def use_sparse_allgather(optimizer, counter: WireCounter) -> None:
    """Make a ``hvd.DistributedOptimizer`` send sparse gradients by :func:`sparse_allgather_async`.

    Horovod builds its optimizer class at run time and calls ``self._sparse_allreduce_grad_async(p, name)`` for a
    sparse gradient; an attribute on the instance is found first, so only this optimizer changes.
    """
    # Out of place: the rows gathered from all ranks have another shape than this rank's values, so the in-place
    # decompress of the optimizer's compressor (into the tensor that was compressed) cannot hold them.
    compressor = type(optimizer._compression)(optimizer._compression.codec, optimizer._compression.counter)

    def sparse_allgather(self, p, name):
        handle = sparse_allgather_async(p.grad, name, self.op == hvd.Average, compressor, counter)
        # Horovod then calls compression.decompress(output, ctx): the output is already float32 (ctx says so).
        return handle, str(p.grad.dtype).replace("torch.", "")

    optimizer._sparse_allreduce_grad_async = types.MethodType(sparse_allgather, optimizer)


def densify(grad: torch.Tensor | None) -> torch.Tensor | None:
    """The dense form of a gradient (a codec's kernels work on dense tensors)."""
    return grad.to_dense() if grad is not None and grad.is_sparse else grad
