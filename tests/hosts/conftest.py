"""Test hosts for the multi-host tests: network namespaces on this machine, each with its own interface ``hv0``,
address, host name, ``/etc/hosts`` and sshd (:mod:`hvdlab.testhosts`). One set serves the whole session; tests that
take a host away (the elastic ones) bring it back before they end.

Where they cannot be made (not Linux, not root, no ``ip netns``, no sshd), every test here is skipped with that one
line; ``make test`` installs what they need where it runs as root (scripts/install_test_hosts.sh).
"""
import os
import sys
from pathlib import Path

import pytest

from hvdlab.testhosts import TestHosts, unavailable

ROOT = Path(__file__).resolve().parents[2]
HOSTS = 3  # two for a job, a third to resume an elastic job on a different host set


@pytest.fixture(scope="session")
def cluster():
    why = unavailable()
    if why:
        pytest.skip(f"no test hosts: {why}")
    # A prefix of this session's own: a user's `python -m hvdlab.testhosts up` is never touched.
    hosts = TestHosts(HOSTS, prefix=f"hvdtest{os.getpid()}", subnet="10.77.1")
    hosts.up()
    try:
        yield hosts
    finally:
        hosts.down()


@pytest.fixture(scope="session")
def on_host(cluster):
    """``on_host("node1", [argv...], timeout=...)``: run a command on a test host from the repository root, with
    this interpreter's venv first on PATH; returns the completed process (text output)."""
    bin_dir = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ.get('PATH', '')}", "TF_CPP_MIN_LOG_LEVEL": "2"}

    def run(name, argv, timeout=600, **kw):
        return cluster.run(name, argv, cwd=ROOT, env={**env, **kw.pop("env", {})}, timeout=timeout, **kw)

    return run
