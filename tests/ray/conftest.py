"""A Ray cluster of two nodes for the session: ``ray start --head`` on test host node1, ``ray start --address`` on
node2 (network namespaces with their own address, host name and /etc/hosts: :mod:`hvdlab.testhosts`), 2 CPUs each.

Why namespaces, not two nodes on loopback: Horovod's elastic Ray discovery keys nodes by address, so two nodes on
127.0.0.1 would be one host to it, and a node whose raylet is killed would take the other's name with it. In a
namespace a node has no route but the test hosts' bridge, so nothing Ray does can reach another address.

Each node runs ``ray start --block`` (the node lives as long as that process; killing its raylet ends it) with a
temp dir of its own (two raylets on one file system would otherwise share socket names) and usage stats off. The
head checks its nodes' health every second so a killed raylet's node is marked dead in about 3 s, not 15-30 s.

Skipped with one line where Ray is not installed (``pip install 'hvdsync[ray]'``) or test hosts cannot be made.
"""
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from hvdlab.testhosts import TestHosts, unavailable

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
CPUS = 2                # logical CPUs each node offers (the machine has 2 cores for both: workers share them)
PORT = 6379
# GCS health checks of the nodes: every 1 s, dead after 3 misses (Ray's defaults: 3 s x 5).
HEAD_ENV = {"RAY_health_check_period_ms": "1000", "RAY_health_check_failure_threshold": "3",
            "RAY_health_check_initial_delay_ms": "1000"}
NO_RAY = "ray is not installed: pip install 'hvdsync[ray]' (tests/ray run the Ray launcher on a 2-node cluster)"


class RayCluster:
    """The nodes, by test host; :meth:`kill_raylet` and :meth:`start` change them while a job runs."""

    def __init__(self, hosts: TestHosts, temp: Path) -> None:
        self.hosts, self.temp = hosts, temp
        self.address = f"{hosts.host('node1').address}:{PORT}"
        self.nodes: dict[str, subprocess.Popen] = {}

    def env(self, **extra) -> dict:
        return {**os.environ, "PATH": f"{BIN}:{os.environ.get('PATH', '')}", "TF_CPP_MIN_LOG_LEVEL": "2",
                "RAY_USAGE_STATS_ENABLED": "0", **extra}

    def start(self, name: str) -> None:
        head = name == "node1"
        argv = [str(BIN / "ray"), "start", "--block", f"--node-ip-address={self.hosts.host(name).address}",
                f"--num-cpus={CPUS}", "--num-gpus=0", f"--temp-dir={self.temp / name}", "--disable-usage-stats",
                "--object-store-memory=100000000"]
        argv += ["--head", f"--port={PORT}", "--include-dashboard=false"] if head else [f"--address={self.address}"]
        log = open(self.temp / f"{name}.log", "ab")
        self.nodes[name] = self.hosts.popen(name, argv, cwd=ROOT, env=self.env(**(HEAD_ENV if head else {})),
                                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()

    def wait_nodes(self, count: int, timeout: float = 90) -> None:
        """Until ``count`` nodes are alive (asked of the head from node1)."""
        code = ("import ray, sys, time; ray.init(address=sys.argv[1], logging_level='ERROR'); t = time.time()\n"
                "while sum(n['Alive'] for n in ray.nodes()) != int(sys.argv[2]):\n"
                "    assert time.time() - t < float(sys.argv[3]), ray.nodes(); time.sleep(0.2)\n")
        out = self.hosts.run("node1", [sys.executable, "-c", code, self.address, str(count), str(timeout)],
                             cwd=ROOT, env=self.env(), timeout=timeout + 30)
        assert out.returncode == 0, self.logs() + out.stderr[-3000:]

    def kill_raylet(self, name: str) -> None:
        """SIGKILL the raylet of ``name``'s node: its workers die with it and `ray start --block` ends the rest."""
        proc = self.nodes.pop(name)
        raylets = [p for p in psutil.Process(proc.pid).children(recursive=True) if p.name() == "raylet"]
        assert raylets, f"no raylet under {name}'s ray start"
        for p in raylets:
            p.kill()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    def stop(self) -> None:
        for proc in self.nodes.values():
            if proc.poll() is None:
                proc.terminate()  # `ray start --block` stops its node's processes on SIGTERM
        for proc in self.nodes.values():
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self.nodes = {}

    def logs(self) -> str:
        return "".join(f"--- {p.name}\n{p.read_text(errors='replace')[-2000:]}\n" for p in self.temp.glob("*.log"))

    def drive(self, spec: dict, timeout: float = 300, **env) -> dict:
        """Run tests/ray/ray_jobs.py's driver on node1 with ``spec``; returns its result."""
        out = self.hosts.run("node1", [sys.executable, "-m", "tests.ray.ray_jobs", json.dumps(spec)], cwd=ROOT,
                             env=self.env(**env), timeout=timeout)
        line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT ")), None)
        assert out.returncode == 0 and line, out.stdout[-3000:] + out.stderr[-5000:]
        return json.loads(line[len("RESULT "):])

    def hvdsync(self, *argv: str, timeout: float = 300, **env) -> subprocess.CompletedProcess:
        """``hvdsync ...`` on node1 (text output)."""
        return self.hosts.run("node1", [str(BIN / "hvdsync"), *argv], cwd=ROOT, env=self.env(**env),
                              timeout=timeout)


@pytest.fixture(scope="session")
def ray_cluster():
    if importlib.util.find_spec("ray") is None:
        pytest.skip(NO_RAY)
    why = unavailable()
    if why:
        pytest.skip(f"no test hosts for the Ray nodes: {why}")
    # A prefix and subnet of this session's own: tests/hosts' hosts and a user's `testhosts up` are never touched.
    hosts = TestHosts(2, prefix=f"hvdray{os.getpid()}", subnet="10.77.3")
    temp = Path(tempfile.mkdtemp(prefix="hvdray-"))  # short: Ray's socket paths must fit in 107 bytes
    cluster = RayCluster(hosts, temp)
    hosts.up()
    try:
        started = time.monotonic()
        cluster.start("node1")
        cluster.start("node2")
        cluster.wait_nodes(2)
        print(f"\nRay cluster of 2 nodes up in {time.monotonic() - started:.1f} s at {cluster.address}")
        yield cluster
    finally:
        cluster.stop()
        hosts.down()
        shutil.rmtree(temp, ignore_errors=True)
