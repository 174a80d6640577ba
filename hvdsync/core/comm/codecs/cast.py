"""The 16- and 32-bit codecs that keep a gradient's shape: the cast codecs (``none``, ``fp16``) and ``bf16``.

A cast codec (:attr:`Codec.cast`) changes only the dtype and goes through Horovod's all-reduce, and its own
``compression=`` interface, so PyTorch keeps Horovod's asynchronous all-reduce from the backward hooks; Adasum and
sparse allgather take only these. ``bf16`` is not one, though it sends as many bytes as ``fp16``: Horovod 0.28.1
cannot all-reduce bfloat16 tensors (its PyTorch extension has no bfloat16 kernels: "Tensor type torch.BFloat16Tensor
is not supported"), so ``bf16`` travels as the raw 16-bit patterns through an allgather (int16, 2 bytes per value,
the same bytes as fp16) and every rank sums the ranks' bfloat16 values in float32: one rounding per rank instead of
one per partial sum.

fp16 has 10 mantissa bits and a range up to 65,504; bf16 has 7 mantissa bits and float32's range (notebook 09
plots both): bf16 rounds more coarsely but never overflows where float32 does not.
"""
from __future__ import annotations

from hvdsync.core.comm.codecs.base import Allgather, Codec, Ops, ReduceContext, Reduction, numel


class Cast(Codec):
    """Send floating-point gradients as ``wire_dtype`` (``None``: as they are)."""

    cast = True

    def __init__(self, name: str, wire_dtype: str | None) -> None:
        self.name = name
        self.wire_dtype = wire_dtype

    def __repr__(self) -> str:
        return f"Cast({self.name!r}, {self.wire_dtype!r})"


class BF16(Codec):
    """``bf16``: bfloat16 on the wire (its bits as int16, allgathered), summed in float32 on every rank."""

    name = "bf16"
    wire_dtype = "bfloat16"

    def __repr__(self) -> str:
        return "BF16()"

    def reduce(self, ops: Ops, grad, state, ctx: ReduceContext, index: int) -> Reduction:
        shape, dtype = ops.shape(grad), ops.dtype_name(grad)
        n = numel(shape)
        bits = ops.bitcast(ops.cast(ops.reshape(grad, (n,)), "bfloat16"), "int16")
        (gathered,) = yield [Allgather(bits)]
        values = ops.cast(ops.bitcast(gathered, "bfloat16"), "float32")
        dense = ops.sum(ops.reshape(values, (ctx.size, n)), axis=0)
        if ctx.average:
            dense = dense / ctx.size
        return ops.reshape(ops.cast(dense, dtype), shape)
