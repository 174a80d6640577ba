"""Keras 3 callbacks for ``model.fit`` on Horovod workers (Horovod 0.28.1's own were written for Keras 2;
hvdsync's build patches them for Keras 3, and these add the data plan, hvdsync's tracker and metrics over uneven shares).

    BroadcastGlobalVariablesCallback   rank 0's model and optimizer state to every rank, at the start of training
    MetricAverageCallback              every logged metric over all ranks' samples, at each epoch's end
    LearningRateWarmupCallback         Goyal et al.'s warm-up of the learning rate over the first epochs
    MLflowCallback                     the run in MLflow, written by rank 0 through hvdsync's tracker

:func:`standard_callbacks` returns them in the order that matters (metrics averaged before anything logs them).
The framework-free parts live in the core: the warm-up rule (:func:`hvdsync.tensorflow.warmup_lr`), the tracker
in :mod:`hvdsync.core.telemetry.tracking`; a PyTorch loop uses the same ones.

Example::

    model.compile(optimizer=hs.distributed_optimizer(keras.optimizers.SGD(0.1 * hvd.size())),
                  loss="sparse_categorical_crossentropy", metrics=["accuracy"], jit_compile=False)
    model.fit(dataset, epochs=10, verbose=2 if hvd.rank() == 0 else 0,
              callbacks=hs.callbacks.standard_callbacks(cfg, warmup_epochs=2))
"""
from __future__ import annotations

import horovod.tensorflow as hvd
import keras
import numpy as np
import tensorflow as tf

from hvdsync.core.train._scaling import warmup_lr
from hvdsync.core.telemetry.tracking import Tracker, make_tracker
from hvdsync.tensorflow.optimizer import broadcast_state


class BroadcastGlobalVariablesCallback(keras.callbacks.Callback):
    """At the start of ``fit``, copy rank 0's model variables and optimizer variables (built first if Keras has not
    built them yet) to every rank, so that all ranks train the same model (Horovod's callback of the same name).

    Args:
        root_rank: the rank whose state wins.
    """

    def __init__(self, root_rank: int = 0) -> None:
        super().__init__()
        self.root_rank = root_rank

    def on_train_begin(self, logs=None) -> None:
        if getattr(self.model, "jit_compile", False):
            raise ValueError("jit_compile: True is not allowed with Horovod's collectives (they have no XLA "
                             "kernels); compile the model with jit_compile=False")
        broadcast_state(self.model, self.model.optimizer, self.root_rank)


def _metric_variables(model: keras.Model) -> list:
    return [v for m in model.metrics for v in m.variables]


def global_metric_results(model: keras.Model) -> dict[str, float]:
    """The model's metric results over all ranks' samples, leaving each rank's own metric state as it was.

    Every Keras metric keeps an additive state (a ``Mean`` keeps a total and a count, ``Accuracy`` is a ``Mean`` of
    hits, ``Precision``/``AUC`` keep confusion counts); summing that state over ranks and asking the metric for its
    result gives exactly the value over all samples, also when ranks saw different numbers of samples (where
    averaging each rank's result, as Horovod's callback does, is off). One all-reduce (float64: counts stay exact).
    """
    variables = _metric_variables(model)
    if not variables:
        return {}
    local = [np.array(v.numpy()) for v in variables]
    flat = tf.concat([tf.reshape(tf.cast(v.value, tf.float64), [-1]) for v in variables], 0)
    total = hvd.allreduce(flat, op=hvd.Sum, name="hvdsync.metric_state").numpy()
    offset = 0
    for v, own in zip(variables, local):
        v.assign(total[offset:offset + own.size].reshape(own.shape).astype(own.dtype))
        offset += own.size
    try:
        return {k: float(np.asarray(x)) for k, x in model.get_metrics_result().items()}
    finally:
        for v, own in zip(variables, local):
            v.assign(own)


