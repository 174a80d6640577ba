"""A Ray cluster of two nodes for the session: ``ray start --head`` on test host node1, ``ray start --address`` on
node2 (network namespaces with their own address, host name and /etc/hosts: :mod:`hvdlab.testhosts`), 2 CPUs each; a third
test host, node3, is left for tests that make a cluster of their own.

Why namespaces, not two nodes on loopback: Horovod's elastic Ray discovery keys nodes by address, so two nodes on
127.0.0.1 would be one host to it, and a node whose raylet is killed would take the other's name with it. In a
namespace a node has no route but the test hosts' bridge, so nothing Ray does can reach another address.

Each node runs ``ray start --block`` (the node lives as long as that process; killing its raylet ends it) with a
temp dir of its own (two raylets on one file system would otherwise share socket names) and usage stats off. The
head checks its nodes' health every second so a killed raylet's node is marked dead in about 3 s, not 15-30 s.

Token authentication is on, as Ray is making it the default for every cluster: the nodes run with ``RAY_AUTH_MODE=token``
and a token of this session's own (``RAY_AUTH_TOKEN_PATH``), each with a home of its own. The drivers (``hvdsync
train``, the jobs of tests/ray/ray_jobs.py) run as a user who has that token where Ray keeps it, ``~/.ray/auth_token``
of their own home, with no ``RAY_AUTH_*`` variable set: hvdsync has to find it there as Ray's own clients do. Nothing
reads or writes the home of whoever runs the tests (``~/.ray`` among it): every process started here gets a home under
this session's temp dir, and ``RAY_AUTH_*`` of the caller's environment is never passed on.

Skipped with one line where Ray is not installed (``pip install 'hvdsync[ray]'``) or test hosts cannot be made.
"""
import contextlib
import importlib.util
import json
import os
import shutil
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

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


AUTH_ENV = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")


def clean_env(home: Path, **extra) -> dict:
    """This process's environment for a Ray process of the tests: ``home`` as its home, no ``RAY_AUTH_*`` of the
    caller's, the venv's tools first on PATH, usage stats off."""
    env = {k: v for k, v in os.environ.items() if k not in AUTH_ENV}
    return {**env, "HOME": str(home), "PATH": f"{BIN}:{os.environ.get('PATH', '')}", "TF_CPP_MIN_LOG_LEVEL": "2",
            "RAY_USAGE_STATS_ENABLED": "0", **extra}


def user_home(path: Path, token: str | None) -> Path:
    """A home as a Ray user's: ``~/.ray/auth_token`` holding ``token`` (None: no such file)."""
    (path / ".ray").mkdir(parents=True, exist_ok=True)
    if token is not None:
        (path / ".ray" / "auth_token").write_text(token + "\n")
    return path


def reap(proc: subprocess.Popen, timeout: float = 20) -> None:
    """Wait for a `ray start --block` told to stop (SIGTERM: it stops its node's processes); its whole process
    group killed where it has not ended in ``timeout`` s."""
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _result(returncode: int, output: str, shown: str) -> dict:
    """The ``RESULT <json>`` line of a tests/ray/ray_jobs.py driver that exited 0; ``shown`` where it did not."""
    line = next((x for x in output.splitlines() if x.startswith("RESULT ")), None)
    assert returncode == 0 and line, shown
    return json.loads(line[len("RESULT "):])


