"""``fit`` for TensorFlow: a :class:`TensorFlowBackend` (Keras 3 model, distributed optimizer) driven by the shared
loop.

Launch with hvdsync's launcher (``hvdsync train --framework tensorflow --np 2``) or inside any Horovod job::

    horovodrun -np 2 -H localhost:2 --gloo python examples/train_tensorflow.py
"""
from __future__ import annotations

import time
from typing import Callable, Sequence

import horovod.tensorflow as hvd
import keras
import numpy as np
import tensorflow as tf

from hvdsync import datasets
from hvdsync.core.train.loop import Callback, FitResult, fit_loop
from hvdsync.core.telemetry.profiling import PhaseTimer
from hvdsync.core.train.scaling import scaled_lr
from hvdsync.registry import build_model
from hvdsync.tensorflow.models import constant_learning_rate, local_optimizer
from hvdsync.tensorflow.optimizer import broadcast_state, distributed_optimizer
from hvdsync.tensorflow.precision import MixedPrecision
from hvdsync.tensorflow.runtime import init


def _op_determinism() -> bool:
    """Whether ``tf.config.experimental.enable_op_determinism()`` is on: it forbids ``tf.timestamp``, so the step
    then runs as three graph calls, timed from Python. TensorFlow has no public getter for it."""
    try:
        from tensorflow.python.framework.config import is_op_determinism_enabled
    except ImportError:  # a TensorFlow that moved it: the three graphs work under determinism and without it
        return True
    return bool(is_op_determinism_enabled())


