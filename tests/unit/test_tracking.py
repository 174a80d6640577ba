"""MLflow run records through the spool: rank 0 writes a real store; other ranks write nothing; a broken store never
stops training, warns once, and loses nothing (``runs push`` and the next run send the rest, each record once)."""
import json
import subprocess
import warnings

import mlflow
import pytest

from hvdsync.launch import cli
from hvdsync.config import TrackingConfig
from hvdsync.core.telemetry.spool import Spool
from hvdsync.core.telemetry.tracking import MLflowTracker, Tracker, TrackingWarning, make_tracker


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """One SQLite store for the module (creating one runs MLflow's migrations: seconds)."""
    uri = f"sqlite:///{tmp_path_factory.mktemp('store') / 'mlflow.db'}"
    mlflow.MlflowClient(uri).search_experiments()
    return uri


def _run(tracker, steps=30, artifact=None):
    tracker.start({"sync.compression": "fp16", "world_size": 2,
                   "tracking.tracking_uri": "http://alice:hunter2@example.org"}, tags={"framework": "torch"})
    for step in range(steps):
        tracker.log_metrics({"loss": 1.0 / (step + 1), "rank/1/loss": 2.0 / (step + 1)}, step=step)
    if artifact is not None:
        tracker.log_artifact(artifact, "hvdsync")
    tracker.finish()


def test_rank0_records_params_metrics_artifacts_and_status_in_a_real_store(tmp_path, store):
    uri = store
    (tmp_path / "note.txt").write_text("hello")
    # A healthy store gets all the time it needs (the default 30 s can be short on a busy shared machine).
    tracker = make_tracker(TrackingConfig(tracking_uri=uri, experiment="unit", spool_dir=str(tmp_path / "spool"),
                                          flush_seconds=300), 0)
    assert isinstance(tracker, MLflowTracker)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _run(tracker, artifact=tmp_path / "note.txt")
    assert not [w for w in caught if issubclass(w.category, TrackingWarning)]  # a healthy store: no warning
    client = mlflow.MlflowClient(uri)
    run = client.get_run(tracker.run_id)
    assert run.data.params == {"sync.compression": "fp16", "world_size": "2",
                               "tracking.tracking_uri": "http://alice:***@example.org"}
    assert run.data.tags["framework"] == "torch" and run.info.status == "FINISHED"
    assert [(m.step, m.value) for m in client.get_metric_history(tracker.run_id, "rank/1/loss")][:2] == [(0, 2.0), (1, 1.0)]
    assert len(client.get_metric_history(tracker.run_id, "loss")) == 30
    assert [a.path for a in client.list_artifacts(tracker.run_id, "hvdsync")] == ["hvdsync/note.txt"]
    assert list((tmp_path / "spool").glob("*.jsonl")) == []  # all sent: the spool is gone