class MetricAverageCallback(keras.callbacks.Callback):
    """At each epoch's end, replace every logged metric (training and validation) with its value over all ranks'
    samples (:func:`global_metric_results`), so that rank 0's progress bar, ``History`` and MLflow show the global
    figure. Logged values that are not model metrics (e.g. a learning rate) are averaged over ranks.

    Put it before the callbacks that read the logs (:func:`standard_callbacks` does); Keras' own progress bar and
    ``History`` run after every user callback. Also works in ``model.evaluate(..., callbacks=[...])``.
    """

    def __init__(self) -> None:
        super().__init__()
        self._train: dict[str, float] | None = None
        self._validation: dict[str, float] | None = None

    def on_epoch_begin(self, epoch, logs=None) -> None:
        self._train = self._validation = None

    def on_test_begin(self, logs=None) -> None:
        # Inside fit, validation starts by resetting the metrics: take the training figures before it does.
        if self._train is None and self.params and "epochs" in self.params:
            self._train = global_metric_results(self.model)

    def on_test_end(self, logs=None) -> None:
        self._validation = global_metric_results(self.model)
        if logs is not None:  # model.evaluate returns these logs
            logs.update({k: v for k, v in self._validation.items() if k in logs})

    def on_epoch_end(self, epoch, logs=None) -> None:
        if logs is None:
            return
        train = self._train if self._train is not None else global_metric_results(self.model)
        validation = {f"val_{k}": v for k, v in (self._validation or {}).items()}
        known = {**train, **validation}
        others = sorted(k for k in logs if k not in known)  # sorted: every rank all-reduces the same list
        if others:
            values = tf.constant([float(logs[k]) for k in others], tf.float64)
            averaged = hvd.allreduce(values, op=hvd.Average, name="hvdsync.other_logs").numpy()
            known.update(zip(others, (float(x) for x in averaged)))
        logs.update({k: v for k, v in known.items() if k in logs})
        self._train = self._validation = None


class LearningRateWarmupCallback(keras.callbacks.Callback):
    """Raise the learning rate linearly from ``target_lr / hvd.size()`` to ``target_lr`` over the first
    ``warmup_epochs`` epochs, batch by batch (:func:`hvdsync.tensorflow.warmup_lr`), then leave it at
    ``target_lr`` (Goyal et al.; Horovod's callback of the same name, without its momentum correction).

    Args:
        target_lr: the rate after the warm-up, usually the single-worker rate times ``hvd.size()``.
        warmup_epochs: epochs of the ramp (fractions allowed).
        steps_per_epoch: batches per epoch; default: what ``fit`` knows (``params["steps"]``).
        verbose: print the rate at the end of the warm-up on rank 0.
    """

    def __init__(self, target_lr: float, warmup_epochs: float = 5, steps_per_epoch: int | None = None,
                 verbose: int = 0) -> None:
        super().__init__()
        warmup_lr(target_lr, 1, 0.0, warmup_epochs)  # checks warmup_epochs now
        self.target_lr, self.warmup_epochs = float(target_lr), warmup_epochs
        self.steps_per_epoch, self.verbose = steps_per_epoch, verbose
        self._epoch = 0

    def _steps(self) -> int:
        steps = self.steps_per_epoch or (self.params or {}).get("steps")
        if not steps:
            raise ValueError("steps_per_epoch: None is not allowed when fit does not know the epoch length "
                             "(a dataset of unknown size); pass LearningRateWarmupCallback(steps_per_epoch=...)")
        return int(steps)

    def on_epoch_begin(self, epoch, logs=None) -> None:
        self._epoch = epoch

    def on_train_batch_begin(self, batch, logs=None) -> None:
        progress = self._epoch + batch / self._steps()
        if progress <= self.warmup_epochs:  # after the ramp, leave the rate to the user's schedule or callbacks
            self.model.optimizer.learning_rate = warmup_lr(self.target_lr, hvd.size(), progress, self.warmup_epochs)

    def on_epoch_end(self, epoch, logs=None) -> None:
        if epoch + 1 >= self.warmup_epochs > epoch:
            self.model.optimizer.learning_rate = self.target_lr  # the ramp ends exactly on the target
            if self.verbose and hvd.rank() == 0:
                print(f"\nEpoch {epoch + 1}: finished the learning-rate warm-up at {self.target_lr:g}.")
        if logs is not None:
            logs["learning_rate"] = float(np.asarray(self.model.optimizer.learning_rate))