class TensorFlowBackend:
    """The TensorFlow side of :class:`hvdsync.core.train.loop.Backend`.

    A step's last backward pass, its all-reduce and its update run as one ``tf.function`` graph (the passes before
    it, with ``accumulate > 1``, one graph each). Each graph call from Python costs about a millisecond of dispatch
    here: three calls per step made ``fit``'s step 1.06-1.13x a raw Horovod step on the small CNN, one call
    1.01-1.04x, the adapter API's (``benchmarks/tf_apply_overhead.py``). The phase timer still sees compute, sync
    wait and update apart: the graph reads the clock (``tf.timestamp``) when the gradients are ready and when the
    reduced ones are in place. Under op determinism (``train.deterministic``), which forbids that clock, the three
    phases are three graph calls.
    """

    framework = "tensorflow"

    def __init__(self, model: keras.Model, optimizer: keras.optimizers.Optimizer, sync, broadcast: bool = True,
                 precision: MixedPrecision | None = None, seed: int = 0, loss: Callable | None = None,
                 input_shape: tuple[int, ...] | None = None) -> None:
        self.rank, self.size = hvd.rank(), hvd.size()
        self.model, self.timer, self.loss = model, PhaseTimer(), loss
        # Mixed precision: the policy was set before the model was built; fp16 wraps the local optimizer in a
        # loss-scale optimizer whose skip decision is all-reduced (hvdsync.tensorflow.precision).
        self.precision = precision if precision is not None else MixedPrecision("fp32")
        optimizer = self.precision.wrap(optimizer)
        # Summed, not averaged, over the accumulated passes: the loop scales each pass's loss by its share of the
        # global step (hvdsync.core.train.scaling), so the sum is already the global-step mean.
        self.optimizer = distributed_optimizer(optimizer, model, sync, seed=seed, average_accumulated=False)
        self.precision.attach(self.optimizer)
        self.wire = self.optimizer.counter  # what the optimizer's compressor hands to Horovod
        if broadcast:  # rank 0's model and optimizer variables to every rank (elastic: the state's first sync does)
            broadcast_state(self.model, self.optimizer)
        # Micro-batch sizes vary (the last step of an epoch is short, even empty on some ranks): a batch dimension
        # of None and the scale as a tensor keep each function to one trace.
        # A subclassed model declares no input shape: the data's sample shape says it.
        x_shape = (None, *input_shape) if input_shape is not None else (None,) + tuple(model.input_shape[1:])
        spec = [tf.TensorSpec(x_shape, tf.float32), tf.TensorSpec((None,), tf.int64),
                tf.TensorSpec((), tf.float32)]
        # A step's first pass overwrites the sums (the update left the reduced gradients there, for grad_norm), the
        # others add to them: two graphs, so that neither reads a flag at run time.
        self._first_backward = tf.function(self._first_pass, input_signature=spec)
        self._backward = tf.function(self._backward_pass, input_signature=spec)
        self._clear = tf.function(self.optimizer.clear)
        self._synchronize = tf.function(self.optimizer.synchronize)
        self._update = tf.function(lambda: self.optimizer.step(clear=False))
        # The last pass + all-reduce + update in one graph: one for a step's first pass (fresh sums), one for a later.
        self._fused = {fresh: tf.function(lambda x, y, s, fresh=fresh: self._fused_pass(x, y, s, fresh),
                                          input_signature=spec) for fresh in (True, False)}
        self._norm = None  # traced on the first grad_norm() call: monitoring asks every monitor.every steps
        self._predict = None  # traced on the first count_correct() call (evaluation)

    def traces(self) -> dict[str, int]:
        """How many times each of the step's ``tf.function`` graphs was traced so far (0: not called yet). One
        each, whatever the batch sizes: unequal shares and short last steps change a rank's batch every epoch, and a
        retrace costs far more than a step (``tests/parallel/test_shares.py`` checks it)."""
        graphs = {"first_backward": self._first_backward, "backward": self._backward, "clear": self._clear,
                  "synchronize": self._synchronize, "update": self._update, "predict": self._predict,
                  "step_first": self._fused[True], "step_last": self._fused[False]}
        return {k: (f.experimental_get_tracing_count() if f is not None else 0) for k, f in graphs.items()}

    @property
    def grad_tensors(self) -> int:
        return len(self.model.trainable_variables)

    def refresh(self) -> None:
        """Re-read rank and world size (they change when an elastic job resets)."""
        self.rank, self.size = hvd.rank(), hvd.size()

    def _first_pass(self, x: tf.Tensor, y: tf.Tensor, scale: tf.Tensor) -> tf.Tensor:
        return self._backward_pass(x, y, scale, fresh=True)

    def _backward_pass(self, x: tf.Tensor, y: tf.Tensor, scale: tf.Tensor, fresh: bool = False) -> tf.Tensor:
        loss, grads = self._gradients(x, y, scale)
        self.optimizer.accumulate(grads, fresh=fresh)
        return loss

    def _fused_pass(self, x: tf.Tensor, y: tf.Tensor, scale: tf.Tensor, fresh: bool) -> tf.Tensor:
        """A step's last backward pass, the all-reduce and the update; returns ``[loss, t_computed, t_synced]``
        (the clock, seconds since the epoch, as ``time.time()``): when the gradients were ready and when the reduced
        ones were in the sums."""
        loss, grads = self._gradients(x, y, scale)
        # Timestamps are stateful but touch no resource, so tf.function does not order them: explicit dependencies.
        # (A variable the loss does not touch has no gradient: None, which no dependency can name.)
        ready = [t for t in tf.nest.flatten(grads, expand_composites=True) if t is not None]
        with tf.control_dependencies([loss, *ready]):
            computed = tf.timestamp()
        if fresh and self.optimizer.direct:
            # One pass per step: the gradients go straight into the all-reduce and the update, as in a raw Horovod
            # step; the reduced ones are kept in the sums only for grad_norm (one write, no read back).
            reduced = self.optimizer.reduce_pass(grads, keep=True)
            with tf.control_dependencies(reduced):
                synced = tf.timestamp()
            self.optimizer.apply_reduced(reduced)
        else:
            self.optimizer.accumulate(grads, fresh=fresh)
            self.optimizer.synchronize()
            # Reads after the sums' last writes (tf.function orders ops on one variable): the all-reduce is done.
            with tf.control_dependencies([tf.identity(s.value) for s in self.optimizer.gradient_sums]):
                synced = tf.timestamp()
            self.optimizer.step(clear=False)
        return tf.stack([tf.cast(loss, tf.float64), computed, synced])

    def _gradients(self, x: tf.Tensor, y: tf.Tensor, scale: tf.Tensor) -> tuple[tf.Tensor, list]:
        with tf.GradientTape() as tape:
            logits = tf.cast(self.model(x, training=True), tf.float32)  # the loss in float32 under mixed precision
            if self.loss is None:
                loss = tf.reduce_sum(keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True))
            else:  # the user's loss is the batch mean (Keras' convention): times the batch size it is the sum
                loss = self.loss(y, logits) * tf.cast(tf.shape(x)[0], tf.float32)
            # Summed loss times the global-step scale (hvdsync.core.train.scaling): the optimizer *adds* each pass's
            # gradients, so after `accumulate` passes the sum is the gradient of the mean over the whole global step.
            scaled = self.precision.scale_loss(loss * scale)
        return loss, tape.gradient(scaled, self.model.trainable_variables)

    def train_step(self, micro, scale: float) -> float:
        total = 0.0
        scale = tf.constant(scale, tf.float32)
        # Empty micro-batches (nothing to read on this rank) add nothing; the all-reduce still joins in.
        batches = [(x, y) for x, y in micro if len(y)]
        # The last pass goes into the one-graph step, unless a test slowdown must first measure a pass apart or op
        # determinism forbids the graph's clock reads.
        fuse = batches and self.timer.slows_before and not _op_determinism()
        last = len(batches) - 1 if fuse else len(batches)
        for i, (x, y) in enumerate(batches[:last]):
            with self.timer.phase("compute", samples=len(y)):
                total += float((self._first_backward if i == 0 else self._backward)(x, y, scale))
        if last < len(batches):
            x, y = batches[last]
            slowed = self.timer.slow_before(len(y))
            start = time.time()
            loss, computed, synced = self._fused[last == 0](x, y, scale).numpy()
            end = time.time()
            self.timer.add_compute(computed - start, len(y), slowed)
            self.timer.add("sync_wait", synced - computed)
            self.timer.add("update", end - synced)  # with the call's return to Python
            return total + float(loss)
        if not batches:  # no samples here this step: the last step's reduced gradients must not go out again
            self._clear()
        with self.timer.phase("sync_wait"):
            # One all-reduce for the `accumulate` passes above; every rank runs as many passes, so none waits forever.
            self._synchronize()
        with self.timer.phase("update"):
            self._update()
        return total

    def scale_learning_rate(self, factor: float) -> None:
        """Set the learning rate to ``factor`` times its value at the first call (the growing batch's rule,
        :class:`hvdsync.core.train.adaptive.GrowthLearningRate`)."""
        rate = constant_learning_rate(self.optimizer)
        if not hasattr(self, "_base_lr"):
            self._base_lr = float(np.asarray(rate))
        rate.assign(self._base_lr * factor)

    def count_correct(self, x: np.ndarray, y: np.ndarray) -> int:
        if self._predict is None:
            # Traced once (a batch dimension of None): Keras' eager call of a model runs op by op, which made the
            # evaluation of every epoch ~1.5x slower than this graph (MLP 64-4096-10, 8,192 samples: 150 -> 95 ms),
            # time in which no share of a step can be won back (benchmarks/README.md, "Straggler-aware shares").
            spec = tf.TensorSpec((None, *np.shape(x)[1:]), tf.as_dtype(np.asarray(x).dtype))
            self._predict = tf.function(lambda v: tf.argmax(self.model(v, training=False), axis=1),
                                        input_signature=[spec])
        return int(np.sum(self._predict(x).numpy() == np.asarray(y)))

    def allgather(self, values: np.ndarray) -> np.ndarray:
        t = tf.reshape(tf.constant(np.asarray(values, dtype=np.float64)), (1, -1))
        return hvd.allgather(t, name="hvdsync.metrics").numpy().reshape((self.size,) + np.shape(values))

    def parameters(self) -> list[np.ndarray]:
        return [np.asarray(v.numpy()) for v in self.model.trainable_variables]

    def grad_norm(self) -> float:
        """L2 norm of the last step's (all-reduced) gradient, for the monitor (``monitor/grad_norm``): computed
        when asked, from the optimizer's sums, where the update leaves it (as PyTorch's ``.grad``); 0 before the
        first step."""
        if self._norm is None:
            self._norm = tf.function(
                lambda: tf.linalg.global_norm([tf.cast(s, tf.float32) for s in self.optimizer.gradient_sums]))
        return float(self._norm())


