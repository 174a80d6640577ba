"""`python -m hvdlab.testhosts` from a shell: `up | tail` returns, because the processes that hold the hosts (the
namespace holders and sshd) keep none of the caller's stdio, and `down` then leaves nothing behind."""
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from hvdlab.testhosts import TestHosts, unavailable

ROOT = Path(__file__).resolve().parents[2]


def _cli(*args: str) -> str:
    return " ".join([shlex.quote(sys.executable), "-m", "hvdlab.testhosts", *args])


def test_up_through_a_pipe_returns_and_down_takes_the_hosts_away():
    why = unavailable()
    if why:
        pytest.skip(f"no test hosts: {why}")
    prefix = f"hvdpipe{os.getpid()}"
    hosts = TestHosts(2, prefix=prefix)  # the names and folder `up` makes, to check them and to clean up
    spaces = [h.namespace for h in hosts.hosts] + [hosts.switch]
    # Its own session, so that a hang can be ended whole (the shell and tail) without waiting on the pipe.
    shell = subprocess.Popen(["bash", "-c", f"set -o pipefail; {_cli('--prefix', prefix, 'up', '--subnet', '10.77.4')}"
                              " | tail -n 3"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True)
    try:
        try:
            out, err = shell.communicate(timeout=180)
        except subprocess.TimeoutExpired:
            os.killpg(shell.pid, signal.SIGKILL)
            pytest.fail("`up | tail` did not return: a process left running holds the pipe")
        assert shell.returncode == 0, err
        assert out.startswith("ssh key: ") and "shell node1 --" in out, out
        assert all(Path(f"/run/netns/{ns}").exists() for ns in spaces)
        # The hosts `up` left behind work: node1 answers as itself.
        on_node1 = subprocess.run(["bash", "-c", _cli("--prefix", prefix, "shell", "node1", "--", "hostname")],
                                  capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
        assert on_node1.stdout.strip() == "node1", on_node1.stderr
    finally:
        down = subprocess.run(["bash", "-c", _cli("--prefix", prefix, "down")], capture_output=True, text=True,
                              timeout=120)
    assert down.returncode == 0, down.stderr
    assert not any(Path(f"/run/netns/{ns}").exists() for ns in spaces)
    assert not hosts.dir.exists()
