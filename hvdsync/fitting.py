"""The layer that knows the config and the registry, between the adapters and the core: it turns a config into what
the core's loop is handed (:func:`loop_settings`, :func:`observer_settings`, :func:`plan_for`, the tracker), runs the
shared loop as a config says (:func:`fit_loop`), and does what every adapter's ``fit_elastic`` does on the built-in
path (:func:`fit_elastic_with`). The core below it reads no config."""
from __future__ import annotations

import warnings
from typing import Any, Callable, Mapping, Sequence

from hvdsync.config import Config
from hvdsync.core.comm.codecs import codec_state_of
from hvdsync.core.comm.schemes import MODES
from hvdsync.core.elastic._ledger import SampleLedger
from hvdsync.core.elastic.loop import ElasticResult, elastic_fit
from hvdsync.core.telemetry.observe import Observer, ObserverSettings
from hvdsync.core.telemetry.tracking import Tracker, make_tracker
from hvdsync.core.train import loop
from hvdsync.core.train._context import FitResult
from hvdsync.core.train.callbacks import Callback
from hvdsync.core.train.data import Dataset
from hvdsync.core.train.loop import LoopSettings
from hvdsync.core.train.runtime import applied_params
from hvdsync.core.train._plan import ShardPlan
from hvdsync.datasets import load
from hvdsync.registry import make_callbacks


def observer_settings(cfg) -> ObserverSettings:
    """The :class:`~hvdsync.core.telemetry.observe.ObserverSettings` ``cfg`` describes (``monitor.*``, tracking,
    the sync mode's lockstep, the record's seed)."""
    return ObserverSettings(
        every=cfg.monitor.every, straggler_ratio=cfg.monitor.straggler_ratio,
        divergence_tolerance=cfg.monitor.divergence_tolerance, lockstep=MODES[cfg.sync.mode].lockstep,
        tracking=cfg.tracking.enabled, system_metrics=cfg.tracking.system_metrics, config=cfg.to_dict(),
        seed=cfg.train.seed, deterministic=cfg.train.deterministic)


def loop_settings(cfg, params: Mapping[str, Any] | None = None) -> LoopSettings:
    """The :class:`~hvdsync.core.train.loop.LoopSettings` ``cfg`` describes.

    Args:
        cfg: a :class:`hvdsync.config.Config`.
        params: the run parameters to record; default ``cfg.flat()`` with Horovod's knobs as this worker's
            environment holds them (:func:`hvdsync.core.train.runtime.applied_params`): the record claims only
            settings that applied.
    """
    return LoopSettings(
        epochs=cfg.train.epochs, op=cfg.sync.op, batch_size=cfg.data.batch_size, accumulate=cfg.sync.accumulate,
        seed=cfg.train.seed, shuffle=cfg.data.shuffle, batch_growth=tuple(sorted(cfg.data.batch_growth.items())),
        adaptive_shares=cfg.data.shares == "adaptive", growth_lr=cfg.train.growth_lr,
        params=dict(params if params is not None else applied_params(cfg)))


def plan_for(cfg, dataset_size: int, world_size: int) -> ShardPlan:
    """The shard plan ``cfg`` describes for ``dataset_size`` samples on ``world_size`` ranks."""
    return loop_settings(cfg, params={}).plan(dataset_size, world_size)


def fit_loop(cfg, backend, steps, evaluate=None, tracker: Tracker | None = None, callbacks: Sequence[Callback] = (),
             observe: bool = True, **kwargs: Any) -> FitResult:
    """The shared loop (:func:`hvdsync.core.train.loop.fit_loop`) as ``cfg`` says: the core's function with the
    settings built from ``cfg`` (:func:`loop_settings`), the observer ``cfg`` describes (per-step figures, monitor
    alarms, the run's record: :class:`~hvdsync.core.telemetry.observe.Observer` with :func:`observer_settings`;
    ``observe=False``: none) and, unless given, the run's tracker (MLflow on rank 0 when ``tracking.enabled``). The
    other arguments are the core function's.

    Example:
        >>> result = fit_loop(cfg, backend, data, callbacks=make_callbacks(cfg))  # doctest: +SKIP
    """
    tracker = tracker if tracker is not None else make_tracker(cfg.tracking, backend.rank)
    observer = Observer(observer_settings(cfg)) if observe else None
    # The adapters' backends record their model at the end (its summary; the model with tracking.log_model): every
    # path through here (fit, hvdsync train, the sweep's children) alike. A user's own backend need not offer it.
    model_record = getattr(backend, "model_record", None)
    if model_record is not None:
        callbacks = [*callbacks, model_record(cfg.tracking.log_model)]
    return loop.fit_loop(loop_settings(cfg), backend, steps, evaluate, tracker=tracker, callbacks=callbacks,
                         observer=observer, **kwargs)