def build(cfg, data: datasets.Dataset, broadcast: bool = True, model: keras.Model | None = None,
          loss: Callable | None = None, optimizer: keras.optimizers.Optimizer | None = None) -> TensorFlowBackend:
    """The backend for ``cfg``: ``model`` (default: the registered ``train.model`` sized for ``data``), its local
    optimizer (default: ``train.optimizer`` with the learning rate scaled per ``train.lr_scaling``), Horovod;
    ``broadcast`` rank 0's state now (an elastic job leaves that to its state's first sync)."""
    precision = MixedPrecision(cfg.train.precision)  # sets Keras' dtype policy for the layers built next
    model = model if model is not None else build_model(cfg, data, "tensorflow")
    if optimizer is None:
        optimizer = local_optimizer(cfg, model, scaled_lr(cfg.train.lr, hvd.size(), cfg.train.lr_scaling))
    return TensorFlowBackend(model, optimizer, cfg.sync, broadcast=broadcast, precision=precision,
                             seed=cfg.train.seed, loss=loss, input_shape=tuple(data.x_train.shape[1:]))


def fit(cfg=None, data: datasets.Dataset | None = None, before_step=None, *, model: keras.Model | None = None,
        loss: Callable | None = None, optimizer: keras.optimizers.Optimizer | None = None,
        evaluate: Callable | None = None, callbacks: Sequence[Callback] = ()) -> FitResult:
    """Initialise this TensorFlow worker and train with the shared loop; returns this rank's
    :class:`~hvdsync.core.train.loop.FitResult`. The same arguments as :func:`hvdsync.torch.fit` (a ``tf.data`` pipeline of
    your own goes through Keras' ``fit`` with :class:`~hvdsync.tensorflow.PlanSampler` instead).

    Args:
        cfg: a :class:`~hvdsync.config.Config` (default ``Config()``).
        data: in-memory arrays (:class:`~hvdsync.core.train.data.Dataset`) instead of the registered ``data.dataset``.
        before_step: ``before_step(epoch, step)`` on every rank before each step.
        model: your Keras model (then ``loss`` is required), e.g. :class:`~hvdsync.tensorflow.CNN`.
        loss: ``loss(y_true, y_pred)`` returning the batch *mean*, e.g.
            ``keras.losses.SparseCategoricalCrossentropy(from_logits=True)``.
        optimizer: your *local* Keras optimizer (default: ``train.optimizer`` at the scaled ``train.lr``).
        evaluate: ``evaluate() -> {metric: (sum, count)}`` over this rank's share (default: test accuracy).
        callbacks: :class:`~hvdsync.core.train.loop.Callback` objects.
    """
    from hvdsync.config import Config  # here: hvdsync.config imports the core, not the adapters

    if model is not None and loss is None:
        raise ValueError("loss: fit(model=...) with your own model needs loss=... (e.g. "
                         "keras.losses.SparseCategoricalCrossentropy(from_logits=True)); only hvdsync's registered "
                         "models come with a default loss")
    cfg = cfg or Config()
    init(cfg)
    data = data if data is not None else datasets.load(cfg.data, cfg.train.seed)
    backend = build(cfg, data, model=model, loss=loss, optimizer=optimizer)
    return fit_loop(cfg, backend, data, evaluate, callbacks=callbacks, before_step=before_step)
