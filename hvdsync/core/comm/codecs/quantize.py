"""``int8``: unbiased stochastic quantisation to 8 bits with a per-tensor scale (QSGD-style; Alistarh et al. 2017).

Each rank maps ``x`` (gradient + residual) to integers in [-127, 127] with the scale ``s = max|x|``::

    q = floor(x / s * 127 + u),  u ~ U[0, 1) drawn per rank     =>   E[q * s / 127] = x   (unbiased)

and sends ``q`` as int8 plus ``s`` as one float32: about a quarter of float32's bytes. An int8 sum over ranks would
overflow, so the pieces are allgathered and each rank decodes ``sum_r q_r * s_r / 127``. Error feedback (on by
default, ``sync.error_feedback``) keeps the rounding error ``x - q * s / 127`` for the next step.
"""
from __future__ import annotations

import numpy as np

from hvdsync.core.comm.codecs.base import Allgather, Codec, Ops, ReduceContext, Reduction, mix_seed, numel

LEVELS = 127
# Keeps x / s finite for an all-zero tensor (then every q is 0 whatever s is).
TINY = float(np.finfo(np.float32).tiny)


def quantize(ops: Ops, x, noise):
    """``(q, s)``: float-valued levels in [-127, 127] and the scale, shape (1,). Deterministic given ``noise``."""
    scale = ops.maximum(ops.max(ops.abs(x)), TINY)
    # |x| / s <= 1 exactly, but 127 + u can round up to 128 in float32: clip (only |x| = s is affected, and
    # floor(127 + u) is 127 there anyway, so the clip keeps the rounding unbiased).
    q = ops.clip(ops.floor(x / scale * LEVELS + noise), -LEVELS, LEVELS)
    return q, scale


def dequantize(ops: Ops, q, scale):
    return q * scale / LEVELS


class Int8(Codec):
    """``int8``: stochastic rounding to 255 levels, int8 values and a float32 scale allgathered."""

    name = "int8"

    def __repr__(self) -> str:
        return "Int8()"

    def slots(self, shape, index, seed):
        return {"residual": np.zeros(shape, np.float32), "step": np.zeros((), np.int64)}

    def reduce(self, ops: Ops, grad, state, ctx: ReduceContext, index: int) -> Reduction:
        shape = ops.shape(grad)
        n = numel(shape)
        x = ops.reshape(grad, (n,))
        if ctx.error_feedback:   # x + residual, in the residual's slot (as in top-k): no new tensor per step
            x = ops.reshape(ops.add_into(state["residual"], grad), (n,))
        # Per-rank noise (the rank is in the seed): independent rounding errors average out across ranks.
        noise = ops.uniform(n, mix_seed(ctx.seed, index, ctx.rank + 1), ops.read(state["step"]))
        q, scale = quantize(ops, x, noise)
        if ctx.error_feedback:
            ops.sub_into(state["residual"], dequantize(ops, q, scale))   # x is not read after this
        ops.assign(state["step"], ops.read(state["step"]) + 1)
        all_q, all_scales = yield [Allgather(ops.cast(q, "int8")), Allgather(scale)]
        levels = ops.reshape(ops.cast(all_q, "float32"), (ctx.size, n)) * ops.reshape(all_scales, (ctx.size, 1))
        dense = ops.sum(levels, axis=0) / LEVELS
        if ctx.average:
            dense = dense / ctx.size
        return ops.reshape(dense, shape)

    def wire_bytes(self, shape, itemsize):
        return numel(shape) * 1 + 4
