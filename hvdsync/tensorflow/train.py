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
from hvdsync.core.train import runtime
from hvdsync.core.train._context import FitResult
from hvdsync.core.train.callbacks import Callback
from hvdsync.core.telemetry.modelrecord import ModelRecord, TensorRow
from hvdsync.core.telemetry.profiling import PhaseTimer
from hvdsync.core.train._scaling import scaled_lr
from hvdsync.core.train._plan import PlanState
from hvdsync.fitting import fit_loop
from hvdsync.registry import build_model, make_callbacks
from hvdsync.tensorflow.evaluate import dataset_evaluator
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


def check_same_model(model: keras.Model) -> None:
    """Fail on every rank, before any training, when the ranks built models with different variables
    (:func:`hvdsync.core.train.runtime.check_same_model`; hvdsync pairs the ranks' tensors by position)."""
    runtime.check_same_model([tuple(v.shape) for v in model.variables], lambda row: hvd.allgather(
        tf.constant([row], tf.int64), name="hvdsync.model_check").numpy().tolist())


class TensorFlowBackend:
    """The TensorFlow side of :class:`hvdsync.core.train.loop.Backend`.

    A step's last backward pass, its all-reduce and its update run as one ``tf.function`` graph (the passes before
    it, with ``accumulate > 1``, one graph each). Each graph call from Python costs about a millisecond of dispatch
    here: three calls per step made ``fit``'s step 1.06-1.13x a raw Horovod step on the small CNN, one call
    1.01-1.04x, the adapter API's (``benchmarks/step.py tf-apply``). The phase timer still sees compute, sync
    wait and update apart: the graph reads the clock (``tf.timestamp``) when the gradients are ready and when the
    reduced ones are in place. Under op determinism (``train.deterministic``), which forbids that clock, and with a
    timer that acts at a phase's end (``timer.fuse_phases`` False), the three phases are three graph calls.
    """

    framework = "tensorflow"

    def __init__(self, model: keras.Model, optimizer: keras.optimizers.Optimizer, sync, broadcast: bool = True,
                 precision: MixedPrecision | None = None, seed: int = 0, loss: Callable | None = None,
                 input_shape: tuple[int, ...] | None = None, timer: PhaseTimer | None = None) -> None:
        self.rank, self.size = hvd.rank(), hvd.size()
        if broadcast:  # an elastic job makes no collective call before its loop (its state's sync checks instead)
            check_same_model(model)
        self.model, self.timer, self.loss = model, timer if timer is not None else PhaseTimer(), loss
        # Mixed precision: the policy was set before the model was built; fp16 wraps the local optimizer in a
        # loss-scale optimizer whose skip decision is all-reduced (hvdsync.tensorflow.precision).
        self.precision = precision if precision is not None else MixedPrecision("fp32")
        optimizer = self.precision.wrap(optimizer)
        # The optimizer sums the accumulated passes (the accumulation rule): the loop scales each pass's loss by its
        # share of the global step (hvdsync.core.train._scaling), so the sum is the global-step mean.
        self.optimizer = distributed_optimizer(optimizer, model, sync, seed=seed)
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
            # Summed loss times the global-step scale (hvdsync.core.train._scaling): the optimizer *adds* each pass's
            # gradients, so after `accumulate` passes the sum is the gradient of the mean over the whole global step.
            scaled = self.precision.scale_loss(loss * scale)
        return loss, tape.gradient(scaled, self.model.trainable_variables)

    def train_step(self, micro, scale: float) -> float:
        total = 0.0
        scale = tf.constant(scale, tf.float32)
        # Empty micro-batches (nothing to read on this rank) add nothing; the all-reduce still joins in.
        batches = [(x, y) for x, y in micro if len(y)]
        # The last pass goes into the one-graph step, unless the timer acts at a phase's end (then each phase is a
        # call of its own) or op determinism forbids the graph's clock reads.
        fuse = batches and self.timer.fuse_phases and not _op_determinism()
        last = len(batches) - 1 if fuse else len(batches)
        for i, (x, y) in enumerate(batches[:last]):
            with self.timer.phase("compute", samples=len(y)):
                total += float((self._first_backward if i == 0 else self._backward)(x, y, scale))
        if last < len(batches):
            x, y = batches[last]
            with self.timer.phase("compute", samples=len(y)) as span:
                start = time.time()
                loss, computed, synced = self._fused[last == 0](x, y, scale).numpy()
                end = time.time()
                span.seconds = computed - start  # the call also all-reduced and updated: by the graph's clock
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
            # time in which no share of a step can be won back (docs/measurements/shares.md, "Straggler-aware shares").
            spec = tf.TensorSpec((None, *np.shape(x)[1:]), tf.as_dtype(np.asarray(x).dtype))
            self._predict = tf.function(lambda v: tf.argmax(self.model(v, training=False), axis=1),
                                        input_signature=[spec])
        return int(np.sum(self._predict(x).numpy() == np.asarray(y)))

    def allgather(self, values: np.ndarray) -> np.ndarray:
        t = tf.reshape(tf.constant(np.asarray(values, dtype=np.float64)), (1, -1))
        return hvd.allgather(t, name="hvdsync.metrics").numpy().reshape((self.size,) + np.shape(values))

    def model_record(self, log_model: bool) -> ModelRecord:
        """The callback that records this model at the end of the run: its ``model_summary.txt`` and, with
        ``log_model`` (``tracking.log_model``), the model in MLflow's keras format (:func:`hvdsync.fitting.fit_loop`
        adds it)."""
        return _model_record(self.model, log_model)

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


