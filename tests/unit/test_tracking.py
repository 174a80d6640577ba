"""MLflow run records: rank 0 writes a real store; other ranks write nothing; a broken store never stops training."""
import warnings

import mlflow
import pytest

from hvdsync.config import TrackingConfig
from hvdsync.core.tracking import MLflowTracker, Tracker, make_tracker


def test_rank0_records_params_metrics_and_status_in_a_real_store(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = make_tracker(TrackingConfig(tracking_uri=uri, experiment="unit"), rank=0)
    assert isinstance(tracker, MLflowTracker)
    tracker.start({"sync.compression": "fp16", "world_size": 2}, tags={"framework": "torch"})
    for epoch, acc in enumerate([0.5, 0.8, 0.9]):
        tracker.log_metrics({"test_accuracy": acc}, step=epoch)
    tracker.finish()
    run = mlflow.MlflowClient(uri).get_run(tracker.run_id)
    assert run.data.params == {"sync.compression": "fp16", "world_size": "2"}
    assert run.data.tags["framework"] == "torch"
    assert run.info.status == "FINISHED"
    history = mlflow.MlflowClient(uri).get_metric_history(tracker.run_id, "test_accuracy")
    assert [(m.step, m.value) for m in history] == [(0, 0.5), (1, 0.8), (2, 0.9)]


def test_other_ranks_and_disabled_tracking_write_nothing(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    for tracker in (make_tracker(TrackingConfig(tracking_uri=uri), rank=1),
                    make_tracker(TrackingConfig(tracking_uri=uri, enabled=False), rank=0)):
        assert type(tracker) is Tracker
        tracker.start({"a": 1})
        tracker.finish()
    assert not (tmp_path / "mlflow.db").exists()


def test_a_broken_store_warns_once_and_does_not_raise(tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the store's folder should be")
    tracker = MLflowTracker(tracking_uri=f"sqlite:///{blocker}/sub/mlflow.db", experiment="x")
    with pytest.warns(UserWarning, match="MLflow tracking disabled"):
        tracker.start({"a": 1})
    with warnings.catch_warnings():
        warnings.simplefilter("error")           # after the first failure it stays silent
        tracker.log_metrics({"loss": 1.0}, step=0)
        tracker.finish()
    assert tracker.active is False
