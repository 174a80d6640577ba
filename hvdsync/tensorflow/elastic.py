"""Elastic state for TensorFlow with Keras 3: hvdsync's own, because Horovod 0.28.1's does not work there.

What breaks in ``horovod/tensorflow/elastic.py`` on TF 2 + Keras 3 (read from its source):

* ``TensorFlowKerasState`` calls ``optimizer.variables()`` as a method; in Keras 3 it is a property (a list), so
  the call fails.
* ``TensorFlowState.sync()`` only broadcasts variables when a TF1 session exists; in TF2 there is none, so a joining
  worker keeps its own random weights and the ranks silently train different models.
* ``run`` turns only ``UnknownError``s that mention ``HorovodAllreduce``, ``HorovodAllgather`` or
  ``HorovodBroadcast`` into ``HorovodInternalError``; other collective failures (``HorovodGroupedAllreduce``, other
  error classes) kill the worker instead of resetting it, and any other ``UnknownError`` is silently swallowed
  (the wrapper falls off the ``except`` and returns None).
* Keras 3 creates optimizer slots lazily: a state made before they exist would broadcast fewer variables on one
  rank than on another, and the broadcast hangs (Horovod issues 2652, 2285). Here they are built first.

So :class:`KerasTensors` lists the model's variables, the (built) optimizer's variables and hvdsync's
accumulation variables, saves them by value, restores them with ``assign``, broadcasts every one from rank 0 on
``sync()``, and checkpoints them as an ``.npz`` (no pickle).
"""
from __future__ import annotations

import hashlib
import io
from collections.abc import Callable, Sequence
from typing import Any

import horovod.tensorflow as hvd
import keras
import numpy as np
import tensorflow as tf
from horovod.common.exceptions import HorovodInternalError

from hvdsync.core.elastic.checkpoint import undecodable
from hvdsync.elastic import ElasticState, configured_state, run
from hvdsync.fitting import fit_elastic_with
from hvdsync.core.train._scaling import scaled_lr


def fingerprint(model: keras.Model) -> str:
    """A short hash of the model's variable paths, shapes and dtypes."""
    text = ";".join(f"{v.path}:{tuple(v.shape)}:{v.dtype}" for v in model.variables)
    return "keras-" + hashlib.sha256(text.encode()).hexdigest()[:16]


class KerasTensors:
    """The Keras part of the elastic state (:class:`hvdsync.core.elastic.state.Tensors`)."""

    def __init__(self, model: keras.Model, optimizer) -> None:
        if hasattr(optimizer, "broadcast_done"):  # the state's sync broadcasts: hvdsync's optimizer must not
            optimizer.broadcast_done = True
        if not optimizer.built:
            optimizer.build(model.trainable_variables)  # the lazy slots, before anything is listed
        # hvdsync's DistributedOptimizer lists its own variables (the accumulation sums and the pass counter: a
        # joining worker must count passes like the others) and the wrapped optimizer's (iterations, slots).
        # Each once: a variable listed twice would be broadcast and checkpointed twice.
        self.variables = list({id(v): v for v in [*model.variables, *optimizer.variables]}.values())
        self.optimizer = optimizer
        self.fingerprint = fingerprint(model)
        self.save()

    def save(self) -> None:
        self._values = [np.array(v.numpy(), copy=True) for v in self.variables]

    def restore(self) -> None:
        for v, value in zip(self.variables, self._values):
            v.assign(value)

    def sync(self) -> None:
        # Every variable from rank 0 here: hvdsync's DistributedOptimizer must not broadcast again at its first
        # update (a joining worker would broadcast alone and wait forever).
        if hasattr(self.optimizer, "broadcast_done"):
            self.optimizer.broadcast_done = True
        for i, v in enumerate(self.variables):
            # Named by position: every rank lists the same variables in the same order (slots built first).
            value = v.value if isinstance(v, keras.Variable) else v.read_value()  # Keras 3 or plain tf.Variable
            v.assign(hvd.broadcast(value, root_rank=0, name=f"hvdsync.elastic.{i}"))

    def to_files(self) -> dict[str, bytes]:
        buf = io.BytesIO()
        np.savez(buf, **{f"v{i:05d}": value for i, value in enumerate(self._values)})
        return {"keras_state.npz": buf.getvalue()}

    def from_files(self, files: dict[str, bytes]) -> None:
        # By value: numpy arrays, allow_pickle=False; shapes are checked by the fingerprint and by assign.
        try:
            with np.load(io.BytesIO(files["keras_state.npz"]), allow_pickle=False) as saved:
                for i, v in enumerate(self.variables):
                    v.assign(saved[f"v{i:05d}"])
        except Exception as exc:  # noqa: BLE001 - numpy.load and assign raise many kinds (ValueError, BadZipFile, ...)
            # Bytes that passed the checksum but are no state of this model: skipped like a damaged file (the
            # elastic state puts the variables back and tries the next older checkpoint).
            raise undecodable("keras_state.npz", exc) from None
        self.save()


