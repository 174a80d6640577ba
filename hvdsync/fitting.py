"""What every adapter's ``fit_elastic`` does on the built-in path, once for both frameworks: take the config
(default ``Config()``), load the data set it names (:mod:`hvdsync.datasets`), build the adapter's backend and run the
core's elastic loop. This is the layer that knows the config and the registry; the core below it knows neither."""
from __future__ import annotations

from typing import Callable

from hvdsync.config import Config
from hvdsync.core.comm.codecs import codec_state_of
from hvdsync.core.elastic.loop import ElasticResult, elastic_fit
from hvdsync.core.train.data import Dataset
from hvdsync.datasets import load
from hvdsync.registry import make_callbacks


def fit_elastic_with(init: Callable, build: Callable, make_state: Callable, run_elastic: Callable, cfg=None,
                     data: Dataset | None = None, record_reads: bool = False) -> ElasticResult:
    """What every adapter's ``fit_elastic`` does: ``init(cfg)``, load the data, ``build`` the backend *without* a
    broadcast (no collective may run before the elastic loop: its first sync broadcasts), make the state
    (``make_state(model, optimizer, cfg, codec=...)``) and run :func:`elastic_fit` under ``run_elastic``."""
    cfg = cfg or Config()
    init(cfg)
    data = data if data is not None else load(cfg.data, cfg.train.seed)
    backend = build(cfg, data, broadcast=False)
    # Compression state (error-feedback residuals, PowerSGD's Q) is committed and restored with the rest.
    state = make_state(backend.model, backend.optimizer, cfg, codec=codec_state_of(backend.optimizer))
    callbacks = make_callbacks(cfg)   # once per process: the user's callbacks live on across resets
    return run_elastic(lambda s: elastic_fit(s, cfg, backend, data, record_reads, callbacks), state)
