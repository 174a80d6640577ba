"""Horovod's MPI controller across two test hosts, started the ways MPI users start it: ``mpirun -H`` with the
user's own script (ranks on the other host started over ssh by Open MPI's own launcher) and ``horovodrun --mpi``;
PyTorch and Keras. The parameters every rank ends with are identical, and equal those of the same script under
Gloo within 1e-5 (the two controllers sum in different orders)."""
import json
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
PY = sys.executable
JOB = "tests/slurm/params_job.py"


# Open MPI's ssh never reads or writes ssh's ~/.ssh/known_hosts (the password database's home, not $HOME): other
# test hosts of the same session are called node1 and node2 too, with other host keys, and strict checking would
# refuse this node2 for the key ssh recorded for theirs.
SSH = "ssh -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o BatchMode=yes -o LogLevel=ERROR"


def _mpirun(hosts, env, argv, timeout=600):
    # Open MPI reaches node2 with the test hosts' key.
    command = ["mpirun", "-np", "4", "-H", "node1:2,node2:2", "--mca", "plm_rsh_agent", f"{SSH} -i {hosts.key}",
               "--mca", "btl_tcp_if_include", "hv0", "--mca", "oob_tcp_if_include", "hv0",
               "-x", "PATH", "-x", "TF_CPP_MIN_LOG_LEVEL", *argv]
    return hosts.run("node1", command, cwd=ROOT, env=env, timeout=timeout)


def _horovodrun(hosts, env, argv, timeout=600):
    # horovodrun adds the key to Open MPI's ssh arguments (plm_rsh_args); the agent is ours, as a user passes it.
    command = ["horovodrun", "--mpi", "-np", "4", "-H", "node1:2,node2:2", "--network-interface", "hv0",
               "-i", str(hosts.key), f"--mpi-args=--mca plm_rsh_agent '{SSH}'", *argv]
    return hosts.run("node1", command, cwd=ROOT, env=env, timeout=timeout)


def _ranks(out, folder: Path) -> list[dict]:
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    ranks = [json.loads((folder / f"rank{r}.json").read_text()) for r in range(4)]
    assert [r["rank"] for r in ranks] == [0, 1, 2, 3] and {r["size"] for r in ranks} == {4}
    return ranks


@pytest.fixture(scope="module")
def runs(hosts, env, tmp_path_factory):
    """Each framework's job under MPI (torch: mpirun, Keras: horovodrun --mpi) and under Gloo (hvdsync's launcher,
    as horovodrun --gloo starts it)."""
    tmp = tmp_path_factory.mktemp("mpi")
    found = {}
    for framework, controller in (("torch", "mpirun"), ("keras", "mpi")):
        folder = tmp / f"{framework}-mpi"
        argv = [PY, JOB, framework, str(folder)]
        out = _mpirun(hosts, env, argv) if controller == "mpirun" else _horovodrun(hosts, env, argv)
        found[framework, "mpi"] = _ranks(out, folder)
        folder = tmp / f"{framework}-gloo"
        out = hosts.run("node1", [PY, JOB, framework, str(folder), "--gloo", str(hosts.key)], cwd=ROOT, env=env,
                        timeout=600)
        found[framework, "gloo"] = _ranks(out, folder)
    return found


@pytest.mark.parametrize("framework", ["torch", "keras"])
def test_mpi_ranks_run_two_per_host_and_end_with_identical_parameters(runs, framework):
    ranks = runs[framework, "mpi"]
    assert [r["host"] for r in ranks] == ["node1", "node1", "node2", "node2"]
    params = np.array([r["params"] for r in ranks])
    assert params.shape[1] > 2000 and np.abs(params - params[0]).max() == 0.0


@pytest.mark.parametrize("framework", ["torch", "keras"])
def test_mpi_parameters_equal_the_gloo_run_within_1e_5(runs, framework):
    mpi, gloo = (np.array([r["params"] for r in runs[framework, c]]) for c in ("mpi", "gloo"))
    assert np.abs(gloo - gloo[0]).max() == 0.0
    diff = np.abs(mpi[0] - gloo[0]).max()
    print(f"\n{framework}: largest parameter difference, MPI vs Gloo: {diff:.2e}")
    assert diff < 1e-5
    assert np.abs(mpi[0]).max() > 0.01  # trained parameters, not zeros


def test_mpirun_trains_the_torch_example_across_hosts(hosts, env):
    out = _mpirun(hosts, env, [PY, "examples/train_torch.py", "--set", "train.epochs=2",
                               "--set", "tracking.enabled=false"])
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    line = next(x for x in out.stdout.splitlines() if "torch x4: test accuracy" in x)
    assert "params equal across ranks: True" in line
    assert float(line.split("test accuracy ")[1].split()[0]) > 0.7               # 2 epochs; chance is 0.1