class MLflowCallback(keras.callbacks.Callback):
    """Record the run in MLflow from rank 0 (other ranks write nothing) through :mod:`hvdsync.core.telemetry.tracking`:
    parameters at the start, every logged metric at each epoch's end, the status at the end. A tracking failure
    warns and never stops training.

    Args:
        cfg: a :class:`hvdsync.config.Config`: its ``tracking`` section says where; all its fields become run
            parameters (plus ``params``).
        params: extra run parameters (e.g. your model's settings).
        tracker: use this tracker instead of the one ``cfg.tracking`` describes.
    """

    def __init__(self, cfg=None, params: dict | None = None, tracker: Tracker | None = None) -> None:
        super().__init__()
        from hvdsync.config import Config

        self.cfg = cfg if cfg is not None else Config()
        self.params_to_log = dict(params or {})
        self.tracker = tracker

    @property
    def run_id(self) -> str | None:
        return self.tracker.run_id if self.tracker is not None else None

    def on_train_begin(self, logs=None) -> None:
        if self.tracker is None:
            self.tracker = make_tracker(self.cfg.tracking, hvd.rank())
        self.tracker.start(params={**self.cfg.flat(), "world_size": hvd.size(), **self.params_to_log},
                           tags={"framework": "tensorflow"})

    def on_epoch_end(self, epoch, logs=None) -> None:
        self.tracker.log_metrics({k: float(v) for k, v in (logs or {}).items() if np.ndim(v) == 0}, step=epoch)

    def on_train_end(self, logs=None) -> None:
        self.tracker.finish("FINISHED")


class ElasticStateCallback(keras.callbacks.Callback):
    """Keras ``fit`` under hvdsync's elastic state (:func:`hvdsync.tensorflow.elastic_state`): the state follows the
    :class:`~hvdsync.tensorflow.PlanSampler`'s position step by step, commits every ``elastic.commit_every``
    optimizer steps (rank 0 checkpointing as configured) and at the end of each epoch. After a reset
    :func:`~hvdsync.tensorflow.run_elastic` calls the training function again, which starts ``fit`` at the
    committed epoch with a sampler at the committed sample: the rest of that epoch, re-planned for the new world.

    List it after the sampler (it reads the sampler's position after each batch). Horovod's own Keras state and
    callbacks (``hvd.elastic.KerasState``, ``CommitStateCallback``) fail on Keras 3 as released (hvdsync's build
    patches them, 0009); this one also keeps hvdsync's data plan position.
    :func:`hvdsync.tensorflow.keras_fit` is the training function that uses it (and fits a resumed partial epoch
    on its own: see there why); ``examples/elastic_keras_fit.py`` the whole script.
    """

    def __init__(self, state, sampler) -> None:
        super().__init__()
        self.state, self.sampler, self._done = state, sampler, 0

    def on_epoch_begin(self, epoch, logs=None) -> None:
        if epoch != self.state.position.epoch:
            raise ValueError(f"initial_epoch: fit is at epoch {epoch} but the elastic state at epoch "
                             f"{self.state.position.epoch}; pass model.fit(..., initial_epoch=state.position.epoch)")
        self._done = 0

    def on_train_batch_end(self, batch, logs=None) -> None:
        ends = self.sampler.step_ends()
        # With steps_per_execution > 1 one call may close several steps: each is counted (and committed when due).
        for i in range(self._done, min((batch + 1) // self.sampler.plan.accumulate, len(ends))):
            self._done = i + 1
            # May commit, and raise HostsUpdatedInterrupt there, on every rank at this step: it leaves fit.
            self.state.step_done(int(ends[i]) - self.state.position.consumed)

    def on_epoch_end(self, epoch, logs=None) -> None:
        self.state.epoch_done()


def standard_callbacks(cfg=None, target_lr: float | None = None, warmup_epochs: float = 0,
                       track: bool = True) -> list[keras.callbacks.Callback]:
    """The callbacks a distributed ``fit`` needs, in the order they must run: broadcast, metric average,
    (learning-rate warm-up to ``target_lr`` over ``warmup_epochs``, when both are given), MLflow on rank 0
    (when ``track`` and ``cfg.tracking.enabled``)."""
    from hvdsync.config import Config

    cfg = cfg if cfg is not None else Config()
    callbacks: list[keras.callbacks.Callback] = [BroadcastGlobalVariablesCallback(0), MetricAverageCallback()]
    if warmup_epochs and target_lr is not None:
        callbacks.append(LearningRateWarmupCallback(target_lr, warmup_epochs))
    if track and cfg.tracking.enabled:
        callbacks.append(MLflowCallback(cfg))
    return callbacks