class RayCluster:
    """The nodes, by test host; :meth:`kill_raylet` and :meth:`start` change them while a job runs."""

    def __init__(self, hosts: TestHosts, temp: Path) -> None:
        self.hosts, self.temp = hosts, temp
        self.address = f"{hosts.host('node1').address}:{PORT}"
        self.nodes: dict[str, subprocess.Popen] = {}
        self.token = secrets.token_hex(16)   # this cluster's own: never the runner's ~/.ray/auth_token
        self.token_file = temp / "cluster-token"
        self.token_file.write_text(self.token)
        self.node_home = user_home(temp / "node-home", None)
        self.user_home = user_home(temp / "user-home", self.token)

    def env(self, **extra) -> dict:
        """A driver's environment: the cluster's token only in its home's ~/.ray/auth_token (``HOME=`` in ``extra``
        gives another home)."""
        return clean_env(self.user_home, **extra)

    def node_env(self, **extra) -> dict:
        return clean_env(self.node_home, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(self.token_file), **extra)

    def start(self, name: str) -> None:
        head = name == "node1"
        argv = [str(BIN / "ray"), "start", "--block", f"--node-ip-address={self.hosts.host(name).address}",
                f"--num-cpus={CPUS}", "--num-gpus=0", f"--temp-dir={self.temp / name}", "--disable-usage-stats",
                "--object-store-memory=100000000"]
        argv += ["--head", f"--port={PORT}", "--include-dashboard=false"] if head else [f"--address={self.address}"]
        log = open(self.temp / f"{name}.log", "ab")
        self.nodes[name] = self.hosts.popen(name, argv, cwd=ROOT, env=self.node_env(**(HEAD_ENV if head else {})),
                                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()

    def wait_nodes(self, count: int, timeout: float = 90) -> None:
        """Until ``count`` nodes are alive (asked of the head from node1)."""
        code = ("import ray, sys, time; ray.init(address=sys.argv[1], logging_level='ERROR'); t = time.time()\n"
                "while sum(n['Alive'] for n in ray.nodes()) != int(sys.argv[2]):\n"
                "    assert time.time() - t < float(sys.argv[3]), ray.nodes(); time.sleep(0.2)\n")
        out = self.hosts.run("node1", [sys.executable, "-c", code, self.address, str(count), str(timeout)],
                             cwd=ROOT, env=self.node_env(), timeout=timeout + 30)
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
            reap(proc)
        self.nodes = {}

    def logs(self) -> str:
        return "".join(f"--- {p.name}\n{p.read_text(errors='replace')[-2000:]}\n" for p in self.temp.glob("*.log"))

    def drive(self, spec: dict, timeout: float = 300, **env) -> dict:
        """Run tests/ray/ray_jobs.py's driver on node1 with ``spec``; returns its result."""
        out = self.hosts.run("node1", [sys.executable, "-m", "tests.ray.ray_jobs", json.dumps(spec)], cwd=ROOT,
                             env=self.env(**env), timeout=timeout)
        return _result(out.returncode, out.stdout, out.stdout[-3000:] + out.stderr[-5000:])

    @contextlib.contextmanager
    def driving(self, spec: dict, log_path: Path, **env) -> Iterator[subprocess.Popen]:
        """tests/ray/ray_jobs.py's driver on node1 while the block changes the cluster under it; its output goes to
        ``log_path`` (printed with the nodes' logs where the block fails), and it is killed if still running after.
        :meth:`outcome` reads its result once it has ended."""
        with open(log_path, "w") as log:
            job = self.hosts.popen("node1", [sys.executable, "-m", "tests.ray.ray_jobs", json.dumps(spec)], cwd=ROOT,
                                   env=self.env(**env), stdout=log, stderr=subprocess.STDOUT, text=True)
            try:
                yield job
            except BaseException:
                log.flush()
                print(log_path.read_text()[-5000:] + self.logs(), file=sys.stderr)
                raise
            finally:
                if job.poll() is None:
                    job.kill()
                    job.wait()

    @staticmethod
    def outcome(job: subprocess.Popen, log_path: Path) -> dict:
        text = log_path.read_text()
        return _result(job.returncode, text, text[-5000:])

    def hvdsync(self, *argv: str, timeout: float = 300, cwd: Path = ROOT, **env) -> subprocess.CompletedProcess:
        """``hvdsync ...`` on node1 (text output), in ``cwd`` (MLflow puts a sqlite store's artifacts in its
        ``./mlruns``)."""
        return self.hosts.run("node1", [str(BIN / "hvdsync"), *argv], cwd=cwd, env=self.env(**env),
                              timeout=timeout)

    def refused(self, *argv: str, tracking_uri: str | None = None, **env) -> str:
        """An `hvdsync train` on node1 that must stop before any worker starts: exit status 2, one line on stderr,
        nothing on stdout; returns the line. Untracked unless ``tracking_uri`` is given."""
        track = ["--tracking-uri", tracking_uri] if tracking_uri else ["--no-track"]
        out = self.hvdsync("train", *track, *argv, timeout=120, **env)
        assert out.returncode == 2, out.stdout[-2000:] + out.stderr[-2000:]
        lines = [x for x in out.stderr.splitlines() if x.strip()]
        assert len(lines) == 1 and not out.stdout.strip(), out.stdout[-2000:] + out.stderr[-2000:]
        return lines[0]


@pytest.fixture(scope="session")
def ray_cluster():
    if importlib.util.find_spec("ray") is None:
        pytest.skip(NO_RAY)
    why = unavailable()
    if why:
        pytest.skip(f"no test hosts for the Ray nodes: {why}")
    # A prefix and subnet of this session's own: tests/hosts' hosts and a user's `testhosts up` are never touched.
    # node3 is not part of this cluster: tests/ray/test_ray_auth.py runs a cluster without authentication there.
    hosts = TestHosts(3, prefix=f"hvdray{os.getpid()}", subnet="10.77.3")
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
