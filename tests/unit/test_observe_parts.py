"""The parts behind the per-step observer, in one process: monitor checks, phase shares, the timeline parser, the
reproducibility record's secret filter, system-metric rows and the sweep grid."""
import json
import warnings

import numpy as np
import pytest

from hvdsync.config import Config, ConfigError
from hvdsync.core.telemetry import monitor, profiling, record, sysmetrics
from hvdsync.core.telemetry.tracking import Tracker
from hvdsync.launch.runs import grid


class _Tags(Tracker):
    def __init__(self):
        self.tags = {}

    def set_tags(self, tags):
        self.tags.update(tags)


def test_straggler_is_measured_against_the_median_of_the_others():
    assert monitor.straggler([0.01, 0.05]) == (1, pytest.approx(5.0))  # 2 ranks: a 5x slower one is 5x, not 1.67x
    assert monitor.straggler([0.01, 0.011, 0.04, 0.009]) == (2, pytest.approx(0.04 / 0.01))
    assert monitor.straggler([0.02]) == (0, 1.0)


def test_divergence_names_the_rank_that_differs_from_rank_0():
    fp = np.array([[1.0, 2.0, 3.0], [1.0, 2.0, 3.0], [1.0, 2.0 + 1e-12, 3.0]])
    assert monitor.diverged_ranks(fp) == [2]
    assert monitor.diverged_ranks(fp, tolerance=1e-9) == []


def test_alarms_tag_the_run_and_warn_once_per_kind_naming_the_rank():
    tracker = _Tags()
    alarms = monitor.Alarms(tracker, straggler_ratio=2.0)
    same, bad = np.ones((2, 3)), np.ones((2, 3))
    bad[1, 0] += 1e-3
    slow = [0.01, 0.05]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        checks = [alarms.check(10 * (i + 1), bad if i >= 2 else same, slow) for i in range(monitor.WINDOW + 3)]
    assert "alarm/divergence" not in checks[1] and checks[2]["alarm/divergence"] == 1.0     # at once
    # The straggler: the first check is warm-up, then a full window, then twice in a row over the threshold.
    first = next(i for i, c in enumerate(checks) if "alarm/straggler" in c)
    assert first == monitor.WINDOW + 1 and checks[first]["monitor/straggler_ratio"] == pytest.approx(5.0)
    messages = [str(w.message) for w in caught if w.category is monitor.MonitorWarning]
    assert len(messages) == 2 and "rank 1's parameters differ" in messages[0] and "rank 1 is a straggler" in messages[1]
    assert alarms.messages == messages
    assert tracker.tags["hvdsync.alarm.divergence.rank"] == 1
    assert f"step {10 * (first + 1)}" in tracker.tags["hvdsync.alarm.straggler"]
    # A rank slow now and then (descheduled on a shared machine) is no straggler: the window smooths it out.
    calm = monitor.Alarms(_Tags())
    works = [[0.01, 0.05], [0.01, 0.011], [0.05, 0.01], [0.01, 0.011], [0.01, 0.05], [0.011, 0.01]] * 3
    assert not any("alarm/straggler" in calm.check(s, same, w) for s, w in enumerate(works))


def test_comm_share():
    assert profiling.comm_share({"data": 1, "compute": 2, "sync_wait": 1, "update": 0}) == 0.25
    assert profiling.comm_share({}) == 0.0


