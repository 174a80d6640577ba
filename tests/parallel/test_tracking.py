"""MLflow tracking on real Horovod workers against a real ``mlflow server`` on 127.0.0.1 (started here through
``hvdsync runs ui``, stopped at the end) and against the embedded store: one run per job with every rank's figures,
system metrics and artifacts; a server killed mid-run costs no metric; the monitor names a desynchronised and a slow
rank; the record carries no secret; ``runs compare``, ``sweep`` and ``runs reproduce``; a deterministic rerun is
bitwise equal.

Shared to stay cheap: one server for the module, one worker job for four fits (clean, faulty, deterministic x2),
one for the server kill, one for the 2x2 sweep, one for the reproduction.
"""
import contextlib
import csv
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import cloudpickle
import mlflow
import pytest

from hvdsync.launch import cli
from hvdsync import launch
from hvdsync.core.telemetry import monitor, runlabel
from hvdsync.core.telemetry.spool import Spool
from tests.parallel import tracking_workers

cloudpickle.register_pickle_by_value(tracking_workers)
SECRET = "s3cr3t-value-that-must-not-leak"
DESYNC_STEP, SLOW_SECONDS, EVERY = 6, 0.1, 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """``hvdsync runs ui`` (an ``mlflow server``) on a SQLite store, in its own process group."""

    def __init__(self, folder: Path) -> None:
        self.folder, self.port = folder, _free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.proc = None

    def start(self) -> None:
        cmd = [sys.executable, "-m", "hvdsync.launch.cli", "runs", "ui", "--tracking-uri", f"sqlite:///{self.folder}/s.db",
               "--artifacts-destination", str(self.folder / "artifacts"), "--port", str(self.port)]
        self.proc = subprocess.Popen(cmd, stdout=open(self.folder / "server.log", "a"), stderr=subprocess.STDOUT,
                                     start_new_session=True)
        deadline = time.time() + 240
        while time.time() < deadline:
            with contextlib.suppress(OSError):
                if urllib.request.urlopen(f"{self.uri}/health", timeout=2).read() == b"OK":
                    return
            assert self.proc.poll() is None, (self.folder / "server.log").read_text()[-2000:]
            time.sleep(0.5)
        raise TimeoutError("mlflow server did not answer /health")

    def ensure(self) -> None:
        """Start the server again if a test left it stopped."""
        if self.proc is None or self.proc.poll() is not None:
            self.start()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            import psutil

            # A dying server: SIGKILL to the server and its uvicorn workers at once. `runs ui` starts the MLflow
            # server in a process group of its own (so that it can stop it whole), hence every group under it.
            groups = {self.proc.pid}
            for child in psutil.Process(self.proc.pid).children(recursive=True):
                try:
                    groups.add(os.getpgid(child.pid))
                except ProcessLookupError:
                    pass
            for group in groups:
                try:
                    os.killpg(group, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = Server(tmp_path_factory.mktemp("server"))
    s.start()
    yield s
    s.stop()


def _cfg(uri, spool, experiment, **sections):
    raw = {"train": {"epochs": 2, "np": 2}, "data": {"batch_size": 32},
           # A healthy but slow store (this machine is shared) gets all the time it needs to take the run.
           "tracking": {"tracking_uri": uri, "experiment": experiment, "spool_dir": str(spool), "flush_seconds": 300},
           "monitor": {"every": EVERY}}
    for name, values in sections.items():
        raw.setdefault(name, {}).update(values)
    return raw


@pytest.fixture(scope="module")
def job(server, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("job")
    embedded = f"sqlite:///{tmp / 'embedded.db'}"
    mlflow.MlflowClient(embedded).search_experiments()  # create the store here (its migrations take seconds)
    det = {"train": {"deterministic": True, "epochs": 1}}
    args = (_cfg(server.uri, tmp / "spool", "clean", tracking={"timeline": True}, monitor={"every": 4}),
            _cfg(server.uri, tmp / "spool", "faulty"),
            _cfg(server.uri, tmp / "spool", "det", **det),
            _cfg("", tmp / "spool", "det", **det), DESYNC_STEP, SLOW_SECONDS)
    env = {"HVDSYNC_TEST_API_TOKEN": SECRET, "MLFLOW_TRACKING_URI": embedded}
    results = launch.run(tracking_workers.run_job, args=args, np=2, env=env, progress=False, log_dir=tmp / "logs")
    return {"server": mlflow.MlflowClient(server.uri), "embedded": mlflow.MlflowClient(embedded),
            "embedded_uri": embedded, "ranks": results, "log": (tmp / "logs" / "workers.log").read_text(),
            **results[0]}


def _artifacts(client, run_id, path=None):
    for a in client.list_artifacts(run_id, path):
        yield from (_artifacts(client, run_id, a.path) if a.is_dir else [a.path])


def _check_run(client, run_id, tmp_path):
    run = client.get_run(run_id)
    p, m = run.data.params, run.data.metrics
    assert run.info.status == "FINISHED"
    from hvdsync.config import Config

    assert set(runlabel.applicable(Config().flat())) <= set(p) and p["world_size"] == "2"  # what applies ...
    assert "tracking.spool_dir" not in p and "data.synthetic_samples" not in p         # ... and nothing else
    assert {"version.horovod", "version.torch", "version.mlflow", "horovod.build_key"} <= set(p)
    # The ranks' figures summarised (min, median, max; the slowest rank for times), every rank's own in ranks.csv.
    assert not any(k.startswith("rank/") for k in m)
    rows = list(csv.DictReader(open(client.download_artifacts(run_id, "ranks.csv", str(tmp_path)))))
    keys = ("loss", "step_seconds", "work_seconds", "data_seconds", "compute_seconds", "sync_wait_seconds",
            "update_seconds", "comm_share")
    assert list(rows[0]) == ["step", "rank", *keys]
    by_step: dict[int, list[dict]] = {}
    for row in rows:
        by_step.setdefault(int(row["step"]), []).append(row)
    assert len(by_step) >= 2 and all(sorted(int(r["rank"]) for r in v) == [0, 1] for v in by_step.values())
    for key in keys:
        for stat, pick in (("min", min), ("median", statistics.median), ("max", max)):
            logged = {x.step: x.value for x in client.get_metric_history(run_id, f"ranks/{key}_{stat}")}
            assert logged == pytest.approx({s: pick(float(r[key]) for r in v) for s, v in by_step.items()}), (key, stat)
        if key.endswith("_seconds"):
            slowest = {x.step: x.value for x in client.get_metric_history(run_id, f"ranks/{key}_slowest_rank")}
            for s, r in slowest.items():
                row = next(x for x in by_step[s] if int(x["rank"]) == int(r))
                assert float(row[key]) == max(float(x[key]) for x in by_step[s]), (key, s)
    system = [k for k in m if k.startswith("system/")]
    assert any(k.endswith("/cpu_utilization_percentage") for k in system)
    assert any(k.endswith("/system_memory_usage_megabytes") for k in system)
    files = set(_artifacts(client, run_id))
    assert {"hvdsync/config.yaml", "hvdsync/record.json", "training.png"} <= files   # the plot at the root
    # The model's summary always, the model itself only with tracking.log_model (off by default).
    summary = Path(client.download_artifacts(run_id, "model_summary.txt", str(tmp_path))).read_text().splitlines()
    count = 64 * 64 + 64 + 64 * 10 + 10                                 # digits' 64-64-10 MLP: 2 weights, 2 biases
    assert summary[1].startswith(f"parameters: {count:,} trainable of {count:,} in 4 tensors")
    assert not any(f.startswith("model/") for f in files)
    # Named and tagged for what ran; the headline figures are the run's totals after the warm-up epoch.
    assert run.info.run_name == "torch x2 1host none allreduce acc1" and run.data.tags["hvdsync.hosts"] == "1"
    seconds = [x.value for x in sorted(client.get_metric_history(run_id, "epoch_seconds"), key=lambda x: x.step)]
    rates = [x.value for x in sorted(client.get_metric_history(run_id, "samples_per_second"), key=lambda x: x.step)]
    kept = slice(1, None) if len(seconds) > 1 else slice(None)
    # Each epoch's figures also under epoch/ (their own section, step = the epoch), the same values at the same steps.
    for key in ("train_loss", "test_accuracy", "samples_per_second", "epoch_seconds"):
        old, new = ([(x.step, x.value) for x in sorted(client.get_metric_history(run_id, k), key=lambda x: x.step)]
                    for k in (key, f"epoch/{key}"))
        assert new == old and [s for s, _ in new] == list(range(len(seconds))), key
    assert m["Key/samples_per_second"] == pytest.approx(
        sum(r * s for r, s in zip(rates[kept], seconds[kept])) / sum(seconds[kept]))
    phases = {k: m[f"Key/{k}_seconds"] for k in ("data", "compute", "sync_wait", "update")}
    assert m["Key/comm_share"] == pytest.approx(phases["sync_wait"] / sum(phases.values()))
    record = json.loads(Path(client.download_artifacts(run_id, "hvdsync/record.json", str(tmp_path))).read_text())
    assert record["world_size"] == 2 and record["seeds"]["train.seed"] == 0 and record["horovod_build"]["gloo"]
    return run, files


def test_one_run_per_job_with_params_per_rank_and_system_metrics_and_artifacts(job, tmp_path):
    run, files = _check_run(job["server"], job["clean"]["run_id"], tmp_path)
    assert run.data.metrics["final_test_accuracy"] == pytest.approx(job["clean"]["test_accuracy"])
    # One run for the job: the experiment holds this run only, though two processes trained.
    assert len(job["server"].search_runs([run.info.experiment_id])) == 1
    # The timeline (only with tracking.timeline) and its per-tensor chart, which names the model's tensors.
    assert {"horovod/timeline.png", "horovod/timeline_tensors.json", "timeline.png"} <= files
    parts = json.loads(Path(job["server"].download_artifacts(run.info.run_id, "horovod/timeline_tensors.json",
                                                             str(tmp_path))).read_text())
    assert any(v["allreduce"] > 0 for v in parts.values())
    # A clean run: the ranks' parameters stayed bitwise equal at every check. (No assertion on stragglers here: on
    # a shared machine the scheduler can make either rank one for a while, and the monitor then says so.)
    assert max(m.value for m in job["server"].get_metric_history(run.info.run_id, "monitor/param_spread")) == 0.0
    assert "alarm/divergence" not in run.data.metrics


def test_the_embedded_store_gets_the_same_record(job, tmp_path):
    _check_run(job["embedded"], job["det_embedded"]["run_id"], tmp_path)


def test_a_desynchronised_rank_and_a_slow_rank_are_named(job):
    run = job["server"].get_run(job["faulty"]["run_id"])
    tags = run.data.tags
    # Rank 1 nudged a weight before step DESYNC_STEP + 1 (1-based); the check every EVERY steps catches it at once.
    div_step = min(m.step for m in job["server"].get_metric_history(run.info.run_id, "alarm/divergence"))
    assert DESYNC_STEP + 1 <= div_step <= DESYNC_STEP + EVERY
    assert tags["hvdsync.alarm.divergence.rank"] == "1" and "rank 1's parameters differ" in tags["hvdsync.alarm.divergence"]
    # The slow rank: named, after the warm-up check, a full window and two checks in a row over the threshold.
    assert tags["hvdsync.alarm.straggler.rank"] == "1"
    # The run's summary of the ranks names it too: the slowest working time at most checks.
    slowest = [m.value for m in job["server"].get_metric_history(run.info.run_id, "ranks/work_seconds_slowest_rank")]
    assert slowest.count(1.0) > len(slowest) / 2
    strag_step = min(m.step for m in job["server"].get_metric_history(run.info.run_id, "alarm/straggler"))
    assert strag_step >= (monitor.WINDOW + 2) * EVERY                      # not before a full window (Alarms.check)
    # One warning line per alarm, naming the rank, in the result (the CLI prints it).
    assert sorted(w.split(" ")[:2] for w in job["faulty"]["warnings"]) == [["rank", "1"], ["rank", "1's"]]


def test_no_secret_in_any_param_tag_or_artifact(job, tmp_path):
    files = {}
    for client, name in ((job["server"], "clean"), (job["server"], "faulty"), (job["embedded"], "det_embedded")):
        run_id = job[name]["run_id"]
        run = client.get_run(run_id)
        assert SECRET not in json.dumps([run.data.params, run.data.tags])
        for path in _artifacts(client, run_id):
            (tmp_path / name / path).mkdir(parents=True)
            files[name, path] = Path(client.download_artifacts(run_id, path, str(tmp_path / name / path)))
            assert SECRET.encode() not in files[name, path].read_bytes(), path
    assert len(files) >= 3 * 3
    record = json.loads(files["clean", "hvdsync/record.json"].read_text())
    assert "HVDSYNC_TEST_API_TOKEN" not in record["env"] and record["env"]["HOROVOD_RANK"] == "0"


def test_deterministic_torch_rerun_is_bitwise_equal_and_runs_reproduce_says_so(job, server, capsys):
    assert job["det_server"]["digest"] == job["det_embedded"]["digest"]              # same job, rerun
    assert [r["det_server"]["digest"] for r in job["ranks"]] == [job["det_server"]["digest"]] * 2
    assert job["clean"]["digest"] != job["det_server"]["digest"]                    # a different run differs
    # A fresh job, from the recorded run's record alone.
    assert cli.main(["runs", "reproduce", job["det_server"]["run_id"], "--tracking-uri", server.uri]) == 0
    out = capsys.readouterr().out
    assert "bitwise identical" in out and "final/param_fingerprint_0" in out


def test_a_server_killed_mid_run_costs_no_metric(server, tmp_path):
    spool_dir = tmp_path / "spool"
    raw = _cfg(server.uri, spool_dir, "killed", train={"epochs": 3})
    step_seconds = 0.1  # long enough that the sender (low priority, slow on a busy machine) catches up mid-run
    stop = threading.Event()

    def kill_mid_run():
        # Kill the server once it has taken part of the run (the run exists, some records are acknowledged),
        # with training still going on (no end record yet).
        while not stop.is_set():
            spools = list(spool_dir.glob("*.jsonl"))
            if spools and len(Spool(spools[0]).acks()) >= 5:
                break
            time.sleep(0.1)
        server.stop()

    killer = threading.Thread(target=kill_mid_run)
    killer.start()
    start = time.perf_counter()
    try:  # Horovod's launcher needs the main thread (it sets signal handlers)
        ranks = launch.run(tracking_workers.run_long, args=(raw, step_seconds), np=2, progress=False,
                           log_dir=tmp_path / "logs")
    finally:
        stop.set()
        killer.join()
    done = {"ranks": ranks, "wall": time.perf_counter() - start}
    result = done["ranks"][0]
    print(f"\nfit with the server killed mid-run: {result['fit_seconds']:.1f} s for {result['optimizer_steps']} steps "
          f"of >= {1e3 * step_seconds:.0f} ms (launch {done['wall']:.1f} s)")
    assert result["test_accuracy"] > 0.8 and result["optimizer_steps"] == 3 * 22
    [warning] = result["warnings"]                                        # one warning, naming the spool
    assert ("did not answer" in warning or "were not sent" in warning) and "runs push" in warning
    assert (tmp_path / "logs" / "workers.log").read_text().count("TrackingWarning") == 1
    # Generous bound only (a shared machine): the fit does not hang on the dead server (MLflow's defaults: minutes).
    assert result["fit_seconds"] < 66 * step_seconds + 180
    [spool_path] = spool_dir.glob("*.jsonl")
    spool = Spool(spool_path)
    assert spool.pending(), "the kill came after the run ended: nothing was left to push"
    expected: dict[str, int] = {}
    for record in spool.records():
        for key, *_ in record.get("metrics", []):
            expected[key] = expected.get(key, 0) + 1
    run_id = spool.run_id()

    server.start()
    assert cli.main(["runs", "push", str(spool_path)]) == 0
    assert not list(spool_dir.glob("*.jsonl"))                            # all acknowledged: the spool is gone
    client = mlflow.MlflowClient(server.uri)
    counts = {k: len(client.get_metric_history(run_id, k)) for k in expected}
    assert counts == expected                                             # every metric exactly once
    assert client.get_run(run_id).info.status == "FINISHED"


def test_sweep_makes_child_runs_and_compare_lists_exactly_the_differing_param(server, tmp_path, capsys):
    server.ensure()
    argv = ["sweep", "--set", "sync.compression=none,fp16", "--set", "sync.accumulate=1,4", "--epochs", "1",
            "--tracking-uri", server.uri, "--experiment", "sweep", "--set", f"tracking.spool_dir={tmp_path}",
            "--set", "tracking.system_metrics=false"]
    capsys.readouterr()
    assert cli.main(argv) == 0
    table = capsys.readouterr().out
    client = mlflow.MlflowClient(server.uri)
    exp = client.get_experiment_by_name("sweep").experiment_id
    parents = [r for r in client.search_runs([exp]) if "mlflow.parentRunId" not in r.data.tags]
    assert len(parents) == 1
    children = client.search_runs([exp], f"tags.mlflow.parentRunId = '{parents[0].info.run_id}'")
    pairs = sorted((c.data.params["sync.compression"], c.data.params["sync.accumulate"]) for c in children)
    assert pairs == [("fp16", "1"), ("fp16", "4"), ("none", "1"), ("none", "4")]
    by = {(c.data.params["sync.compression"], c.data.params["sync.accumulate"]): c.info.run_id for c in children}
    parent = parents[0]
    for c in children:                     # the sweep's table shows each child's whole-run samples/s, as compare does
        line = next(x for x in table.splitlines() if c.info.run_id in x)
        assert f"{c.data.metrics['Key/samples_per_second']:.0f}" in line.split(), (line, c.data.metrics)
    # Children named for their axes first, tagged with the sweep as their job and launcher; the parent holds the
    # axes, each child's key figures and the best child.
    for c in children:
        axes = f"compression={c.data.params['sync.compression']} accumulate={c.data.params['sync.accumulate']} | "
        assert c.info.run_name.startswith(axes + "torch x2"), c.info.run_name
        assert (c.data.tags["hvdsync.launcher"], c.data.tags["hvdsync.job"]) == ("sweep", parent.info.run_id)
        assert c.data.tags["hvdsync.compression"] == c.data.params["sync.compression"]
        # Each child has its model's summary at the root (MLflow's compare view shows it side by side), no model.
        files = set(_artifacts(client, c.info.run_id))
        assert "model_summary.txt" in files and not any(f.startswith("model/") for f in files)
    assert parent.data.params == {"sweep.sync.compression": "none,fp16", "sweep.sync.accumulate": "1,4"}
    parent = client.get_run(parent.info.run_id)
    accuracy = {c.info.run_id: c.data.metrics["Key/test_accuracy"] for c in children}
    assert accuracy[parent.data.tags["hvdsync.best_run"]] == max(accuracy.values())
    assert parent.data.metrics["Key/best_test_accuracy"] == max(accuracy.values())

    png = tmp_path / "compare.png"
    capsys.readouterr()
    # Run ids as positional arguments, as users type them.
    assert cli.main(["runs", "compare", by[("none", "1")], by[("fp16", "1")], "--tracking-uri", server.uri,
                     "--out", str(png), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["differing"] == {"sync.compression": ["none", "fp16"]}
    for run_id in (by[("none", "1")], by[("fp16", "1")]):                 # the table's figures are the runs' totals
        totals = client.get_run(run_id).data.metrics
        assert report["metrics"][run_id]["samples_per_second"] == totals["Key/samples_per_second"]
        assert report["metrics"][run_id]["comm_share"] == totals["Key/comm_share"]
    wire = report["ratios"][by[("fp16", "1")]]["wire_bytes"]
    assert wire == pytest.approx(0.5)                                     # fp16 halves the bytes on the wire
    import matplotlib.image

    assert matplotlib.image.imread(png).shape[0] > 100                   # a PNG that opens
    assert cli.main(["runs", "list", "--experiment", "sweep", "--tracking-uri", server.uri]) == 0
    assert by[("fp16", "4")] in capsys.readouterr().out
