"""One job, one MLflow run on Ray's elastic executor too (tests/ray/conftest.py's two-node cluster): rank 0's worker
killed (SIGKILL) mid-job, wherever Ray placed it; the other worker goes on as rank 0 in the same run.

The job's driver runs on node1 (the head's host), as in tests/ray/test_ray.py. Rank 0's worker is the one running the
MLflow sender (only rank 0 tracks); the test kills that worker process, not its node, so either node can hold it.
"""
import contextlib
import importlib.util
import os
import signal
from pathlib import Path

import pytest

from tests.hosts.checkpoints import checkpoints, wait_for
from tests.mlflow_runs import one_finished_run
from tests.ray.conftest import NO_RAY

if importlib.util.find_spec("ray") is None:
    pytest.skip(NO_RAY, allow_module_level=True)  # one line for the whole file

EPOCHS = 2


def _rank0_worker(cluster) -> int | None:
    """The pid of the worker that runs rank 0's MLflow sender (its parent), on whichever node."""
    import psutil

    for name in ("node1", "node2"):
        for pid in cluster.hosts.processes(name):
            with contextlib.suppress(psutil.Error):
                proc = psutil.Process(pid)
                if "hvdsync.core.telemetry.sender" in " ".join(proc.cmdline()):
                    return proc.ppid()
    return None


@pytest.fixture(scope="module")
def rank0_killed(ray_cluster, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ray-one-run")
    ckpt, run_dir, uri = tmp / "ckpt", tmp / "run", f"sqlite:///{tmp / 'mlflow.db'}"
    config = {"data": {"batch_size": 16}, "train": {"framework": "torch", "epochs": EPOCHS, "lr": 0.05},
              "tracking": {"enabled": True, "tracking_uri": uri, "spool_dir": str(tmp / "spool")},
              "elastic": {"enabled": True, "min_np": 1, "max_np": 2, "commit_every": 2, "timeout_s": 60,
                          "keep": 200, "checkpoint_dir": str(ckpt)}}
    spec = {"job": "train", "config": config, "address": ray_cluster.address, "cpus_per_worker": 2,
            "log_dir": str(run_dir), "faults": "slow@100"}
    driver_log = tmp / "driver.log"
    with ray_cluster.driving(spec, driver_log, HOROVOD_GLOO_TIMEOUT_SECONDS="60") as job:
        wait_for(lambda: [c for c in checkpoints(ckpt) if c["world_size"] == 2 and c["step"] >= 4],
                 "a checkpoint of 2 workers", timeout=180, job=job)
        killed = wait_for(lambda: _rank0_worker(ray_cluster), "rank 0's MLflow sender", timeout=60, job=job)
        os.kill(killed, signal.SIGKILL)
        job.wait(timeout=400)
    return ray_cluster.outcome(job, driver_log)["result"], uri, Path(tmp)


def test_rank_0_killed_on_ray_leaves_one_finished_run_with_every_epoch_once(rank0_killed):
    result, uri, _ = rank0_killed
    assert [(e["size_before"], e["size_after"]) for e in result["resets"]] == [(2, 1)]
    tags = one_finished_run(uri, result["run_id"], EPOCHS)
    assert tags["hvdsync.launcher"] == "ray" and tags["hvdsync.world_sizes"] == "2,1"
    assert tags["hvdsync.resets"] == "1" and "worker lost" in tags["hvdsync.reset.1"]
