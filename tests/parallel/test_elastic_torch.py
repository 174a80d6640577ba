"""Elastic PyTorch on real Horovod workers, real signals, real files.

One elastic job serves the first group of tests: it starts on two local "hosts", the worker on the second one
SIGKILLs itself mid-epoch (fault injection: a real signal, at a known step), the survivor continues alone, then a
third host appears in the discovery script and the job grows back to two. A second group kills a whole job
(launcher and workers, SIGKILL) and resumes it from disk, with the newest checkpoint damaged on purpose, and
compares the final parameters bit for bit with an uninterrupted run. Then a worker that raises, and a job that
falls below ``min_np``.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hvdlab import faults
from hvdsync.launch import elastic as elastic_launch
from hvdsync.launch.local import WorkerError
from tests.parallel import elastic_workers

BIN = Path(sys.executable).parent
HOSTS = elastic_workers.HOSTS
pytestmark = pytest.mark.skipif(len(HOSTS) < 3, reason=f"needs 3 local host names, found {HOSTS}")
_cfg, _wait_for = elastic_workers.config, elastic_workers.wait_for


@pytest.fixture(scope="module")
def shrink_and_grow(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("elastic-torch")
    tracking = {"enabled": True, "tracking_uri": f"sqlite:///{run_dir / 'mlflow.db'}"}
    return elastic_workers.shrink_and_grow("torch", run_dir, tracking=tracking), run_dir


def test_a_killed_worker_leaves_the_job_running_on_the_survivor(shrink_and_grow):
    result, run_dir = shrink_and_grow
    lost = result.resets[0]
    assert lost["reason"] == "worker lost" and (lost["size_before"], lost["size_after"]) == (2, 1)
    # Committed steps are not lost: the kill came before step 7, the last commit was at step 6, and the first
    # step completed after the reset is step 7 (the survivor continued from the commit, not from the start).
    assert lost["step"] == 7
    assert lost["recovery_seconds"] > 0
    assert not (run_dir / "errors").exists()


def test_a_host_added_to_the_discovery_script_grows_the_job(shrink_and_grow):
    result, _ = shrink_and_grow
    grown = result.resets[1]
    assert grown["reason"] == "hosts added" and (grown["size_before"], grown["size_after"]) == (1, 2)
    assert result.world_size == 2
    sizes = [row[2] for row in result.timeline]
    assert sizes[:6] == [2] * 6 and 1 in sizes and sizes[-1] == 2


def test_every_sample_of_every_epoch_is_trained_on_exactly_once(shrink_and_grow):
    result, _ = shrink_and_grow
    reads = np.array(result.reads)
    assert reads.shape == (2, 1348)                       # 2 epochs x (1,797 digits - 449 held out for testing)
    assert reads.min() == 1 and reads.max() == 1          # across a world of 2, then 1, then 2 again
    # The timeline has one row per committed step and accounts for every sample once.
    assert len(result.timeline) == result.steps
    assert sum(sum(row[3:]) for row in result.timeline) == reads.sum()


def test_ranks_end_identical_and_the_joining_worker_started_from_rank_0s_state(shrink_and_grow):
    result, _ = shrink_and_grow
    assert result.param_spread == 0.0          # all-gathered fingerprints of the final parameters agree
    assert result.test_accuracy >= 0.85        # and they trained: a joining worker from scratch would not agree


def test_the_resets_are_in_the_mlflow_run(shrink_and_grow):
    import mlflow

    result, run_dir = shrink_and_grow
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{run_dir / 'mlflow.db'}")
    sizes = client.get_metric_history(result.run_id, "elastic_world_size")
    recovery = client.get_metric_history(result.run_id, "elastic_recovery_seconds")
    assert [(m.step, m.value) for m in sizes] == [(e["step"], e["size_after"]) for e in result.resets]
    assert [m.value for m in recovery] == pytest.approx([e["recovery_seconds"] for e in result.resets])
    run = client.get_run(result.run_id)
    assert run.info.status == "FINISHED"
    # Named and tagged for what ran, through the resets: the size it started at, elastic (telemetry.runlabel).
    tags = run.data.tags
    assert (tags["framework"], tags["hvdsync.np"], tags["hvdsync.elastic"]) == ("torch", "2", "true")
    assert run.info.run_name.startswith("torch x2 ") and run.info.run_name.endswith(" elastic"), run.info.run_name


# ---- a lost job, resumed from disk --------------------------------------------------------------------------------
def _cli(tmp_path, ckpt, *extra):
    return [str(BIN / "hvdsync"), "train", "--elastic", "--np", "2", "--min-np", "1", "--max-np", "3",
            "--checkpoint-dir", str(ckpt), "--no-track", "--json", "--batch-size", "16", "--epochs", "2",
            "--set", "train.deterministic=true", "--set", "elastic.commit_every=4", "--set",
            "train.plugins=[hvdlab.faults]", "--set", "train.callbacks=[faults]", *extra]


@pytest.fixture(scope="module")
def killed_and_resumed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("resume")
    env = {**os.environ, faults.ENV: ""}
    whole = subprocess.run(_cli(tmp, tmp / "ckpt-whole"), check=False, capture_output=True, text=True, timeout=600, env=env)
    assert whole.returncode == 0, whole.stderr[-3000:]
    # The same job, killed with SIGKILL (launcher and every worker) once it has written a few checkpoints.
    logs = tmp / "logs"
    ckpt = tmp / "ckpt"
    proc = subprocess.Popen(_cli(tmp, ckpt, "--log-dir", str(logs)), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**env, faults.ENV: "slow@30"},
                            start_new_session=True)
    _wait_for(lambda: len(list(ckpt.glob("ckpt-*"))) >= 3, "three checkpoints")
    elastic_workers.kill_whole(proc, logs)
    steps = sorted(int(p.name.split("-")[1]) for p in ckpt.glob("ckpt-*"))
    # Damage the newest checkpoint: the resumed job must name it and fall back to the one before.
    newest = ckpt / f"ckpt-{steps[-1]:09d}" / "torch_state.pt"
    blob = bytearray(newest.read_bytes())
    blob[len(blob) // 2] ^= 0xFF
    newest.write_bytes(bytes(blob))
    resumed = subprocess.run(_cli(tmp, ckpt, "--resume"), check=False, capture_output=True, text=True, timeout=600, env=env)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    return json.loads(whole.stdout), json.loads(resumed.stdout), resumed.stderr, steps, newest


def test_a_resumed_job_ends_bitwise_equal_to_an_uninterrupted_one(killed_and_resumed):
    whole, resumed, _, steps, _ = killed_and_resumed
    assert steps[-1] < resumed["steps"]        # it was killed before the end
    assert resumed["steps"] == whole["steps"]
    assert resumed["params_sha256"] == whole["params_sha256"]
    assert resumed["param_spread"] == 0.0


def test_the_damaged_checkpoint_is_named_and_the_previous_one_used(killed_and_resumed):
    _, _, stderr, steps, newest = killed_and_resumed
    assert f"hvdsync: checkpoint skipped: {newest}: checksum mismatch" in stderr   # in the user's terminal
    assert f"(step {steps[-2]})" in stderr


# ---- failures that must end the job -------------------------------------------------------------------------------
def test_a_python_exception_in_a_worker_fails_the_job_with_its_traceback(tmp_path):
    with pytest.raises(WorkerError) as err, faults.armed(f"raise@3:{HOSTS[1]}"):
        elastic_launch.train(faults.enable(_cfg("torch")), log_dir=tmp_path, progress=False)
    message = str(err.value)
    assert f"worker on {HOSTS[1]} failed" in message
    assert "Traceback (most recent call last)" in message and "RuntimeError: injected fault: raise@3" in message


@pytest.mark.timeout(300)  # it must end (Horovod issue 3494: survivors below min_np could wait forever)
def test_falling_below_min_np_ends_the_job_with_a_clear_message(tmp_path):
    cfg = faults.enable(_cfg("torch", elastic={"min_np": 2, "timeout_s": 5}))
    with pytest.raises(WorkerError) as err, faults.armed(f"kill@3:{HOSTS[1]}"):
        elastic_launch.train(cfg, log_dir=tmp_path, progress=False)
    assert "fewer than elastic.min_np=2 workers were available for elastic.timeout_s=5s" in str(err.value)
