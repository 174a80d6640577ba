"""The launcher: knobs reach the workers, failures come back readable, output stays out of the way."""
import pytest

from hvdsync import launch
from hvdsync.config import Config, ConfigError


def report_env():
    import os

    import horovod.torch as hvd

    hvd.init()
    return {k: os.environ.get(k) for k in ("HOROVOD_CYCLE_TIME", "HOROVOD_CACHE_CAPACITY",
                                           "HOROVOD_FUSION_THRESHOLD", "TF_CPP_MIN_LOG_LEVEL")} | {"rank": hvd.rank()}


def fail_on_rank_1():
    import horovod.torch as hvd

    hvd.init()
    print("rank", hvd.rank(), "says hello on stdout")
    if hvd.rank() == 1:
        raise ValueError("rank 1 could not read its shard")
    return hvd.rank()


def test_sync_knobs_reach_every_worker():
    sync = Config.from_dict({"sync": {"cycle_time_ms": 3.5, "cache_capacity": 7, "fusion_threshold_mb": 2}}).sync
    results = launch.run(report_env, np=2, sync=sync, progress=False)
    assert [r["rank"] for r in results] == [0, 1]
    for r in results:
        assert r["HOROVOD_CYCLE_TIME"] == "3.5"        # not "(None,)" (scripts/horovod-patches/0003)
        assert r["HOROVOD_CACHE_CAPACITY"] == "7"
        assert r["HOROVOD_FUSION_THRESHOLD"] == str(2 * 1024 * 1024)
        assert r["TF_CPP_MIN_LOG_LEVEL"] == "2"


def test_a_failing_worker_raises_with_its_traceback_and_output_stays_in_the_log(tmp_path, capsys):
    with pytest.raises(launch.WorkerError) as err:
        launch.run(fail_on_rank_1, np=2, progress=False, log_dir=tmp_path)
    assert "ValueError: rank 1 could not read its shard" in str(err.value)
    assert str(tmp_path / "workers.log") in str(err.value)
    captured = capsys.readouterr()
    assert "says hello" not in captured.out + captured.err           # quiet: worker lines went to the log ...
    assert "rank 0 says hello on stdout" in (tmp_path / "workers.log").read_text()   # ... which kept them


def test_bad_np_and_framework_fail_before_any_worker_starts():
    with pytest.raises(ConfigError, match="np: 0 is not allowed"):
        launch.run(report_env, np=0)
    assert set(launch.horovod_frameworks()) == {"torch", "tensorflow"}
    with pytest.raises(ConfigError, match="sync.op: 'adasum' is not allowed with this Horovod build"):
        launch.preflight(Config.from_dict({"sync": {"op": "adasum"}}))
