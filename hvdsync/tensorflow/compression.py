"""Gradient codecs in TensorFlow: the kernels (:class:`TFOps`) and the reducers the optimizer calls.

The maths of every codec is in :mod:`hvdsync.core.comm.codecs`; here are only TensorFlow kernels and Horovod calls,
mirroring ``hvdsync/torch/compression.py``. Both reducers work eagerly and inside ``tf.function``:

* :class:`CastReducer` (``none``, ``fp16``, ``bf16``): one ``hvd.grouped_allreduce`` of the core codec's
  ``encode``d tensors, ``decode``d after (what :class:`CodecCompressor`, Horovod's ``compression=`` hook, does).
* :class:`CodecReducer` (top-k, rand-k, int8, PowerSGD): the core's reducer (:mod:`hvdsync.core.comm.reducer`)
  runs the codec and counts; each round becomes one grouped all-reduce and a grouped allgather per dtype here
  (:class:`TFCollectives`). The codec state lives in ``tf.Variable`` slots, created eagerly here (a ``tf.function``
  may only create variables on its first trace) and carried between graph runs.

Inside a ``tf.function`` Python code runs once, when the function is traced, not at every call: a plain
``counter.record(...)`` would count one round however many steps ran. So the record is a ``tf.py_function``, an op
of the graph that runs each time the graph does (and only on the branch of a ``tf.cond`` that is taken): one per
round of collectives (:func:`record_all_on_wire`), not one per tensor, since each is a call back into Python.
"""
from __future__ import annotations

from typing import Sequence

import horovod.tensorflow as hvd
import keras
import numpy as np
import tensorflow as tf

from hvdsync.core.train.runtime import REDUCE_OP_NAMES
from hvdsync.core.comm.codecs import WireCounter
from hvdsync.core.comm.codecs.base import Codec
from hvdsync.core.comm.codecs.registry import get_codec
from hvdsync.core.comm.reducer import CodecReducer as _CoreReducer
from hvdsync.core.comm.reducer import Collectives


def record_on_wire(counter: WireCounter, tensor: tf.Tensor, gradients: int = 1) -> None:
    """Count ``tensor`` in ``counter`` each time it is handed over (eagerly, or at every run of a graph)."""
    record_all_on_wire(counter, [tensor], gradients)


def record_all_on_wire(counter: WireCounter, tensors: Sequence[tf.Tensor], gradients: Sequence[int] | int = 1) -> None:
    """Count every tensor of one round in ``counter`` with a single graph op (:func:`record_on_wire`: one tensor).
    One ``py_function`` per gradient tensor costs a Python call each (~0.1 ms): on a small model that was most of
    what hvdsync's step cost over raw Horovod. ``gradients``: per tensor, or one figure for all."""
    tensors = list(tensors)
    if not tensors:
        return
    weights = [gradients] * len(tensors) if isinstance(gradients, int) else list(gradients)
    kinds = [(t.dtype.size, t.dtype.name, w) for t, w in zip(tensors, weights)]

    def record(sizes) -> list:
        for n, (itemsize, dtype_name, w) in zip(sizes, kinds):
            counter.record(int(n), itemsize, dtype_name, w)
        return []

    # No outputs, yet tf.function still runs it: py_function is stateful, and tf.function keeps every stateful op,
    # in program order (automatic control dependencies). In eager mode it simply runs now.
    sizes = [t.shape.num_elements() for t in tensors]
    if all(n is not None for n in sizes):  # static shapes (the usual case): the sizes are known when tracing
        tf.py_function(lambda: record(sizes), [], [])
    else:
        tf.py_function(lambda n: record(n.numpy()), [tf.stack([tf.size(t, out_type=tf.int64) for t in tensors])], [])