def build(cfg, data: datasets.Dataset, model: keras.Model | None = None, loss: Callable | None = None,
          optimizer: keras.optimizers.Optimizer | None = None, broadcast: bool = True,
          timer: PhaseTimer | None = None) -> TensorFlowBackend:
    """The backend for ``cfg``: ``model`` (default: the registered ``train.model`` sized for ``data``), its local
    optimizer (default: ``train.optimizer`` with the learning rate scaled per ``train.lr_scaling``), Horovod;
    ``broadcast`` rank 0's state now (an elastic job leaves that to its state's first sync); ``timer`` times the
    phases (default a new :class:`~hvdsync.core.telemetry.profiling.PhaseTimer`)."""
    precision = MixedPrecision(cfg.train.precision)  # sets Keras' dtype policy for the layers built next
    model = model if model is not None else build_model(cfg, data, "tensorflow")
    if optimizer is None:
        optimizer = local_optimizer(cfg, model, scaled_lr(cfg.train.lr, hvd.size(), cfg.train.lr_scaling))
    return TensorFlowBackend(model, optimizer, cfg.sync, broadcast=broadcast, precision=precision,
                             seed=cfg.train.seed, loss=loss, input_shape=tuple(data.x_train.shape[1:]), timer=timer)


def _check_arguments(model, loss, train, num_workers: int) -> None:
    # Plain argument checks, the same on every rank, so they fail before Horovod starts anything.
    if model is not None and loss is None:
        raise ValueError("loss: fit(model=...) with your own model needs loss=... (e.g. "
                         "keras.losses.SparseCategoricalCrossentropy(from_logits=True)); only hvdsync's registered "
                         "models come with a default loss")
    if train is not None:
        raise ValueError("train: hvdsync.tensorflow.fit(train=...) is not allowed; pass your arrays as "
                         "data=Dataset(x_train, y_train, x_test, y_test, n_classes) (hvdsync.core.train.data), or "
                         "fit a tf.data pipeline of your own with Keras' model.fit and hvdsync.tensorflow.PlanSampler "
                         "(examples/keras_fit.py)")
    if num_workers != 0:
        raise ValueError(f"num_workers: {num_workers!r} is not allowed with hvdsync.tensorflow.fit, which reads "
                         "in-memory arrays in this process (it is a torch DataLoader's worker count); to read in "
                         "parallel, give PlanSampler.dataset(lookup, num_parallel_calls=...) to Keras' model.fit")


