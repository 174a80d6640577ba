"""``fit`` for TensorFlow: a :class:`TensorFlowBackend` (Keras 3 model, distributed optimizer) driven by the shared
loop.

Launch with hvdsync's launcher (``hvdsync train --framework tensorflow --np 2``) or inside any Horovod job::

    horovodrun -np 2 -H localhost:2 --gloo python examples/train_tensorflow.py
"""
from __future__ import annotations

import horovod.tensorflow as hvd
import keras
import numpy as np
import tensorflow as tf

from hvdsync.core import data as datasets
from hvdsync.core.loop import FitResult, fit_with
from hvdsync.core.profiling import PhaseTimer
from hvdsync.core.scaling import scaled_lr
from hvdsync.registry import build_model
from hvdsync.tensorflow.models import local_optimizer
from hvdsync.tensorflow.optimizer import broadcast_state, distributed_optimizer
from hvdsync.tensorflow.precision import MixedPrecision
from hvdsync.tensorflow.runtime import init


class TensorFlowBackend:
    """The TensorFlow side of :class:`hvdsync.core.loop.Backend`.

    A step is ``accumulate`` calls of a traced backward pass, one traced all-reduce and one traced update: three
    small ``tf.function`` graphs, so that the loop's phase timer sees compute, sync wait and update apart.
    """

    framework = "tensorflow"

    def __init__(self, model: keras.Model, optimizer: keras.optimizers.Optimizer, sync, broadcast: bool = True,
                 precision: MixedPrecision | None = None, seed: int = 0) -> None:
        self.rank, self.size = hvd.rank(), hvd.size()
        self.model, self.timer = model, PhaseTimer()
        # Mixed precision: the policy was set before the model was built; fp16 wraps the local optimizer in a
        # loss-scale optimizer whose skip decision is all-reduced (hvdsync.tensorflow.precision).
        self.precision = precision if precision is not None else MixedPrecision("fp32")
        optimizer = self.precision.wrap(optimizer)
        self.optimizer = distributed_optimizer(optimizer, model, sync, seed=seed)
        self.precision.attach(self.optimizer)
        self.wire = self.optimizer.counter  # what the optimizer's compressor hands to Horovod
        if broadcast:  # rank 0's model and optimizer variables to every rank (elastic: the state's first sync does)
            broadcast_state(self.model, self.optimizer)
        # Micro-batch sizes vary (the last step of an epoch is short, even empty on some ranks): a batch dimension
        # of None and the scale as a tensor keep each function to one trace.
        spec = [tf.TensorSpec((None,) + tuple(model.input_shape[1:]), tf.float32), tf.TensorSpec((None,), tf.int64),
                tf.TensorSpec((), tf.float32)]
        self._backward = tf.function(self._backward_pass, input_signature=spec)
        self._synchronize = tf.function(self.optimizer.synchronize)
        self._update = tf.function(self.optimizer.step)

    @property
    def grad_tensors(self) -> int:
        return len(self.model.trainable_variables)

    def refresh(self) -> None:
        """Re-read rank and world size (they change when an elastic job resets)."""
        self.rank, self.size = hvd.rank(), hvd.size()

    def _backward_pass(self, x: tf.Tensor, y: tf.Tensor, scale: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            logits = tf.cast(self.model(x, training=True), tf.float32)  # the loss in float32 under mixed precision
            loss = tf.reduce_sum(keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True))
            # Summed loss times the global-step scale (hvdsync.core.scaling): the optimizer *adds* each pass's
            # gradients, so after `accumulate` passes the sum is the gradient of the mean over the whole global step.
            scaled = self.precision.scale_loss(loss * scale)
        self.optimizer.accumulate(tape.gradient(scaled, self.model.trainable_variables))
        return loss

    def train_step(self, micro, scale: float) -> float:
        total = 0.0
        scale = tf.constant(scale, tf.float32)
        for x, y in micro:
            with self.timer.phase("compute"):
                total += float(self._backward(x, y, scale))
        with self.timer.phase("sync_wait"):
            # One all-reduce for the `accumulate` passes above; every rank runs as many passes, so none waits forever.
            self._synchronize()
        with self.timer.phase("update"):
            self._update()
        return total

    def count_correct(self, x: np.ndarray, y: np.ndarray) -> int:
        logits = self.model(x, training=False)
        return int(np.sum(np.argmax(logits, axis=1) == y))

    def allgather(self, values: np.ndarray) -> np.ndarray:
        t = tf.reshape(tf.constant(np.asarray(values, dtype=np.float64)), (1, -1))
        return hvd.allgather(t, name="hvdsync.metrics").numpy().reshape((self.size,) + np.shape(values))

    def parameters(self) -> list[np.ndarray]:
        return [np.asarray(v.numpy()) for v in self.model.trainable_variables]


def build(cfg, data: datasets.Dataset, broadcast: bool = True) -> TensorFlowBackend:
    """The Keras model, its local optimizer (learning rate scaled per ``train.lr_scaling``), wrapped for Horovod;
    ``broadcast`` rank 0's state now (an elastic job leaves that to its state's first sync)."""
    precision = MixedPrecision(cfg.train.precision)  # sets Keras' dtype policy for the layers built next
    model = build_model(cfg, data, "tensorflow")
    optimizer = local_optimizer(cfg, model, scaled_lr(cfg.train.lr, hvd.size(), cfg.train.lr_scaling))
    return TensorFlowBackend(model, optimizer, cfg.sync, broadcast=broadcast, precision=precision, seed=cfg.train.seed)


def fit(cfg=None, data: datasets.Dataset | None = None, before_step=None) -> FitResult:
    """Initialise this TensorFlow worker, build the model, train it (:func:`hvdsync.core.loop.fit_with`); returns
    this rank's :class:`~hvdsync.core.loop.FitResult`. ``cfg`` defaults to ``Config()``, ``data`` to the dataset
    ``cfg.data`` names; ``before_step(epoch, step)`` is an optional hook."""
    return fit_with(init, build, cfg, data, before_step)