def test_timeline_parts_per_tensor_count_nested_time_once(tmp_path):
    events = [{"name": "process_name", "ph": "M", "pid": 0, "args": {"start_time_since_epoch_in_micros": 0}},
              {"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "fc.weight"}},
              {"name": "NEGOTIATE_ALLREDUCE", "ph": "B", "ts": 0, "pid": 1},
              {"name": "", "ph": "E", "ts": 1000, "pid": 1},
              {"name": "ALLREDUCE", "ph": "B", "ts": 1000, "pid": 1},
              {"name": "QUEUE", "ph": "B", "ts": 1000, "pid": 1},
              {"name": "", "ph": "E", "ts": 1500, "pid": 1},
              {"name": "GLOO_ALLREDUCE", "ph": "B", "ts": 1500, "pid": 1},
              {"name": "", "ph": "E", "ts": 4500, "pid": 1},
              {"name": "", "ph": "E", "ts": 5000, "pid": 1}]
    (tmp_path / "t.json").write_text("[\n" + ",\n".join(json.dumps(e) for e in events) + "]")
    parts = profiling.parse_timeline(tmp_path / "t.json")["fc.weight"]
    assert parts["negotiate"] == pytest.approx(0.001) and parts["queue"] == pytest.approx(0.0005)
    # GLOO_ALLREDUCE's 3 ms plus the outer ALLREDUCE's own 0.5 ms after it, counted once
    assert parts["allreduce"] == pytest.approx(0.0035) and parts["other"] == 0.0
    png = profiling.timeline_chart({"fc.weight": parts}, tmp_path / "t.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_record_keeps_relevant_env_and_drops_secret_names_and_url_passwords(monkeypatch):
    env = {"HOROVOD_FUSION_THRESHOLD": "67108864", "OMP_NUM_THREADS": "1", "HVDSYNC_API_TOKEN": "tok-123",
           "MLFLOW_TRACKING_PASSWORD": "pw-456", "AWS_SECRET_ACCESS_KEY": "aws-789", "HOME": "/home/x",
           "MLFLOW_TRACKING_URI": "http://bob:pw-000@mlflow.example:5000"}
    kept = record.recorded_env(env)
    assert kept == {"HOROVOD_FUSION_THRESHOLD": "67108864", "OMP_NUM_THREADS": "1",
                    "MLFLOW_TRACKING_URI": "http://bob:***@mlflow.example:5000"}
    monkeypatch.setenv("HVDSYNC_SECRET_KEY", "do-not-record")
    monkeypatch.setenv("HVDSYNC_COMMAND_LINE", json.dumps(["hvdsync", "train", "--tracking-uri", "https://u:p1@h"]))
    cfg = Config()
    rec = record.build_record(cfg.to_dict(), "torch", 2, cfg.train.seed, cfg.train.deterministic)
    text = json.dumps(rec) + json.dumps(record.record_params(rec))
    assert "do-not-record" not in text and "p1@" not in text
    assert rec["seeds"]["rank_seeds"][0] != rec["seeds"]["rank_seeds"][1]
    assert rec["command_line"] == ["hvdsync", "train", "--tracking-uri", "https://u:***@h"]
    assert {"python", "hvdsync", "numpy", "mlflow"} <= set(rec["versions"])


def test_system_metric_rows_round_trip_and_a_non_sampling_rank_sends_nothing():
    row = sysmetrics.encode({"cpu_utilization_percentage": 12.5, "system_memory_usage_megabytes": 1024.0}, "node-a")
    assert row.shape == (sysmetrics.PAYLOAD_BYTES,)
    assert sysmetrics.decode(row) == {"system/node-a/cpu_utilization_percentage": 12.5,
                                      "system/node-a/system_memory_usage_megabytes": 1024.0}
    assert sysmetrics.decode(sysmetrics.encode(None)) == {}
    sampler = sysmetrics.NodeSampler(interval=60)
    try:
        sample = sampler.take()
    finally:
        sampler.close()
    assert 0 <= sample["cpu_utilization_percentage"] <= 100 and sample["system_memory_usage_megabytes"] > 0


def test_sweep_grid_and_monitor_config_errors():
    assert grid(["sync.compression=none,fp16", "sync.accumulate=1,4"]) == [
        ["sync.compression=none", "sync.accumulate=1"], ["sync.compression=none", "sync.accumulate=4"],
        ["sync.compression=fp16", "sync.accumulate=1"], ["sync.compression=fp16", "sync.accumulate=4"]]
    with pytest.raises(ConfigError, match=r"^monitor.straggler_ratio: 1 is not allowed"):
        Config.from_dict({"monitor": {"straggler_ratio": 1}})
    with pytest.raises(ConfigError, match=r"^monitor.every: -1 is not allowed"):
        Config.from_dict({"monitor": {"every": -1}})


def test_a_job_without_tracking_takes_no_system_samples_and_imports_no_mlflow():
    # One Horovod rank of the real loop, tracking off: the observer still gathers every `monitor.every` steps, but
    # samples nothing (the figures would go nowhere), so MLflow's monitors, pandas and SciPy stay unimported.
    import subprocess
    import sys

    code = """
import sys
from hvdsync.config import Config
from hvdsync.launch import worker
cfg = Config.from_dict({"train": {"framework": "torch", "epochs": 1}, "tracking": {"enabled": False},
                        "monitor": {"every": 5}})
[result] = worker.fit_many([cfg.to_dict()])
print(result["optimizer_steps"], sorted(m for m in ("mlflow", "pandas", "scipy", "sklearn") if m in sys.modules))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    steps, imported = out.stdout.strip().splitlines()[-1].split(" ", 1)
    assert int(steps) > 5 and imported == "[]"
