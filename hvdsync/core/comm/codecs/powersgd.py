"""``powersgd:<rank>``: low-rank gradients with error feedback (Vogels et al. 2019, "PowerSGD").

A gradient is viewed as an n x m matrix M (:func:`matrix_shape`: the split of its dimensions closest to square,
so that PyTorch's and Keras' layouts of a convolution give the same matrix), plus this rank's residual. One step of power
iteration, warm-started from the previous step's Q (m x r), approximates the *average* M by a rank-r product::

    P = M Q;   P <- allreduce(P);   P <- orthonormal columns of P
    Q = M^T P; Q <- allreduce(Q);   M_avg ~= P Q^T;   residual = M - P Q^T

Two small all-reduces per matrix ((n + m) * r values instead of n * m), identical results on every rank. The first
Q is drawn from a seed every rank shares (global seed, parameter), so no broadcast is needed. Vectors (biases), and
matrices too small to gain (r * (n + m) >= n * m), are all-reduced as they are.
"""
from __future__ import annotations

import numpy as np

from hvdsync.core.comm.codecs.base import Allreduce, Codec, Ops, ReduceContext, Reduction, mix_seed, numel

EPS = 1e-8


def matrix_shape(shape: tuple[int, ...]) -> tuple[int, int]:
    """The rows x cols view of a gradient: its dimensions split into a leading and a trailing group, at the split
    closest to square (the largest min(rows, cols)).

    Why not simply ``shape[0] x rest``: the frameworks lay weights out differently. A PyTorch convolution is
    (out, in, kh, kw) and splits at ``out x (in kh kw)``; a Keras kernel is (kh, kw, in, out), where ``shape[0]``
    would make a 3 x (3 in out) matrix, on which a rank-2 approximation saves almost nothing and loses a lot. The
    most square split is ``(kh kw in) x out``: the same matrix as PyTorch's, transposed, so both frameworks
    compress the same tensors by the same factor. A 2-D weight has one split (Keras' dense kernel is PyTorch's
    linear weight transposed).
    """
    if len(shape) < 2:
        rows = int(shape[0]) if shape else 1
        return rows, numel(shape) // max(1, rows)
    splits = [(numel(shape[:i]), numel(shape[i:])) for i in range(1, len(shape))]
    return max(splits, key=lambda rc: min(rc))   # ties: the earliest split


def orthogonalize(ops: Ops, p):
    """Gram-Schmidt on the columns of ``p`` (n x r, r small): orthonormal columns spanning the same space."""
    columns = []
    for i in range(ops.shape(p)[1]):
        c = p[:, i:i + 1]
        for prev in columns:
            c = c - ops.sum(c * prev) * prev
        columns.append(c / (ops.sqrt(ops.sum(c * c)) + EPS))
    return ops.concat(columns, axis=1)


class PowerSGD(Codec):
    """``powersgd:<rank>``: rank-r approximation by one warm-started power iteration, two all-reduces."""

    name = "powersgd"
    rounds = 2   # P's all-reduce, then Q's, which needs P

    def __init__(self, rank: int) -> None:
        self.param = int(rank)

    def __repr__(self) -> str:
        return f"PowerSGD({self.param})"

    def compresses(self, shape: tuple[int, ...]) -> bool:
        rows, cols = matrix_shape(shape)
        return len(shape) >= 2 and self.param * (rows + cols) < rows * cols

    def slots(self, shape, index, seed):
        if not self.compresses(shape):
            return {}
        _, cols = matrix_shape(shape)
        q = np.random.default_rng(mix_seed(seed, index)).standard_normal((cols, self.param)).astype(np.float32)
        return {"residual": np.zeros(shape, np.float32), "q": q}

    def reduce(self, ops: Ops, grad, state, ctx: ReduceContext, index: int) -> Reduction:
        shape = ops.shape(grad)
        if not self.compresses(shape):
            (out,) = yield [Allreduce(grad)]
            return out
        # M = gradient + residual, built in the residual's slot: residual = M - P Q^T below then needs no new tensor.
        m = ops.reshape(ops.add_into(state["residual"], grad) if ctx.error_feedback else grad, matrix_shape(shape))
        (p,) = yield [Allreduce(ops.matmul(m, ops.read(state["q"])))]
        p = orthogonalize(ops, p)
        (q,) = yield [Allreduce(ops.matmul(ops.transpose(m), p))]
        # Decoded into the gradient's memory where the adapter allows it: the gradient is not read after M was built.
        approx = ops.matmul_into(grad, p, ops.transpose(q))
        if ctx.error_feedback:
            ops.sub_into(state["residual"], approx)   # M is no longer read after this
        ops.assign(state["q"], q)   # warm start: the next step's power iteration starts from this Q
        return ops.reshape(approx, shape)

    def wire_bytes(self, shape, itemsize):
        if not self.compresses(shape):
            return numel(shape) * itemsize
        rows, cols = matrix_shape(shape)
        return self.param * (rows + cols) * itemsize
