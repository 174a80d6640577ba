"""Run tracking in MLflow: rank 0 writes, the other ranks write nothing, and a tracking failure never stops training.

Both adapters log through the same :class:`Tracker`, from the shared loop (:mod:`hvdsync.core.loop`), so a
PyTorch run and a TensorFlow run of the same config record the same parameter and metric names.
"""
from __future__ import annotations

import functools
import warnings
from typing import Any, Callable


# The metric names every run records (the cross-framework test checks both frameworks log exactly these).
EPOCH_METRICS = ("train_loss", "test_accuracy", "epoch_seconds", "samples_per_second", "step_seconds_max_rank",
                 "step_seconds_min_rank")
FINAL_METRICS = ("final_test_accuracy", "wire_bytes", "allreduce_rounds", "total_seconds")


def _never_raises(method: Callable) -> Callable:
    """Tracking is a side effect: if MLflow fails (server down, disk full), warn once and go on without it."""

    @functools.wraps(method)
    def wrapper(self: "Tracker", *args: Any, **kwargs: Any) -> Any:
        if not self.active:
            return None
        try:
            return method(self, *args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - any tracking error must not kill training
            self.active = False
            warnings.warn(f"hvdsync: MLflow tracking disabled for this run after an error: {exc}", stacklevel=2)
            return None

    return wrapper


class Tracker:
    """The no-op tracker (ranks other than 0, or tracking switched off)."""

    active = False
    run_id: str | None = None

    def start(self, params: dict[str, Any], tags: dict[str, str] | None = None) -> None: ...

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None: ...

    def finish(self, status: str = "FINISHED") -> None: ...


class MLflowTracker(Tracker):
    """Writes one MLflow run through ``mlflow.MlflowClient`` (explicit run id: no global active-run state)."""

    def __init__(self, tracking_uri: str = "", experiment: str = "hvdsync", run_name: str = "") -> None:
        self.active = True
        self._uri = tracking_uri or None
        self._experiment = experiment
        self._run_name = run_name or None

    @_never_raises
    def start(self, params: dict[str, Any], tags: dict[str, str] | None = None) -> None:
        import mlflow  # imported here: workers that do not track never pay for it; errors land in _never_raises

        self._client = mlflow.MlflowClient(tracking_uri=self._uri)
        exp = self._client.get_experiment_by_name(self._experiment)
        exp_id = exp.experiment_id if exp else self._client.create_experiment(self._experiment)
        run = self._client.create_run(exp_id, run_name=self._run_name, tags=tags or {})
        self.run_id = run.info.run_id
        from mlflow.entities import Param

        self._client.log_batch(self.run_id, params=[Param(k, str(v)) for k, v in sorted(params.items())])

    @_never_raises
    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        if self.run_id is None:
            return
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(k, float(v), now, step or 0) for k, v in metrics.items()]
        self._client.log_batch(self.run_id, metrics=batch)

    @_never_raises
    def finish(self, status: str = "FINISHED") -> None:
        if self.run_id is not None:
            self._client.set_terminated(self.run_id, status=status)


def make_tracker(tracking_cfg, rank: int) -> Tracker:
    """The tracker for this rank: MLflow on rank 0 when enabled, else the no-op one."""
    if rank != 0 or not tracking_cfg.enabled:
        return Tracker()
    return MLflowTracker(tracking_cfg.tracking_uri, tracking_cfg.experiment, tracking_cfg.run_name)
