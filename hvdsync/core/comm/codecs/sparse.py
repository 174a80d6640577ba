"""Sparsification with error feedback: top-k and random-k (Stich et al. 2018, "Sparsified SGD with memory";
Lin et al. 2018, "Deep gradient compression").

Each rank sends ``k = max(1, floor(ratio * numel))`` entries of ``x = gradient + residual`` and keeps the rest
as its new residual, which is added to the next gradient: nothing is thrown away, only delayed. Without the
residual (``sync.error_feedback: false``) the entries that are never the largest are never applied.

* top-k: each rank picks its own largest |x|, so ranks send different positions: the values *and* the int32
  indices travel through an allgather, and every rank sums all ranks' pieces into the dense gradient.
* rand-k: the positions are drawn from a seed that every rank shares (global seed, parameter, step), so all ranks
  pick the *same* positions: only the k values travel, through an ordinary all-reduce; no indices on the wire.

**Momentum correction** (DGC, Lin et al. 2018, section 3.2). With SGD momentum in the optimizer, error feedback
goes wrong: a value kept back for many steps is released all at once and then *also* amplified by the optimizer's
momentum (up to 1 / (1 - m) = 10x at m = 0.9), so delayed coordinates overshoot. DGC moves the momentum in front
of the sparsifier, per rank::

    u = m u + g                    # the velocity, accumulated locally (Nesterov: the step is g + m u)
    x = residual + u               # error feedback on the velocity, not on the gradient
    send top-k(x);  residual = x where not sent, 0 where sent
    u = 0 where sent               # momentum factor masking: a sent coordinate's stale velocity stops pushing

and the optimizer then applies the combined gradient *without* momentum (the adapters take it out of the user's
SGD: :meth:`_Sparse.correct_momentum`). With nothing held back (ratio 1 and no masking) this is exactly SGD with
momentum on the averaged gradient; masking is the paper's, and only matters for coordinates that are sent.
"""
from __future__ import annotations

import numpy as np

from hvdsync.core.comm.codecs.base import Allgather, Allreduce, Codec, Ops, ReduceContext, Reduction, mix_seed, numel

INDEX_BYTES = 4  # int32 indices


class _Sparse(Codec):
    def __init__(self, ratio: float) -> None:
        self.param = ratio
        self.momentum, self.nesterov = 0.0, False

    def takes_momentum(self, error_feedback: bool) -> bool:
        """Momentum correction applies: the residual exists to hold the velocity."""
        return error_feedback

    def correct_momentum(self, momentum: float, nesterov: bool = False) -> None:
        """Accumulate the velocity here (DGC) instead of in the optimizer; the caller sets the optimizer's momentum
        to 0. Call before the :class:`~hvdsync.core.comm.codecs.state.CodecState` is made (it adds a velocity slot)."""
        self.momentum, self.nesterov = float(momentum), bool(nesterov)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.param!r})"

    def k(self, n: int) -> int:
        """Entries sent for a gradient of ``n`` elements."""
        return max(1, min(n, int(self.param * n)))

    def slots(self, shape, index, seed):
        slots = {"residual": np.zeros(shape, np.float32), "step": np.zeros((), np.int64)}
        if self.momentum:
            slots["velocity"] = np.zeros(shape, np.float32)
        return slots

    def _input(self, ops: Ops, grad, state, ctx: ReduceContext):
        n = numel(ops.shape(grad))
        x = ops.reshape(grad, (n,))
        if self.momentum and ctx.error_feedback:
            u = ops.reshape(ops.read(state["velocity"]), (n,)) * self.momentum + x
            ops.assign(state["velocity"], ops.reshape(u, ops.shape(grad)))
            x = x + u * self.momentum if self.nesterov else u
        if ctx.error_feedback:
            # x + residual, in the residual's slot: the residual is then x with the sent positions zeroed, in place.
            x = ops.reshape(ops.add_into(state["residual"], x), (n,))
        return x, n

    def _keep_rest(self, ops: Ops, idx, state, ctx: ReduceContext) -> None:
        # The residual is exactly what was not sent: x (now in the residual's slot) with the sent positions zeroed.
        if ctx.error_feedback:
            ops.zero_at(state["residual"], idx)
            if self.momentum:   # momentum factor masking: the sent coordinates' velocity restarts from zero
                ops.zero_at(state["velocity"], idx)
        ops.assign(state["step"], ops.read(state["step"]) + 1)


class TopK(_Sparse):
    """``topk:<ratio>``: the k largest |gradient + residual| of each tensor, values and indices allgathered."""

    name = "topk"

    def reduce(self, ops: Ops, grad, state, ctx: ReduceContext, index: int) -> Reduction:
        shape = ops.shape(grad)
        x, n = self._input(ops, grad, state, ctx)
        idx = ops.topk_indices(ops.abs(x), self.k(n))
        values = ops.take(x, idx)
        self._keep_rest(ops, idx, state, ctx)
        all_values, all_idx = yield [Allgather(values), Allgather(idx)]
        dense = ops.scatter_add(n, all_idx, all_values)   # positions picked by several ranks add up
        if ctx.average:
            dense = dense / ctx.size
        return ops.reshape(dense, shape)

    def wire_bytes(self, shape, itemsize):
        return self.k(numel(shape)) * (itemsize + INDEX_BYTES)


class RandK(_Sparse):
    """``randk:<ratio>``: k positions drawn from a seed all ranks share; only the values are all-reduced."""

    name = "randk"

    def reduce(self, ops: Ops, grad, state, ctx: ReduceContext, index: int) -> Reduction:
        shape = ops.shape(grad)
        x, n = self._input(ops, grad, state, ctx)
        # No rank in the seed: every rank draws the same positions, so the values line up for an all-reduce.
        noise = ops.uniform(n, mix_seed(ctx.seed, index), ops.read(state["step"]))
        idx = ops.topk_indices(noise, self.k(n))   # the k largest of n uniforms: k distinct random positions
        values = ops.take(x, idx)
        self._keep_rest(ops, idx, state, ctx)
        (combined,) = yield [Allreduce(values)]
        return ops.reshape(ops.scatter_add(n, idx, combined), shape)

    def wire_bytes(self, shape, itemsize):
        return self.k(numel(shape)) * itemsize
