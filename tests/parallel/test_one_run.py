"""One job, one MLflow run, whatever it loses: real elastic Horovod jobs on this machine, a real SQLite store that
does not exist before the job, real SIGKILLs.

* The worker holding rank 0 kills itself (SIGKILL, fault injection on its host) early in the job, PyTorch and
  TensorFlow: the survivor becomes rank 0 and writes into the same run; exactly one run, ``FINISHED``, every epoch's
  metrics once, the reset and the lost host in its tags. The store is new: the launcher created it before any worker
  started, so the killed rank 0 could not leave it half-created; it opens afterwards.
* A job killed whole (launcher and workers, SIGKILL) once its first epoch is committed, then resumed with
  ``--resume``: the resumed job's launcher finds the killed job's run still ``RUNNING``, ends it ``KILLED`` (a tag
  says who noticed), and continues it, because its checkpoint names it: still one run, its tags count the resume, and
  it ends ``FINISHED`` with each epoch once (the first from the killed job, the second from the resumed one).

Kept short: 2 epochs of digits, 2 workers, one job per framework, one killed-and-resumed pair (PyTorch).
"""
import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import mlflow
import pytest

from hvdlab import faults
from hvdsync.launch import elastic as elastic_launch
from tests.mlflow_runs import epochs, only_run
from tests.parallel import elastic_workers

HOSTS = elastic_workers.HOSTS
BIN = Path(sys.executable).parent
pytestmark = pytest.mark.skipif(len(HOSTS) < 2, reason=f"needs 2 local host names, found {HOSTS}")
KILL_STEP = 6
# The host whose worker is rank 0 at the start. Horovod's elastic driver (in this process) orders the first hosts as a
# set of their names built in the discovery file's order iterates (HostManager.update_available_hosts): the same
# construction here gives the same order. The killed spool's check below fails loudly should that ever change.
RANK0_HOST = next(iter(set([h for h in HOSTS[:2]])))


@pytest.fixture(scope="module", params=["torch", "tensorflow"])
def rank0_killed(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp(f"rank0-{request.param}")
    uri = f"sqlite:///{tmp / 'new-store.db'}"     # does not exist yet: the launcher creates it
    cfg = elastic_workers.config(request.param, elastic={"max_np": 2},
                                 tracking={"enabled": True, "tracking_uri": uri, "spool_dir": str(tmp / "spool")})
    with faults.armed(f"slow@30,kill@{KILL_STEP}:{RANK0_HOST}"):
        result = elastic_launch.train(faults.enable(cfg), log_dir=tmp / "run", hosts=HOSTS[:2], progress=False)
    return result, uri, tmp


def test_rank_0_killed_mid_job_leaves_one_finished_run_with_every_epoch_once(rank0_killed):
    result, uri, tmp = rank0_killed
    assert (tmp / "run" / "fault-1.fired").exists()
    assert [(e["size_before"], e["size_after"]) for e in result.resets] == [(2, 1)]
    client, run = only_run(uri)                  # the store opens: created whole before any worker started
    assert run.info.run_id == result.run_id and run.info.status == "FINISHED"
    for key in ("train_loss", "test_accuracy", "epoch_seconds"):
        assert epochs(client, run.info.run_id, key) == [0, 1], key
    assert run.data.params["world_size"] == "2"   # the first rank 0's params stand
    tags = run.data.tags
    assert tags["hvdsync.world_sizes"] == "2,1" and tags["hvdsync.resets"] == "1"
    assert "worker lost, 2 -> 1 workers" in tags["hvdsync.reset.1"]
    assert tags["hvdsync.lost_hosts"].startswith(f"{RANK0_HOST} at ")
    # Rank 0 really was the one killed (Horovod's driver names the process by the rank it started with).
    assert "Process 0 exit with status code 137" in (tmp / "run" / "workers.log").read_text(errors="replace")
    # Nothing left behind: the killed rank 0's spool, all of it delivered, was removed by the new rank 0's sender;
    # the launcher ended its run and removed its note.
    assert not list((tmp / "spool").glob("*.jsonl")) and not list((tmp / "spool" / "jobs").glob("*.json"))


# ---- a job killed whole, resumed ------------------------------------------------------------------------------------
def _cli(tmp: Path, *extra) -> list[str]:
    return [str(BIN / "hvdsync"), "train", "--elastic", "--np", "2", "--min-np", "1", "--max-np", "2",
            "--checkpoint-dir", str(tmp / "ckpt"), "--tracking-uri", f"sqlite:///{tmp / 'mlflow.db'}",
            "--set", f"tracking.spool_dir={tmp / 'spool'}", "--json", "--batch-size", "16", "--epochs", "2",
            "--set", "elastic.commit_every=4", "--set", "train.plugins=[hvdlab.faults]", "--set",
            "train.callbacks=[faults]", *extra]


def _committed_epoch(ckpt: Path) -> int:
    """The epoch position of the newest checkpoint in ``ckpt`` (-1 before the first)."""
    newest = max(ckpt.glob("ckpt-*/manifest.json"), default=None)
    with contextlib.suppress(OSError, ValueError):
        return json.loads(newest.read_text())["meta"]["position"]["epoch"] if newest else -1
    return -1


@pytest.fixture(scope="module")
def killed_and_resumed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("one-run-resume")
    logs = tmp / "logs"
    proc = subprocess.Popen(_cli(tmp, "--log-dir", str(logs)), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, faults.ENV: "slow@30"}, start_new_session=True)
    # Killed once the first epoch is committed: its metrics come from this job, the second epoch's from the resumed one.
    elastic_workers.wait_for(lambda: _committed_epoch(tmp / "ckpt") >= 1, "the first epoch's checkpoint")
    elastic_workers.kill_whole(proc, logs)
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{tmp / 'mlflow.db'}")
    killed = client.search_runs([e.experiment_id for e in client.search_experiments()])
    resumed = subprocess.run(_cli(tmp, "--resume"), capture_output=True, text=True, timeout=600,
                             env={**os.environ, faults.ENV: ""})
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    return killed, json.loads(resumed.stdout), tmp


def test_a_job_killed_whole_and_resumed_is_one_run_that_says_so(killed_and_resumed):
    killed, result, tmp = killed_and_resumed
    assert [r.info.status for r in killed] == ["RUNNING"]   # killed whole: nobody could end it then
    client, run = only_run(f"sqlite:///{tmp / 'mlflow.db'}")
    assert run.info.run_id == killed[0].info.run_id == result["run_id"]
    assert run.info.status == "FINISHED"
    tags = run.data.tags
    assert "ended without ending the run" in tags["hvdsync.ended_by"]   # the resumed job's launcher noticed
    assert tags["hvdsync.resumes"] == "1" and "after ending KILLED" in tags["hvdsync.resume.1"]
    # Epoch 0 from the killed job, epoch 1 from the resumed one: continuous by step, each once.
    assert epochs(client, run.info.run_id) == [0, 1]
    assert result["history"][0]["epoch"] == 0               # the resumed job carries the killed one's history on
