"""Sparse gradients in TensorFlow (``tf.IndexedSlices`` from ``tf.gather`` / Keras ``Embedding``): ``sync.sparse``.

``dense`` converts the slices to a dense tensor before the all-reduce (Horovod's ``sparse_as_dense``).
``allgather`` adds the slices into the optimizer's gradient sum row by row (no dense conversion), then sends only
the rows that sum holds, as int32 indices and the rows encoded by the cast codec; every rank adds all ranks' rows
into a zero table. Mirrors :mod:`hvdsync.torch.sparse`; formulas in :mod:`hvdsync.core.comm.sparse`.
"""
from __future__ import annotations

import horovod.tensorflow as hvd
import tensorflow as tf

from hvdsync.core.comm.codecs import WireCounter
from hvdsync.tensorflow.compression import record_on_wire


def add_slices(total, slices: tf.IndexedSlices) -> None:
    """Add ``slices`` into the variable ``total`` (a Keras or ``tf.Variable``) at their rows only."""
    variable = getattr(total, "value", total)  # Keras 3 variables wrap a tf.Variable
    variable.scatter_add(tf.IndexedSlices(tf.cast(slices.values, variable.dtype), slices.indices))


def allgather_rows(total: tf.Tensor, name: str, average: bool, compressor, counter: WireCounter) -> tf.Tensor:
    """The sum (or average) over ranks of the dense gradient sum ``total``, moving only its non-zero rows.

    The rows sent are those whose sum is not zero: the rows touched since the last step (a touched row whose
    gradients cancel exactly adds nothing and is left out). Every rank gets the same table back.

    Args:
        total: a rank's summed gradient of an embedding table (rows first).
        name: Horovod's name for the pair of allgathers (the same on every rank).
        average: divide by the world size (``sync.op: average``).
        compressor: the cast codec's :class:`~hvdsync.tensorflow.compression.CodecCompressor` (encodes and counts
            the values).
        counter: records the indices.
    """
    flat = tf.reshape(total, [tf.shape(total)[0], -1])
    rows = tf.cast(tf.where(tf.reduce_any(tf.not_equal(flat, 0), axis=1))[:, 0], tf.int32)
    wire, ctx = compressor.compress(tf.gather(total, rows))
    record_on_wire(counter, rows, gradients=0)
    values = compressor.decompress(hvd.allgather(wire, name=f"{name}_values"), ctx)
    gathered = hvd.allgather(rows, name=f"{name}_rows")
    if average:
        values = values / tf.cast(hvd.size(), values.dtype)
    return tf.tensor_scatter_nd_add(tf.zeros_like(total), tf.expand_dims(gathered, 1), values)
