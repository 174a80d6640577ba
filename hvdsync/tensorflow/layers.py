"""Synchronised batch normalisation for Keras 3: batch statistics over the samples of *all* ranks.

With data parallelism each rank sees only its share of the global batch; plain batch normalisation then
normalises with statistics of that share, and the moving statistics differ between ranks. Here each rank
all-reduces (sum) its per-channel ``[sum, sum of squares, count]`` once per call, so every rank normalises with
the mean and variance of the whole global batch. Counts are summed rather than assuming equal shares, so ranks
with different (even empty) micro-batches on the last step still get the exact global statistics.
"""
from __future__ import annotations

import horovod.tensorflow as hvd
import keras
import tensorflow as tf

from hvdsync.core.train.batchnorm import global_moments


@keras.saving.register_keras_serializable(package="hvdsync")
class SyncBatchNormalization(keras.layers.BatchNormalization):
    """``keras.layers.BatchNormalization`` whose training-time statistics are reduced across Horovod workers.

    Use it like the Keras layer; in inference (``training=False``) it uses the moving statistics and communicates
    nothing. Every rank must call it in training mode the same number of times (each call is an all-reduce).

    Example:
        >>> keras.Sequential([keras.Input((8,)), keras.layers.Dense(16), SyncBatchNormalization()])  # doctest: +SKIP
    """

    def _moments(self, inputs, mask):
        # Keras' hook for the batch statistics (called only in training); the rest of the layer is unchanged.
        if hvd.size() == 1:
            return super()._moments(inputs, mask)
        axes = self._reduction_axes
        weights = tf.ones_like(inputs) if mask is None else tf.broadcast_to(
            tf.cast(tf.expand_dims(mask, -1), inputs.dtype), tf.shape(inputs))
        local = tf.stack([tf.reduce_sum(inputs * weights, axes), tf.reduce_sum(tf.square(inputs) * weights, axes),
                          tf.reduce_sum(weights, axes)])
        return global_moments(hvd.allreduce(local, op=hvd.Sum), tf.maximum)