class TFOps:
    """:class:`hvdsync.core.comm.codecs.Ops` on TensorFlow tensors; slots are ``tf.Variable``s."""

    def dtype_name(self, x):
        return x.dtype.name

    def shape(self, x):
        return tuple(int(d) for d in x.shape)

    def cast(self, x, dtype):
        return tf.cast(x, dtype)

    def bitcast(self, x, dtype):
        return tf.bitcast(x, dtype)

    def reshape(self, x, shape):
        return tf.reshape(x, tuple(shape))

    def abs(self, x):
        return tf.abs(x)

    def floor(self, x):
        return tf.floor(x)

    def max(self, x):
        return tf.reshape(tf.reduce_max(x), [1])

    def maximum(self, x, floor):
        return tf.maximum(x, floor)

    def clip(self, x, low, high):
        return tf.clip_by_value(x, low, high)

    def sqrt(self, x):
        return tf.sqrt(x)

    def sum(self, x, axis=None):
        return tf.reduce_sum(x, axis=axis)

    def matmul(self, a, b):
        return tf.matmul(a, b)

    def matmul_into(self, out, a, b):
        return tf.matmul(a, b)   # tensors are values in a graph: nothing to write into

    def transpose(self, a):
        return tf.transpose(a)

    def concat(self, xs, axis):
        return tf.concat(list(xs), axis=axis)

    def topk_indices(self, x, k):
        return tf.math.top_k(x, k).indices

    def take(self, x, idx):
        return tf.gather(x, idx)

    def scatter_add(self, n, idx, values):
        return tf.tensor_scatter_nd_add(tf.zeros([n], values.dtype), tf.reshape(idx, (-1, 1)), values)

    def uniform(self, n, seed, step):
        pair = tf.stack([tf.constant(seed, tf.int64), tf.cast(step, tf.int64)])
        return tf.random.stateless_uniform([n], seed=pair, dtype=tf.float32)

    def all_finite(self, xs):
        return tf.reduce_all(tf.stack([tf.reduce_all(tf.math.is_finite(x)) for x in xs]))

    def slot(self, value):
        return tf.Variable(value, trainable=False, name="hvdsync_codec_state")

    def read(self, slot):
        return slot.read_value()

    def assign(self, slot, value):
        slot.assign(tf.cast(value, slot.dtype) if isinstance(value, tf.Tensor) else np.asarray(value))

    def add_into(self, slot, x):
        # A read after the update, not assign_add's lazy value: that would be read when used, after later changes.
        slot.assign_add(tf.reshape(x, slot.shape), read_value=False)
        return slot.read_value()

    def sub_into(self, slot, x):
        slot.assign_sub(tf.reshape(x, slot.shape), read_value=False)

    def zero_at(self, slot, idx):
        flat = tf.reshape(slot, [-1])
        idx = tf.reshape(tf.cast(idx, tf.int64), [-1, 1])
        slot.assign(tf.reshape(tf.tensor_scatter_nd_update(flat, idx, tf.zeros(tf.shape(idx)[:1], flat.dtype)),
                               slot.shape), read_value=False)

    def to_numpy(self, x):
        return np.asarray(x.numpy())

    def from_numpy(self, a):
        return tf.convert_to_tensor(a)


class CodecCompressor:
    """Horovod ``compression=`` hook for cast codecs: the core codec's ``encode``/``decode`` on TensorFlow tensors;
    every tensor handed over is counted."""

    def __init__(self, codec: Codec | str, counter: WireCounter | None = None) -> None:
        self.codec = get_codec(codec) if isinstance(codec, str) else codec
        self.counter = counter if counter is not None else WireCounter()
        self.ops = TFOps()

    def compress(self, tensor: tf.Tensor):
        wire = self.codec.encode(self.ops, tensor)
        record_on_wire(self.counter, wire)
        return wire, tensor.dtype.name

    def decompress(self, tensor: tf.Tensor, ctx: str) -> tf.Tensor:
        return self.codec.decode(self.ops, tensor, ctx)


class CastReducer:
    """All-reduces gradients in one ``hvd.grouped_allreduce`` through a cast codec's compressor."""

    state = None  # cast codecs keep no state

    def __init__(self, codec: Codec | str, sync, counter: WireCounter | None = None) -> None:
        self.compression = CodecCompressor(codec, counter)
        self.counter = self.compression.counter
        self.op = getattr(hvd, REDUCE_OP_NAMES[sync.op])

    def reduce(self, grads: Sequence[tf.Tensor]) -> list[tf.Tensor]:
        # What Horovod's compression= hook does (encode, all-reduce, decode), with the round counted in one op.
        grads, codec, ops = list(grads), self.compression.codec, self.compression.ops
        wire = [codec.encode(ops, g) for g in grads]
        record_all_on_wire(self.counter, wire)
        return [codec.decode(ops, r, g.dtype.name) for r, g in zip(hvd.grouped_allreduce(wire, op=self.op), grads)]