def translate(exc: BaseException) -> BaseException | None:
    """A TensorFlow error from a Horovod collective (a peer died, the ring was shut down) as HorovodInternalError;
    anything else is not a collective failure (None): it propagates and fails the job."""
    if isinstance(exc, tf.errors.OpError) and ("horovod" in str(exc).lower() or "gloo" in str(exc).lower()):
        return HorovodInternalError(str(exc))
    return None


def follow_world_size(optimizer, base_lr: float, rule: str) -> Callable[[], None]:
    """A reset callback that sets the Keras optimizer's learning rate for the new world size."""

    def callback() -> None:
        # hvdsync's DistributedOptimizer's learning_rate is the wrapped optimizer's.
        optimizer.learning_rate.assign(scaled_lr(base_lr, hvd.size(), rule))

    return callback


def elastic_state(model: keras.Model, optimizer, cfg=None, codec: Any = None,
                  on_event: Callable[[dict], None] | None = None, **user: Any) -> ElasticState:
    """The elastic state of a TensorFlow job (the same arguments as :func:`hvdsync.torch.elastic_state`)."""
    from hvdsync.config import Config

    cfg = cfg or Config()
    return configured_state(KerasTensors(model, optimizer), cfg, hvd.broadcast_object, hvd.rank, hvd.size,
                            [follow_world_size(optimizer, cfg.train.lr, cfg.train.lr_scaling)], codec, on_event,
                            **user)


def _reset() -> None:
    hvd.shutdown()
    hvd.init()


def run_elastic(func: Callable, state: ElasticState) -> Any:
    """Run ``func(state)`` elastically on TensorFlow (collective failures in TF errors become resets)."""
    return run(func, state, _reset, translate=translate)


def keras_fit(state: ElasticState, model: keras.Model, make_sampler: Callable, lookup: Callable, epochs: int,
              callbacks=(), **fit_kwargs):
    """``model.fit`` of your own compiled Keras model from the state's committed position: the training function
    for :func:`run_elastic`, which calls it again after every reset.

    It builds a sampler for the world size of now (``make_sampler()``, e.g. ``lambda: PlanSampler.from_config(cfg,
    n)``), loads the committed position into it and fits with :class:`~hvdsync.tensorflow.callbacks
    .ElasticStateCallback` (commits every ``elastic.commit_every`` steps and at each epoch's end). A position in
    the middle of an epoch is fitted on its own first (``epochs=e + 1, initial_epoch=e``): Keras learns the number
    of batches of a stream of unknown length from its first epoch and stops the later ones there, so a short
    resumed epoch followed by whole ones in one ``fit`` would silently cut every later epoch short.

    Args:
        state: from :func:`elastic_state` (``model.optimizer`` after ``compile``).
        make_sampler: returns a new :class:`~hvdsync.tensorflow.PlanSampler` for the current world.
        lookup: ``lookup(indices) -> (x, y)`` in TensorFlow ops (see ``PlanSampler.dataset``).
        epochs: the epochs of the whole run.
        callbacks: your other Keras callbacks; fit_kwargs: more ``model.fit`` arguments (``verbose``, ...).

    Example (``examples/elastic_keras_fit.py``)::

        state = hs.elastic_state(model, model.optimizer, cfg)
        hs.run_elastic(lambda s: hs.keras_fit(s, model, lambda: hs.PlanSampler.from_config(cfg, n), lookup,
                                              cfg.train.epochs), state)
    """
    from hvdsync.tensorflow.callbacks import ElasticStateCallback

    sampler = make_sampler()
    sampler.load_state_dict(state.plan_state())
    history = None
    while state.position.epoch < epochs:
        epoch, partial = state.position.epoch, state.position.consumed > 0
        history = model.fit(sampler.dataset(lookup), epochs=epoch + 1 if partial else epochs, initial_epoch=epoch,
                            shuffle=False, callbacks=[sampler, ElasticStateCallback(state, sampler), *callbacks],
                            **fit_kwargs)
    return history


def fit_elastic(cfg=None, data=None, record_reads: bool = False, *, callbacks: Sequence = ()):
    """hvdsync's built-in Keras model trained elastically, in each worker of an elastic job:
    :func:`hvdsync.fitting.fit_elastic_with` on TensorFlow (``callbacks``, the deprecated ``record_reads``)."""
    from hvdsync.tensorflow.runtime import init
    from hvdsync.tensorflow.train import build

    return fit_elastic_with(init, build, elastic_state, run_elastic, cfg, data, record_reads, callbacks)
