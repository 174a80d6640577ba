"""The launcher: knobs reach the workers, failures come back readable, output stays out of the way."""
import signal
import threading
import time

import pytest

from hvdsync import launch
from hvdsync.config import Config, ConfigError
from hvdsync.launch.workers import Workers


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


def hang_in_an_allreduce_rank_1_never_joins():
    import time

    import horovod.torch as hvd
    import torch

    hvd.init()
    if hvd.rank() == 0:
        hvd.allreduce(torch.ones(3), name="never_matched")
    time.sleep(3600)


class _GaveUp(BaseException):
    """What a test framework's time limit raises in the main thread (pytest-timeout's Failed is a BaseException)."""


def _left_behind(before: Workers) -> list:
    """Processes started since ``before`` was made (the job's) and Horovod's launcher threads still alive a few
    seconds after a stop (other tests' helpers, such as a session's tracking server, are not the job's)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        procs = before.started()
        # Horovod's launcher threads (threading names them after their target, fn_execute) are non-daemon.
        threads = [t for t in threading.enumerate() if "fn_execute" in t.name]
        if not procs and not threads:
            return []
        time.sleep(0.2)
    return procs + threads


def test_a_hung_job_stops_at_its_timeout_with_the_workers_stacks_and_leaves_nothing_running(tmp_path):
    handlers = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    before, started = Workers(), time.monotonic()
    with pytest.raises(launch.WorkerError) as err:
        launch.run(hang_in_an_allreduce_rank_1_never_joins, np=2, progress=False, log_dir=tmp_path, timeout=18)
    assert time.monotonic() - started < 60
    message = str(err.value)
    assert "did not finish within timeout=18 s" in message
    assert "hang_in_an_allreduce_rank_1_never_joins" in message      # faulthandler's stacks name the hung line
    assert _left_behind(before) == []
    # Horovod's launcher took SIGINT/SIGTERM for itself; they are given back (a notebook cell stays interruptible).
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == handlers
    with pytest.raises(ConfigError, match=r"timeout: 0 is not allowed; expected a number of seconds > 0"):
        launch.run(report_env, np=2, timeout=0)


def test_a_caller_that_gives_up_mid_run_stops_the_workers(tmp_path, capsys):
    def give_up(signum, frame):
        raise _GaveUp()

    before = Workers()
    previous = signal.signal(signal.SIGALRM, give_up)
    signal.alarm(12)  # the workers need not have reached the hang: stopping them is what is checked
    try:
        with pytest.raises(_GaveUp):
            launch.run(hang_in_an_allreduce_rank_1_never_joins, np=2, progress=False, log_dir=tmp_path)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    assert _left_behind(before) == []  # else Horovod's non-daemon threads would keep this interpreter from exiting
    assert "interrupted; workers stopped" in capsys.readouterr().err


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
    adasum = Config.from_dict({"sync": {"op": "adasum"}})
    import horovod.torch as hvd

    if hvd.mpi_built():  # Adasum needs MPI: built wherever an MPI was installed (scripts/build_horovod.sh)
        launch.preflight(adasum)
    else:
        with pytest.raises(ConfigError, match="sync.op: 'adasum' is not allowed with this Horovod build"):
            launch.preflight(adasum)


def where_am_i():
    import os

    import horovod.torch as hvd
    import torch

    hvd.init()
    total = hvd.allreduce(torch.tensor([float(hvd.rank() + 1)]), op=hvd.Sum)
    return {"rank": hvd.rank(), "local_size": hvd.local_size(), "host": os.environ.get("HOROVOD_HOSTNAME"),
            "sum": float(total)}


def test_hosts_reach_horovod_two_names_of_this_machine_are_two_hosts():
    # localhost and 127.0.0.1 are two hosts to Horovod (it keys hosts by name) and both start without ssh: the
    # multi-host path (one worker per host, interfaces given) on one machine, with no traffic leaving it.
    from hvdsync.launch.hosts import Host

    two = launch.run(where_am_i, np=2, hosts=[Host("localhost", 1), Host("127.0.0.1", 1)],
                     network_interfaces=["lo"], progress=False)
    assert sorted(r["host"] for r in two) == ["127.0.0.1", "localhost"]
    assert [r["local_size"] for r in two] == [1, 1]             # one worker on each host
    assert [r["sum"] for r in two] == [3.0, 3.0]                # the ring across the two hosts sums 1 + 2
    one = launch.run(where_am_i, np=2, hosts="localhost:2", progress=False)
    assert [r["local_size"] for r in one] == [2, 2] and {r["host"] for r in one} == {"localhost"}