def with_ledger(callbacks: Sequence[Callback], record_reads: bool, call: str, stacklevel: int = 2) -> list[Callback]:
    """``callbacks`` as a new list, with a :class:`~hvdsync.torch.SampleLedger` added (unless one is
    there) where the deprecated ``record_reads=True`` asks for it, with the ``DeprecationWarning`` that names
    ``callbacks=[SampleLedger()]``. Every ``record_reads`` that goes in 0.3.0 (``fit_elastic`` and the elastic
    launchers) says it this way, naming its own ``call``.

    Args:
        callbacks: the caller's callbacks (not changed).
        record_reads: the deprecated flag.
        call: the function the user called, as the warning names it (``"hvdsync.launch.elastic.train"``).
        stacklevel: as :func:`warnings.warn` counts it from the caller of this function (2: the line that called
            the caller, the user's where the caller is public).
    """
    callbacks = list(callbacks)
    if record_reads:
        warnings.warn(f"{call}(record_reads=True) is deprecated since hvdsync 0.2.0 and goes in 0.3.0: pass "
                      "callbacks=[SampleLedger()] (from hvdsync.torch or hvdsync.tensorflow import SampleLedger); the "
                      "result's reads and timeline are the same", DeprecationWarning, stacklevel=stacklevel + 1)
        if not any(isinstance(c, SampleLedger) for c in callbacks):
            callbacks.append(SampleLedger())
    return callbacks


def fit_elastic_with(init: Callable, build: Callable, make_state: Callable, run_elastic: Callable, cfg=None,
                     data: Dataset | None = None, record_reads: bool = False,
                     callbacks: Sequence[Callback] = ()) -> ElasticResult:
    """What every adapter's ``fit_elastic`` does: ``init(cfg)``, load the data, ``build`` the backend *without* a
    broadcast (no collective may run before the elastic loop: its first sync broadcasts), make the state
    (``make_state(model, optimizer, cfg, codec=...)``) and run :func:`elastic_fit` under ``run_elastic`` with
    ``callbacks`` and those ``cfg`` names (``train.callbacks``); returns this rank's
    :class:`~hvdsync.core.elastic.loop.ElasticResult`.

    ``callbacks`` are made once per process and live on across resets, e.g. ``callbacks=[SampleLedger()]`` for the
    result's ``reads`` and ``timeline``. ``record_reads=True`` is deprecated (it goes in 0.3.0): pass ``callbacks=[SampleLedger()]``
    (:class:`hvdsync.torch.SampleLedger`)."""
    # stacklevel 3: the warning points at the user's call of the adapter's fit_elastic, which called this.
    callbacks = with_ledger(callbacks, record_reads, "fit_elastic", stacklevel=3)
    cfg = cfg or Config()
    init(cfg)
    data = data if data is not None else load(cfg.data, cfg.train.seed)
    backend = build(cfg, data, broadcast=False)
    # Compression state (error-feedback residuals, PowerSGD's Q) is committed and restored with the rest.
    state = make_state(backend.model, backend.optimizer, cfg, codec=codec_state_of(backend.optimizer))
    callbacks += make_callbacks(cfg)   # once per process: the callbacks live on across resets
    settings = loop_settings(cfg, params=cfg.flat())

    def tracker(rank: int) -> Tracker:
        return make_tracker(cfg.tracking, rank)

    return run_elastic(lambda s: elastic_fit(s, settings, backend, data, callbacks, tracker), state)
