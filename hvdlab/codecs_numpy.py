"""The codec kernels on numpy arrays (lab): the reference the framework kernels are tested against, and a simulated
world of ranks (:func:`simulate`) that runs a codec's collectives in one process (tests, notebook 15)."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from hvdsync.core.comm.codecs.base import Allgather, Allreduce, Codec, ReduceContext


def _np_dtype(name: str):
    if name == "bfloat16":
        import ml_dtypes  # numpy has no bfloat16; ml_dtypes (TensorFlow's and JAX's) adds it

        return ml_dtypes.bfloat16
    return np.dtype(name)


class NumpyOps:
    """:class:`~hvdsync.core.comm.codecs.base.Ops` on numpy arrays; slots are arrays updated in place."""

    def dtype_name(self, x):
        return np.asarray(x).dtype.name

    def shape(self, x):
        return tuple(np.shape(x))

    def cast(self, x, dtype):
        return np.asarray(x).astype(_np_dtype(dtype))

    def bitcast(self, x, dtype):
        return np.asarray(x).view(_np_dtype(dtype))

    def reshape(self, x, shape):
        return np.reshape(x, tuple(shape))

    def abs(self, x):
        return np.abs(x)

    def floor(self, x):
        return np.floor(x)

    def max(self, x):
        return np.max(x).reshape(1)

    def maximum(self, x, floor):
        return np.maximum(x, np.asarray(floor, dtype=np.asarray(x).dtype))

    def clip(self, x, low, high):
        return np.clip(x, low, high).astype(np.asarray(x).dtype)

    def sqrt(self, x):
        return np.sqrt(x)

    def sum(self, x, axis=None):
        return np.sum(x, axis=axis)

    def matmul(self, a, b):
        return a @ b

    def matmul_into(self, out, a, b):
        return a @ b   # the reference leaves its inputs as they were

    def transpose(self, a):
        return a.T

    def concat(self, xs, axis):
        return np.concatenate(xs, axis=axis)

    def topk_indices(self, x, k):
        # Largest first, ties to the lower index (what torch.topk and tf.math.top_k do on the CPU for distinct values).
        return np.argsort(-x, kind="stable")[:k].astype(np.int32)

    def take(self, x, idx):
        return x[idx]

    def scatter_add(self, n, idx, values):
        out = np.zeros(n, dtype=np.asarray(values).dtype)
        np.add.at(out, idx, values)
        return out

    def uniform(self, n, seed, step):
        return np.random.default_rng([seed, int(step)]).random(n, dtype=np.float32)

    def all_finite(self, xs):
        return np.bool_(all(np.isfinite(x).all() for x in xs))

    def slot(self, value):
        return np.array(value)

    def read(self, slot):
        return slot.copy()

    def assign(self, slot, value):
        slot[...] = value

    # Value semantics (a copy, as read gives): a codec that read add_into's value after changing the slot again
    # would compute something else in torch, where it is the slot itself, and the kernel tests would catch it.
    def add_into(self, slot, x):
        slot += np.reshape(x, slot.shape)
        return slot.copy()

    def sub_into(self, slot, x):
        slot -= np.reshape(x, slot.shape)

    def zero_at(self, slot, idx):
        slot.reshape(-1)[np.asarray(idx)] = 0.0

    def to_numpy(self, x):
        return np.asarray(x)

    def from_numpy(self, a):
        return np.asarray(a)


def simulate(codec: Codec, grads: Sequence[Sequence], states, average: bool = True, error_feedback: bool = True,
             seed: int = 0, ops=None, counter=None) -> list[list]:
    """Run ``codec`` for ``len(grads)`` simulated ranks in one process: ``grads[r]`` is rank r's gradient list,
    ``states[r]`` its :class:`~hvdsync.core.comm.codecs.state.CodecState`. Returns each rank's combined gradients.

    The collectives are numpy: an all-reduce is the sum (or mean) of the ranks' tensors, an allgather their
    concatenation in rank order, exactly what Horovod returns. ``ops`` (default :class:`NumpyOps`) runs the codec's
    kernels, so a framework's kernels can run in the same simulated world; ``counter`` (a
    :class:`~hvdsync.core.comm.codecs.base.WireCounter`) records rank 0's requests.
    """
    ops = ops or NumpyOps()
    size = len(grads)
    gens = [[codec.reduce(ops, g, states[r].slots[i], ReduceContext(size, average, error_feedback, seed, r), i)
             for i, g in enumerate(grads[r])] for r in range(size)]
    out = [[None] * len(grads[0]) for _ in range(size)]
    replies = [[None] * len(grads[0]) for _ in range(size)]
    while True:
        requests = [[None] * len(grads[0]) for _ in range(size)]
        for r in range(size):
            for i, gen in enumerate(gens[r]):
                if gen is None:
                    continue
                try:
                    requests[r][i] = gen.send(replies[r][i])
                except StopIteration as stop:
                    out[r][i], gens[r][i] = stop.value, None
        if all(g is None for row in gens for g in row):
            return out
        for i in range(len(grads[0])):
            if requests[0][i] is None:
                continue
            results = []
            for j, req in enumerate(requests[0][i]):
                pieces = [ops.to_numpy(requests[r][i][j].tensor) for r in range(size)]
                if counter is not None:
                    counter.record(pieces[0].size, pieces[0].dtype.itemsize, pieces[0].dtype.name, gradients=0)
                if isinstance(req, Allreduce):
                    total = np.sum(pieces, axis=0, dtype=pieces[0].dtype)
                    results.append(ops.from_numpy(total / np.asarray(size, total.dtype) if average else total))
                elif isinstance(req, Allgather):
                    results.append(ops.from_numpy(np.concatenate(pieces, axis=0)))
            for r in range(size):
                replies[r][i] = list(results)