def fit(cfg=None, data: datasets.Dataset | None = None, before_step=None, *, model: keras.Model | None = None,
        loss: Callable | None = None, optimizer: keras.optimizers.Optimizer | None = None, train=None, test=None,
        evaluate: Callable | None = None, callbacks: Sequence[Callback] = (), resume: PlanState | dict | None = None,
        num_workers: int = 0, timer: PhaseTimer | None = None) -> FitResult:
    """Initialise this TensorFlow worker and train with the shared loop; returns this rank's
    :class:`~hvdsync.tensorflow.FitResult`. The same arguments as :func:`hvdsync.torch.fit`; ``train`` and
    ``num_workers`` (a torch ``DataLoader``'s) raise an error that says what to use here (a ``tf.data`` pipeline of
    your own goes through Keras' ``fit`` with :class:`~hvdsync.tensorflow.PlanSampler`).

    Args:
        cfg: a :class:`~hvdsync.config.Config` (default ``Config()``).
        data: in-memory arrays (:class:`~hvdsync.core.train.data.Dataset`) instead of the registered ``data.dataset``.
        before_step: ``before_step(epoch, step)`` on every rank before each step.
        model: your Keras model (then ``loss`` is required), e.g. :class:`~hvdsync.tensorflow.CNN`.
        loss: ``loss(y_true, y_pred)`` returning the batch *mean*, e.g.
            ``keras.losses.SparseCategoricalCrossentropy(from_logits=True)``.
        optimizer: your *local* Keras optimizer (default: ``train.optimizer`` at the scaled ``train.lr``).
        train: not here (see above); num_workers: must stay 0.
        test: ``(x, y)`` arrays (or an unbatched ``tf.data.Dataset`` of known length) scored for ``test_accuracy``
            after each epoch, instead of ``data``'s test split (:func:`~hvdsync.tensorflow.dataset_evaluator`).
        evaluate: instead of ``test``, ``evaluate() -> {metric: (sum, count)}`` over this rank's share (default:
            test accuracy).
        callbacks: :class:`~hvdsync.core.train.callbacks.Callback` objects.
        resume: a plan position (``FitResult.plan_state``, ``PlanSampler.state_dict()``) to continue from.
        timer: a :class:`~hvdsync.core.telemetry.profiling.PhaseTimer` (subclass) to time the phases with, e.g. one
            that acts around each phase (default a new ``PhaseTimer``).
    """
    from hvdsync.config import Config  # here: hvdsync.config imports the core, not the adapters

    _check_arguments(model, loss, train, num_workers)
    cfg = cfg or Config()
    init(cfg)
    data = data if data is not None else datasets.load(cfg.data, cfg.train.seed)
    backend = build(cfg, data, model=model, loss=loss, optimizer=optimizer, timer=timer)
    if evaluate is None and test is not None:
        # Arrays read by fit_loop's own plan keep equal parts of the user's test set, as in hvdsync.torch.fit.
        evaluate = dataset_evaluator(backend.model, test, cfg.data.batch_size)
    resume = PlanState.from_dict(resume) if isinstance(resume, dict) else resume
    return fit_loop(cfg, backend, data, evaluate, callbacks=[*callbacks, *make_callbacks(cfg)], resume=resume,
                    before_step=before_step)


def _model_record(model: keras.Model, log_model: bool) -> ModelRecord:
    """The run's ``model_summary.txt`` and, with ``tracking.log_model``, the model in MLflow's keras format
    (:mod:`hvdsync.core.telemetry.modelrecord`)."""
    def rows() -> list[TensorRow]:
        return [TensorRow(w.path, tuple(int(d) for d in w.shape), str(w.dtype),
                          int(np.prod(w.shape, dtype=np.int64)) * np.dtype(w.dtype).itemsize, bool(w.trainable))
                for w in model.weights]

    def save(folder) -> None:
        import mlflow
        import mlflow.keras

        # The requirements named, not inferred: MLflow would load the model in a new process to find them.
        mlflow.keras.save_model(model, str(folder), pip_requirements=[f"tensorflow=={tf.__version__}",
                                                                       f"keras=={keras.__version__}",
                                                                       f"mlflow=={mlflow.__version__}"])

    return ModelRecord(type(model).__name__, rows, save if log_model else None)
