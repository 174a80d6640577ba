"""A real Slurm cluster on two test hosts, made once for the session (:mod:`hvdlab.slurm` over
:mod:`hvdlab.testhosts`): slurmctld on node1, a slurmd on each host, munge on a socket of its own. Taken down at the
end with nothing left behind (daemons stopped by pid, the cluster's folder, the namespaces, the known_hosts lines).

Where Slurm, munge, the test hosts or an MPI build of Horovod cannot be had, every test here is skipped with that one
line; ``make test`` installs the system's part where it runs as root (scripts/install_test_hosts.sh, before the
environment and its Horovod are built, so the one build has MPI).
"""
import os
import sys
from pathlib import Path

import pytest

from hvdlab.slurm import SlurmCluster, unavailable
from hvdlab.testhosts import TestHosts
from hvdsync.launch.base import mpi_built

ROOT = Path(__file__).resolve().parents[2]
# Not tests/hosts' 10.77.1, test_testhosts' 10.77.2 or tests/ray's (and benchmarks/link.py's) 10.77.3.
SUBNET = "10.77.5"


@pytest.fixture(scope="session")
def hosts():
    why = unavailable()
    if why:
        pytest.skip(f"no Slurm cluster: {why}")
    if not mpi_built():
        pytest.skip("no Slurm cluster tests: this Horovod was built without MPI (install openmpi-bin libopenmpi-dev, "
                    "then bash scripts/build_horovod.sh)")
    made = TestHosts(2, prefix=f"hvdslurm{os.getpid()}", subnet=SUBNET)
    made.up()
    try:
        yield made
    finally:
        made.down()


@pytest.fixture(scope="session")
def slurm(hosts):
    cluster = SlurmCluster(hosts)
    cluster.up()
    try:
        yield cluster
    finally:
        cluster.down()


@pytest.fixture(scope="session")
def env():
    """What every command on a test host gets: this interpreter's venv first on PATH, quiet TensorFlow, the venv's
    path for the batch scripts (HVDSYNC_VENV), and mpirun allowed to run as root (the tests' hosts run as root)."""
    venv = Path(sys.executable).parent.parent
    return {**os.environ, "PATH": f"{venv / 'bin'}:{os.environ.get('PATH', '')}", "TF_CPP_MIN_LOG_LEVEL": "2",
            "HVDSYNC_VENV": str(venv), "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
