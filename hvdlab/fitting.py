"""The built-in training job with a hand on the backend, for the notebooks and tests that look inside a run (the
model a job trained, a hook before each step): the same steps as an adapter's ``fit`` on the built-in path."""
from __future__ import annotations

from typing import Callable, Sequence

from hvdsync.config import Config
from hvdsync.core.train._context import FitResult
from hvdsync.core.train.callbacks import Callback
from hvdsync.core.train.data import Dataset
from hvdsync.datasets import load
from hvdsync.fitting import fit_loop


def fit_with(init: Callable, build: Callable, cfg=None, data: Dataset | None = None,
             before_step: Callable[[int, int], None] | None = None, callbacks: Sequence[Callback] = ()) -> FitResult:
    """What an adapter's ``fit`` does for the built-in path: ``init(cfg)`` the worker, load ``data`` (default: the
    data set ``cfg.data`` names), ``build(cfg, data)`` its backend and run :func:`fit_loop`. ``cfg`` defaults to
    ``Config()``."""
    cfg = cfg or Config()
    init(cfg)
    data = data if data is not None else load(cfg.data, cfg.train.seed)
    return fit_loop(cfg, build(cfg, data), data, before_step=before_step, callbacks=callbacks)
