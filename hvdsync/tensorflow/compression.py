"""Horovod compressor for TensorFlow built from a core codec (:mod:`hvdsync.core.codecs`).

``hvd.grouped_allreduce`` calls ``compress`` on every gradient right before the all-reduce and ``decompress`` on the
result, so what ``compress`` returns is exactly what travels. The :class:`~hvdsync.core.codecs.WireCounter` records it.

Inside a ``tf.function`` Python code runs once, when the function is traced, not at every call: a plain
``counter.record(...)`` would count one round however many steps ran. So the record is a ``tf.py_function``, an op
of the graph that runs each time the graph does (and only on the branch of a ``tf.cond`` that is taken).
"""
from __future__ import annotations

import tensorflow as tf

from hvdsync.core.codecs import Codec, WireCounter, get_codec


def record_on_wire(counter: WireCounter, tensor: tf.Tensor) -> None:
    """Count ``tensor`` in ``counter`` each time it is handed over (eagerly, or at every run of a graph)."""
    itemsize, dtype_name = tensor.dtype.size, tensor.dtype.name
    # No outputs, yet tf.function still runs it: py_function is stateful, and tf.function keeps every stateful op,
    # in program order (automatic control dependencies). In eager mode it simply runs now.
    tf.py_function(lambda n: counter.record(int(n), itemsize, dtype_name) or [],
                   [tf.size(tensor, out_type=tf.int64)], [])


class CodecCompressor:
    """Casts floating-point gradients to the codec's wire dtype and back; counts what it hands over."""

    def __init__(self, codec: Codec | str, counter: WireCounter | None = None) -> None:
        self.codec = get_codec(codec) if isinstance(codec, str) else codec
        self.counter = counter if counter is not None else WireCounter()

    def compress(self, tensor: tf.Tensor):
        wire = tf.cast(tensor, self.codec.wire_dtype) if self.codec.applies_to(tensor.dtype.name) else tensor
        record_on_wire(self.counter, wire)
        return wire, tensor.dtype

    def decompress(self, tensor: tf.Tensor, ctx: tf.DType) -> tf.Tensor:
        return tensor if tensor.dtype == ctx else tf.cast(tensor, ctx)