def test_other_ranks_and_disabled_tracking_write_nothing(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    for tracker in (make_tracker(TrackingConfig(tracking_uri=uri, spool_dir=str(tmp_path)), rank=1),
                    make_tracker(TrackingConfig(tracking_uri=uri, enabled=False, spool_dir=str(tmp_path)), rank=0)):
        assert type(tracker) is Tracker
        tracker.start({"a": 1})
        tracker.log_metrics({"loss": 1.0}, step=0)
        tracker.finish()
    assert list(tmp_path.iterdir()) == []


def _counts(uri, run_id, keys=("loss", "rank/1/loss")):
    client = mlflow.MlflowClient(uri)
    return {k: len(client.get_metric_history(run_id, k)) for k in keys}


def test_a_broken_store_warns_once_keeps_everything_and_push_lands_each_metric_once(tmp_path, capsys):
    blocker = tmp_path / "store"
    blocker.write_text("a file where the store's folder should be")
    uri = f"sqlite:///{blocker}/mlflow.db"
    tracker = MLflowTracker(uri, "unit", spool_dir=str(tmp_path / "spool"))
    with pytest.warns(TrackingWarning) as caught:
        _run(tracker, steps=40)
    assert len(caught) == 1 and "runs push" in str(caught[0].message)
    assert tracker.run_id is None
    spool = Spool(tracker.spool_path)
    records = list(spool.records())
    assert sum(len(r.get("metrics", [])) for r in records) == 80 and records[-1]["op"] == "end"

    blocker.unlink()
    blocker.mkdir()
    assert cli.main(["runs", "push", str(tmp_path / "spool")]) == 0
    assert "sent 43 records" in capsys.readouterr().out  # start, params, 40 metric records, end
    assert not spool.path.exists()  # everything acknowledged: the spool was removed
    client = mlflow.MlflowClient(f"sqlite:///{blocker}/mlflow.db")
    [run] = client.search_runs([client.get_experiment_by_name("unit").experiment_id])
    assert run.info.status == "FINISHED" and run.data.params["world_size"] == "2"
    assert _counts(f"sqlite:///{blocker}/mlflow.db", run.info.run_id) == {"loss": 40, "rank/1/loss": 40}


def test_lost_acknowledgements_resend_without_duplicates_and_the_next_run_pushes_old_spools(tmp_path, store):
    uri = store
    spool_dir = tmp_path / "spool"
    first = MLflowTracker(uri, "unit-acks", spool_dir=str(spool_dir), flush_seconds=300)
    _run(first, steps=20)
    # Put the spool back as if the store had accepted everything but its answers were lost after the run's start.
    spool = Spool(spool_dir / "old.jsonl")
    for record in [{"seq": 0, "op": "start", "uri": uri, "experiment": "unit", "run_name": "", "tags": {}},
                   *({"seq": i + 1, "op": "metrics", "metrics": [["loss", 1.0 / (i + 1), 1000 + i, i]]}
                     for i in range(20)),
                   {"seq": 21, "op": "end", "status": "FINISHED"}]:
        spool.path.open("a").write(json.dumps(record) + "\n")
    spool.ack([0], run_id=first.run_id)
    spool.ack(list(range(1, 6)))  # 5 acknowledged; 15 and the end were "sent" but not acknowledged
    mlflow.MlflowClient(uri).log_batch(first.run_id, metrics=[
        mlflow.entities.Metric("loss", 1.0 / (i + 1), 1000 + i, i) for i in range(20)])
    before = _counts(uri, first.run_id, ("loss",))["loss"]

    second = MLflowTracker(uri, "unit-acks", spool_dir=str(spool_dir), flush_seconds=300)
    _run(second, steps=3)  # its sender first pushes what earlier runs left
    assert second.pushed_from_earlier == 16
    assert _counts(uri, first.run_id, ("loss",))["loss"] == before  # the 15 resent metrics landed once
    assert mlflow.MlflowClient(uri).get_run(first.run_id).info.status == "FINISHED"
    assert list(spool_dir.glob("*.jsonl")) == []


def test_runs_compare_takes_run_ids_as_arguments_as_users_type_them(tmp_path, store, capsys):
    client = mlflow.MlflowClient(store)
    exp = client.create_experiment("compare-args")
    ids = []
    for compression, wire in (("none", 400.0), ("fp16", 200.0)):
        run = client.create_run(exp, run_name=compression)
        client.log_param(run.info.run_id, "sync.compression", compression)
        client.log_metric(run.info.run_id, "wire_bytes", wire)
        client.set_terminated(run.info.run_id)
        ids.append(run.info.run_id)
    common = ["--tracking-uri", store, "--out", str(tmp_path / "c.png"), "--json"]
    reports = []
    for ids_given in (ids, ["--runs", *ids]):   # positional, and the earlier --runs spelling
        capsys.readouterr()
        assert cli.main(["runs", "compare", *ids_given, *common]) == 0
        reports.append(json.loads(capsys.readouterr().out))
    assert reports[0] == reports[1]
    assert reports[0]["differing"] == {"sync.compression": ["none", "fp16"]}
    assert reports[0]["ratios"][ids[1]]["wire_bytes"] == pytest.approx(0.5)
    # One id is an error that says what is needed, before MLflow is asked anything.
    assert cli.main(["runs", "compare", ids[0], "--tracking-uri", store]) == 2
    assert "at least two runs are needed" in capsys.readouterr().err


def test_the_launchers_run_is_continued_by_every_rank_0_and_a_killed_launchers_run_is_ended(tmp_path, store,
                                                                                              monkeypatch, capsys):
    """What a launcher does around a job (hvdsync.core.telemetry.jobrun), with the trackers two successive rank 0s
    of an elastic job would use (or a user's own horovodrun script, given HVDSYNC_RUN_ID)."""
    from hvdsync.core.telemetry import jobrun

    spool_dir = tmp_path / "spool"
    cfg = TrackingConfig(tracking_uri=store, experiment="unit-job", spool_dir=str(spool_dir), flush_seconds=300)
    job = jobrun.begin(cfg, {"framework": "torch", "elastic": "true"})
    assert job.run_id and (spool_dir / "jobs" / f"{job.key}.json").exists()
    for name, value in job.env().items():
        monkeypatch.setenv(name, value)
    for world_size, steps in ((2, (0, 1)), (1, (2, 3))):   # the first rank 0, then the one after a reset
        tracker = make_tracker(cfg, 0)
        tracker.start({"world_size": world_size, "train.lr": 0.1}, tags={"framework": "torch"})
        assert tracker.run_id == job.run_id                     # known at once: an elastic commit records it
        for step in steps:
            tracker.log_metrics({"train_loss": 1.0 / (step + 1)}, step=step)
        tracker.finish()
    job.end("FINISHED", {"hvdsync.world_sizes": "2,1"})
    client = mlflow.MlflowClient(store)
    runs = client.search_runs([client.get_experiment_by_name("unit-job").experiment_id])
    assert [r.info.run_id for r in runs] == [job.run_id] and runs[0].info.status == "FINISHED"
    assert runs[0].data.params["world_size"] == "2"             # the first rank 0's params stand
    assert runs[0].data.tags["hvdsync.world_sizes"] == "2,1" and runs[0].data.tags["hvdsync.job"] == job.key
    assert sorted(m.step for m in client.get_metric_history(job.run_id, "train_loss")) == [0, 1, 2, 3]
    assert not (spool_dir / "jobs" / f"{job.key}.json").exists()

    # A launcher killed whole never ends its run: its note names a process that is gone, and `runs push` (like
    # `runs list` and the next job's launcher) ends the run as KILLED.
    monkeypatch.delenv(jobrun.RUN_ID_ENV)
    killed = jobrun.begin(cfg, {"framework": "torch"})
    note = spool_dir / "jobs" / f"{killed.key}.json"
    gone = subprocess.Popen(["true"])
    gone.wait()
    note.write_text(json.dumps({**json.loads(note.read_text()), "pid": gone.pid, "started": 0.0}))
    capsys.readouterr()
    assert cli.main(["runs", "push", str(spool_dir)]) == 0
    assert f"run {killed.run_id}: its job was killed; ended as KILLED" in capsys.readouterr().out
    run = client.get_run(killed.run_id)
    assert run.info.status == "KILLED" and f"pid {gone.pid}" in run.data.tags["hvdsync.ended_by"]
    assert not note.exists()

    # The launcher's run is named and tagged from the config when it is made: a job whose workers fail before any
    # rank 0 starts (so no tracker ever names it) still says what it was, and ends FAILED.
    from hvdsync.config import Config
    from hvdsync.launch.base import WorkerError, job_run

    job_cfg = Config().replace(train={"np": 3}, sync={"compression": "fp16", "accumulate": 2},
                               tracking={"tracking_uri": store, "experiment": "unit-job",
                                         "spool_dir": str(spool_dir)})
    with pytest.raises(WorkerError), job_run(job_cfg, "local") as failed:
        raise WorkerError("worker 1 failed before rank 0 started")
    run = client.get_run(failed.run_id)
    assert run.info.status == "FAILED" and run.info.run_name == "torch x3 fp16 allreduce acc2"
    assert {k: run.data.tags.get(k) for k in ("framework", "hvdsync.np", "hvdsync.compression", "hvdsync.mode",
                                             "hvdsync.accumulate", "hvdsync.elastic", "hvdsync.launcher")} == {
        "framework": "torch", "hvdsync.np": "3", "hvdsync.compression": "fp16", "hvdsync.mode": "allreduce",
        "hvdsync.accumulate": "2", "hvdsync.elastic": "false", "hvdsync.launcher": "local"}
