"""Jobs through Slurm's own commands on a real Slurm cluster of two test hosts (tests/slurm/conftest.py): the
batch scripts of examples/slurm/ as users submit them, ``srun`` steps, ``scancel``.

* ``train_srun.sbatch``: 2 nodes x 2 tasks, each task an ``hvdsync train`` rank started by ``srun --mpi=pmix``, with
  sshd stopped on node2 for the whole job (nothing may ssh between the nodes); MLflow gets the job id, the node list
  and the ranks of each node.
* ``train.sbatch``: the same training through ``hvdsync train --hosts slurm`` (Horovod's launcher over ssh, Gloo):
  the same accuracy as under MPI.
* an elastic job cancelled with ``scancel`` after its first durable checkpoint and submitted again with
  ``--resume``: it goes on from that checkpoint to the end, no step read twice or skipped, and the checkpoints verify.
* bad input, one line before any worker starts: srun's ``--mpi`` plugin missing in Slurm, a plugin the MPI cannot
  use, a task count that is not the step's, and (as a function: every Horovod here has MPI) srun without MPI.
"""
import json
import os
import sqlite3
import time
from pathlib import Path

import pytest

from hvdlab.slurm import SlurmCluster
from hvdlab.testhosts import TestHosts
from hvdsync.config import Config, ConfigError
from hvdsync.core.elastic._store import CheckpointStore
from hvdsync.launch import mpi, slurm as slurm_step
from hvdsync.launch.base import mpi_built
from tests.hosts.checkpoints import checkpoints, newest, wait_for

ROOT = Path(__file__).resolve().parents[2]
TRAIN = ["--framework", "torch", "--set", "train.epochs=2", "--experiment", "slurm", "--json"]


def _submit(slurm, env, script, out: Path, args, timeout=400, **extra_env) -> tuple[int, str, str]:
    job = slurm.sbatch(["-o", str(out), f"examples/slurm/{script}", *args], cwd=ROOT, env={**env, **extra_env})
    state = slurm.wait(job, timeout=timeout)
    return job, state, out.read_text(errors="replace") if out.exists() else ""


def _result(text: str) -> dict:
    start = text.index("{\n")
    return json.JSONDecoder().raw_decode(text[start:])[0]


def _params(store: Path, run_id: str) -> dict:
    with sqlite3.connect(store) as db:
        return dict(db.execute("select key, value from params where run_uuid = ?", (run_id,)))


@pytest.fixture(scope="module")
def jobs(slurm, hosts, env, tmp_path_factory):
    """The same training through srun (MPI, sshd down on node2) and through --hosts slurm (ssh, Gloo)."""
    tmp = tmp_path_factory.mktemp("slurm-jobs")
    store = tmp / "mlflow.db"
    args = [*TRAIN, "--tracking-uri", f"sqlite:///{store}"]
    hosts.stop_sshd("node2")
    try:
        started = time.monotonic()
        srun = _submit(slurm, env, "train_srun.sbatch", tmp / "srun.out", args)
        srun_s = time.monotonic() - started
        ssh_refused = hosts.run("node1", ["ssh", "-i", str(hosts.key), "-o", "BatchMode=yes", "-o",
                                          "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
                                          "-o", "ConnectTimeout=5", "node2", "true"], timeout=30).returncode != 0
    finally:
        hosts.restore("node2")
    started = time.monotonic()
    ssh = _submit(slurm, env, "train.sbatch", tmp / "ssh.out", [*args, "--ssh-identity-file", str(hosts.key)],
                  HVDSYNC_IFACE="hv0")
    print(f"\n4 ranks on 2 Slurm nodes, 2 epochs: srun --mpi=pmix {srun_s:.1f} s, --hosts slurm (ssh) "
          f"{time.monotonic() - started:.1f} s (submit to end)")
    return {"srun": srun, "ssh": ssh, "store": store, "ssh_refused": ssh_refused}


def test_srun_job_trains_with_mpi_while_node2_refuses_ssh(jobs):
    job, state, text = jobs["srun"]
    assert state == "COMPLETED", text[-3000:]
    assert jobs["ssh_refused"]                                      # node2 really took no ssh during the job
    result = _result(text)
    assert result["world_size"] == 4 and result["param_spread"] == 0.0 and result["test_accuracy"] > 0.7
    assert text.count('"world_size"') == 1                           # rank 0 alone prints the result


def test_mlflow_records_the_slurm_job_its_nodes_and_the_ranks_per_node(jobs):
    job, _, text = jobs["srun"]
    params = _params(jobs["store"], _result(text)["run_id"])
    assert params["slurm.job_id"] == str(job)
    assert params["slurm.nodelist"] == "node[1-2]" and params["slurm.tasks_per_node"] == "2(x2)"
    assert params["hosts.ranks"] == "node1=0,1;node2=2,3" and params["world_size"] == "4"
    assert params["horovod.mpi"] == "True"