class TFCollectives(Collectives):
    """Horovod's TensorFlow calls for :class:`~hvdsync.core.comm.reducer.CodecReducer`'s rounds (eagerly and inside
    ``tf.function``): the all-reduces in one grouped call, the allgathers in one grouped call per dtype (TensorFlow's
    grouped op takes one dtype: a negotiation per dtype, not one per tensor); counts as ops of the graph
    (:func:`record_all_on_wire`), which run at every run of a traced step."""

    timed = False  # traced into a graph: Python's clock would time the tracing, not the step

    def __init__(self) -> None:
        self.size, self.rank = hvd.size(), hvd.rank()

    def round(self, index: int, reduce: list, gather: list, average: bool) -> tuple[list, list]:
        name = f"hvdsync_codec_{index}"
        reduced = list(hvd.grouped_allreduce(reduce, op=hvd.Average if average else hvd.Sum)) if reduce else []
        gathered: list = [None] * len(gather)
        by_dtype: dict = {}
        for i, t in enumerate(gather):
            by_dtype.setdefault(t.dtype.name, []).append(i)
        for dtype, at in by_dtype.items():
            for i, t in zip(at, hvd.grouped_allgather([gather[i] for i in at], name=f"{name}_gather_{dtype}")):
                gathered[i] = t
        return reduced, gathered

    def record(self, counter: WireCounter, tensors: list) -> None:
        record_all_on_wire(counter, tensors, gradients=0)

    def count_gradients(self, counter: WireCounter, n: int) -> None:
        tf.py_function(lambda: counter.add_gradients(n) or [], [], [])  # runs at every graph run (see above)


class CodecReducer(_CoreReducer):
    """:class:`hvdsync.core.comm.reducer.CodecReducer` on TensorFlow kernels (:class:`TFOps`) and Horovod's
    TensorFlow collectives (:class:`TFCollectives`), plus loss scaling: ``loss_scale`` is set by
    :class:`hvdsync.tensorflow.precision.MixedPrecision` under fp16 (a callable returning the loss scale). The
    arguments are the core's, but ``ops`` and ``collectives``."""

    def __init__(self, codec: Codec | str, shapes: Sequence[tuple[int, ...]], sync, counter: WireCounter | None = None,
                 seed: int = 0) -> None:
        super().__init__(codec, shapes, sync, TFOps(), TFCollectives(), counter, seed)
        self.loss_scale = None

    def reduce(self, grads: Sequence[tf.Tensor]) -> list[tf.Tensor]:
        """The combined gradients, identical on every rank. Every rank must call it, with the same shapes."""
        grads = [tf.convert_to_tensor(g) for g in grads]
        if self.loss_scale is None:
            return super().reduce(grads)
        # Under loss scaling a step may overflow. Then the codec must not run (its residuals and Q would take the
        # inf for good): every rank learns whether any rank overflowed, and all hand the gradients back as they are
        # (the loss-scale optimizer's all-reduced check then skips the update everywhere). Otherwise the codec
        # works on the real gradient, so residuals keep their meaning when the scale changes.
        scale = self.loss_scale()
        bad = hvd.allreduce(tf.reshape(tf.cast(tf.logical_not(self.ops.all_finite(grads)), tf.float32), [1]),
                            op=hvd.Max, name="hvdsync.codec.overflow")
        return tf.cond(tf.equal(bad[0], 0.0),
                       lambda: [g * scale for g in super(CodecReducer, self).reduce([g / scale for g in grads])],
                       lambda: list(grads))


def take_sgd_momentum(optimizer, codec: Codec) -> bool:
    """Move ``keras.optimizers.SGD``'s momentum into ``codec`` (``sync.momentum_correction``; DGC): the optimizer
    keeps stepping, without momentum (Keras reads ``momentum`` when it traces its update). Keras' weight decay is
    decoupled (applied to the weights, not added to the gradient), so it stays in the optimizer. Looks through a
    ``LossScaleOptimizer``. Returns whether the momentum moved."""
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    if not isinstance(inner, keras.optimizers.SGD) or not inner.momentum:
        return False
    codec.correct_momentum(inner.momentum, inner.nesterov)
    inner.momentum, inner.nesterov = 0.0, False
    return True


def make_reducer(sync, codec: Codec, shapes: Sequence[tuple[int, ...]], counter: WireCounter | None = None,
                 seed: int = 0, optimizer=None):
    """The reducer for ``codec`` (the optimizer's one codec, built from ``sync.compression``): a
    :class:`CastReducer` or a :class:`CodecReducer`; both have ``reduce(grads)``, ``counter`` and ``state``
    (``None`` or a :class:`~hvdsync.tensorflow.CodecState`). ``sync``: the checked settings (op, error
    feedback, momentum correction). ``optimizer``: the local Keras optimizer, whose SGD momentum the codec takes
    under ``sync.momentum_correction``."""
    if optimizer is not None and sync.momentum_correction and codec.takes_momentum(sync.error_feedback):
        take_sgd_momentum(optimizer, codec)
    if codec.cast:
        return CastReducer(codec, sync, counter)
    return CodecReducer(codec, shapes, sync, counter, seed)