def test_the_same_job_through_hosts_slurm_over_ssh_matches_the_mpi_one(jobs):
    job, state, text = jobs["ssh"]
    assert state == "COMPLETED", text[-3000:]
    result, mpi = _result(text), _result(jobs["srun"][2])
    assert result["world_size"] == 4 and result["param_spread"] == 0.0
    # The same seed, data and plan: the controllers differ only in the order they sum (parameters within 1e-5,
    # tests/slurm/test_mpi.py), which may flip a test sample or two of 449 at most.
    assert result["test_accuracy"] == pytest.approx(mpi["test_accuracy"], abs=2.5 / 449)
    params = _params(jobs["store"], result["run_id"])
    assert params["slurm.job_id"] == str(job) and params["hosts.ranks"] == "node1=0,1;node2=2,3"


def test_a_cancelled_job_resumes_from_its_checkpoint_to_the_end(slurm, hosts, env, tmp_path):
    ckpt = tmp_path / "ckpt"
    args = ["--framework", "torch", "--set", "train.epochs=2", "--no-track", "--json", "--elastic",
            "--checkpoint-dir", str(ckpt), "--set", "elastic.commit_every=2", "--set", "elastic.min_np=4",
            "--set", "elastic.max_np=4", "--set", "elastic.keep=100", "--ssh-identity-file", str(hosts.key)]
    first = slurm.sbatch(["-o", str(tmp_path / "first.out"), "examples/slurm/train.sbatch", *args], cwd=ROOT,
                         env={**env, "HVDSYNC_IFACE": "hv0"})
    try:
        saved = wait_for(lambda: newest(ckpt, 4, step=4), "a checkpoint at step 4", timeout=240)
    finally:
        slurm.run(["scancel", str(first)], timeout=30)
    assert slurm.wait(first, timeout=60) == "CANCELLED"
    # Nothing of the cancelled job is left on either node (slurmd ends the batch script's processes; Horovod's
    # launcher, stopped, ends the workers it started over ssh).
    wait_for(lambda: not _leftovers(hosts, ckpt), "the cancelled job's processes to end", timeout=60)
    resubmitted = time.time()
    job, state, text = _submit(slurm, env, "train.sbatch", tmp_path / "second.out", [*args, "--resume"],
                               HVDSYNC_IFACE="hv0")
    assert state == "COMPLETED", text[-3000:]
    result = _result(text)
    steps_per_epoch = -(-1348 // (Config().data.batch_size * 4))    # digits' 1,348 training samples, 4 ranks
    assert result["epochs"] == 2 and result["steps"] == 2 * steps_per_epoch and result["param_spread"] == 0.0
    # Every checkpoint is kept (elastic.keep): the cancelled job's up to its last, the resumed job's after it, each
    # step committed once (every 2 steps and at each epoch's end). The resumed job wrote none at or before the
    # cancelled job's last: it went on from there.
    written = checkpoints(ckpt)
    steps = [c["step"] for c in written]
    assert steps[0] == 2 and steps[-1] == result["steps"] and all(0 < b - a <= 2 for a, b in zip(steps, steps[1:]))
    last_before = max(c["step"] for c in written if c["time"] < resubmitted)
    assert last_before >= saved["step"]
    assert all(c["time"] > resubmitted for c in written if c["step"] > last_before)
    store = CheckpointStore(ckpt, keep=100)
    for path in store.candidates():
        store.verify(path)                                          # every checkpoint passes its checks
    final = store.latest()
    assert final.meta["position"]["step"] >= result["steps"] - 2 and final.meta["world_size"] == 4


def _leftovers(hosts, ckpt) -> list[int]:
    found = []
    for name in ("node1", "node2"):
        for pid in hosts.processes(name):
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if str(ckpt).encode() in cmdline or b"hvdsync.launch.worker" in cmdline:
                found.append(pid)
    return found


def _refused(slurm, env, argv, timeout=120) -> str:
    out = slurm.run(["timeout", str(timeout - 10), *argv], cwd=ROOT, env=env, timeout=timeout)
    lines = [x for x in out.stderr.splitlines() if x.strip() and not x.startswith("srun: error: node")]
    assert out.returncode != 0 and len(lines) == 1, out.stdout[-2000:] + out.stderr[-2000:]
    return lines[0]


def test_bad_input_stops_each_task_before_horovod_starts_with_one_line(slurm, env, tmp_path):
    hvdsync = str(Path(env["HVDSYNC_VENV"]) / "bin" / "hvdsync")
    line = _refused(slurm, env, ["srun", "-N2", "-n4", "--mpi=pmi2", hvdsync, "train", "--no-track"])
    assert line.startswith("hvdsync: error: srun --mpi=pmi2: this MPI cannot take its ranks") and "--mpi=pmix" in line
    line = _refused(slurm, env, ["srun", "-N2", "-n4", "--mpi=pmix", hvdsync, "train", "--np", "2", "--no-track"])
    assert line.startswith("hvdsync: error: np: 2 is not allowed inside this job step: srun started 4 tasks")
    # The plugin missing in Slurm itself: the batch script says so before srun (which would print five lines).
    job, state, text = _submit(slurm, env, "train_srun.sbatch", tmp_path / "plugin.out", ["--no-track"],
                               timeout=60, HVDSYNC_SRUN_MPI="pmix_v3")
    assert state == "FAILED"
    assert text.strip().splitlines() == ["hvdsync: error: srun --mpi=pmix_v3: this Slurm has no such MPI plugin; "
                                         "it has: pmix none cray_shasta pmi2 pmix_v4 (HVDSYNC_SRUN_MPI picks one)"]


def test_srun_without_an_mpi_build_names_the_fix():
    step = {"SLURM_STEP_NUM_TASKS": "4", "SLURM_PROCID": "0", "SLURM_MPI_TYPE": "pmix"}
    assert slurm_step.in_step(step) and not slurm_step.in_step({**step, "SLURM_STEP_NUM_TASKS": "1"})
    with pytest.raises(ConfigError) as error:
        slurm_step.check_step(None, mpi_built=False, environ=step, speaks={"pmix"})
    assert "built without MPI (Gloo only)" in str(error.value) and "bash scripts/build_horovod.sh" in str(error.value)
    assert "--hosts slurm" in str(error.value) and "\n" not in str(error.value)
    assert slurm_step.check_step(None, mpi_built=True, environ=step, speaks={"pmix"}) == 4


def test_the_mpis_pmi_support_is_read_from_ompi_info(tmp_path):
    fake = tmp_path / "ompi_info"
    fake.write_text("#!/bin/sh\nprintf 'mca:pmix:ext3x:version:mca:2.1.0\\nmca:pmix:flux:version:mca:2.1.0\\n"
                    "mca:ess:slurm:version:mca:2.1.0\\n'\n")
    fake.chmod(0o755)
    assert mpi.mpi_speaks(str(fake)) == {"pmix"}
    step = {"SLURM_STEP_NUM_TASKS": "4", "SLURM_PROCID": "0", "SLURM_MPI_TYPE": "pmi2"}
    with pytest.raises(ConfigError, match=r"srun --mpi=pmi2: .* use --mpi=pmix \(`srun --mpi=list`"):
        slurm_step.check_step(None, mpi_built=True, environ=step, speaks={"pmix"})
    with pytest.raises(ConfigError, match="srun --mpi=none: "):
        slurm_step.check_step(None, mpi_built=True, environ={**step, "SLURM_MPI_TYPE": "none"}, speaks={"pmix"})
    assert slurm_step.check_step(4, mpi_built=True, environ={**step, "SLURM_MPI_TYPE": "pmix_v4"},
                                 speaks={"pmix"}) == 4


def test_doctor_says_which_controllers_and_which_mpi():
    lines = mpi.controllers()
    if mpi_built():
        assert lines["controllers"] == "Gloo, MPI"
        assert lines["mpi"].startswith(mpi.mpi_version() or "no mpirun") and "srun --mpi=pmix" in lines["mpi"]
    else:
        assert lines["controllers"] == "Gloo" and "bash scripts/build_horovod.sh" in lines["mpi"]


def test_a_slurm_cluster_comes_up_runs_a_step_and_leaves_nothing_behind(slurm):
    # One host of its own (its own prefix and subnet: the session's cluster stays as it is).
    before = {p.name for p in Path("/tmp").glob("spmix*")}
    with TestHosts(1, prefix=f"hvdslurmone{os.getpid()}", subnet="10.77.6") as one:
        cluster = SlurmCluster(one).up()
        try:
            out = cluster.run(["timeout", "60", "srun", "-n2", "--mpi=pmix", "hostname"], timeout=90)
            assert out.returncode == 0 and out.stdout.split() == ["node1", "node1"], out.stderr
            pids, folder = dict(cluster.pids), cluster.dir
            assert set(pids) == {"munged", "slurmctld", "slurmd-node1"}
        finally:
            cluster.down()
        for pid in pids.values():
            assert not Path(f"/proc/{pid}").exists()                  # stopped and reaped
        assert not folder.exists()
    assert {p.name for p in Path("/tmp").glob("spmix*")} == before
