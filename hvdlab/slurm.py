"""A real Slurm cluster on test hosts: ``slurmctld`` on the first host, one ``slurmd`` per host, and munge.

The hosts are :class:`hvdlab.testhosts.TestHosts` (network namespaces with their own address, host name and sshd),
so Slurm's daemons and the job steps they start see separate machines: ``srun`` starts each task through the
``slurmd`` of its node, and an MPI job started with ``srun --mpi=pmix`` gets its ranks from Slurm, not over ssh.

Nothing outside the cluster's own folder is used or changed: the configuration (``slurm.conf``, ``cgroup.conf``) is
found through ``SLURM_CONF`` (every Slurm command and daemon honours it, and jobs inherit it from ``sbatch``), and
munge runs as a daemon of this cluster on its own socket and key in that folder, named by ``AuthInfo``; the system's
``/etc/slurm``, ``/etc/munge`` and ``/run/munge`` are not touched. :meth:`SlurmCluster.down` stops the daemons by
their process ids and removes the folder.

What it took (Debian 12's slurm-wlm 22.05 and munge 0.5.15): ``cgroup.conf`` names cgroup v1 explicitly (under
autodetect slurmd stops with "No filesystem mounted on /sys/fs/cgroup" where the cgroup hierarchies sit under a
tmpfs), the spool folders exist before slurmd starts, and ``proctrack/linuxproc`` with ``task/none`` (no cgroups
needed to track or bind tasks).

Try it by hand (root, Linux, ``slurm-wlm``, ``munge``)::

    python -m hvdlab.testhosts up --hosts 2 --subnet 10.77.5
    python -m hvdlab.slurm up          # prints SLURM_CONF, and how to run Slurm's commands on a host
    python -m hvdlab.testhosts shell node1 -- env SLURM_CONF=... srun -N2 -n4 hostname
    python -m hvdlab.slurm down; python -m hvdlab.testhosts down
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from hvdlab.testhosts import TestHosts, _wait_gone, unavailable as hosts_unavailable

DAEMONS = ("/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/sbin/munged")
COMMANDS = ("sbatch", "srun", "squeue", "scancel", "sinfo", "sacct", "scontrol", "munge")
# Where Debian's slurm-wlm keeps its plugins (mpi_pmix.so, mpi_pmi2.so).
PLUGIN_DIRS = ("/usr/lib/x86_64-linux-gnu/slurm-wlm", "/usr/lib/aarch64-linux-gnu/slurm-wlm", "/usr/lib64/slurm",
               "/usr/lib/slurm")


def unavailable() -> str | None:
    """Why a Slurm cluster cannot be made here, in one line; None when it can."""
    why = hosts_unavailable()
    if why:
        return why
    missing = [d for d in DAEMONS if not os.path.exists(d)] + [c for c in COMMANDS if shutil.which(c) is None]
    if missing:
        return (f"a Slurm cluster needs {', '.join(missing)} (Debian: apt-get install slurm-wlm munge); "
                "`make test` installs them where it runs as root")
    return None


def mpi_plugins() -> list[str]:
    """The MPI plugin types this machine's Slurm has (``srun --mpi=<type>``), from its plugin files."""
    for folder in PLUGIN_DIRS:
        found = sorted(re.sub(r"^mpi_(.*)\.so$", r"\1", p.name) for p in Path(folder).glob("mpi_*.so"))
        if found:
            return found
    return []


class SlurmCluster:
    """Slurm over ``hosts`` (up already): controller on the first host, a ``slurmd`` on each, ``cpus`` per node.

    Example:
        >>> with TestHosts(2, subnet="10.77.5") as hosts, SlurmCluster(hosts) as slurm:     # doctest: +SKIP
        ...     slurm.run(["srun", "-N2", "-n4", "hostname"]).stdout
        'node1\\nnode1\\nnode2\\nnode2\\n'
    """

    def __init__(self, hosts: TestHosts, cpus: int = 2, name: str = "hvdlab") -> None:
        self.hosts, self.cpus, self.name = hosts, cpus, name
        self.dir = hosts.dir / "slurm"
        self.conf = self.dir / "slurm.conf"
        self.munge_socket = self.dir / "munge" / "munge.socket"
        self.pids: dict[str, int] = {}   # daemon ("munged", "slurmctld", "slurmd-node1", ...) -> pid
        self._procs: dict[str, subprocess.Popen] = {}

    @property
    def env(self) -> dict[str, str]:
        """What Slurm's commands need in their environment to reach this cluster."""
        return {"SLURM_CONF": str(self.conf)}

    def run(self, command: list[str], host: str | None = None, **kw) -> subprocess.CompletedProcess:
        """Run ``command`` on ``host`` (default: the controller's host) with this cluster's ``SLURM_CONF``."""
        kw["env"] = {**(kw.get("env") or os.environ), **self.env}
        return self.hosts.run(host or self.hosts.hosts[0].name, command, **kw)

    # -- making and unmaking -----------------------------------------------------------------------------------
    def up(self) -> SlurmCluster:
        why = unavailable()
        if why:
            raise RuntimeError(why)
        if self.dir.exists():
            raise RuntimeError(f"a Slurm cluster is up already on these hosts ({self.dir})")
        (self.dir / "munge").mkdir(parents=True, mode=0o755)
        try:
            self._make()
        except BaseException:
            self.down()
            raise
        (self.dir / "pids.json").write_text(json.dumps(self.pids))
        return self

    def _make(self) -> None:
        self._write_conf()
        key = self.dir / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        # Its own socket, key, log and seed: the system's munge (if any) is left as it is. --force: munged runs as
        # root here, which it refuses otherwise.
        munge = self.dir / "munge"
        self._start("munged", ["/usr/sbin/munged", "--foreground", "--force", f"--socket={self.munge_socket}",
                               f"--key-file={key}", f"--pid-file={munge / 'munged.pid'}",
                               f"--seed-file={munge / 'munged.seed'}", f"--log-file={munge / 'munged.log'}"],
                    host=None)
        self._wait(lambda: self.munge_socket.exists(), "munged's socket")
        first = self.hosts.hosts[0].name
        # -i: ignore a state folder's leftovers (there are none: the folder is new); -D: stay in the foreground, so
        # the pid is the daemon's.
        self._start("slurmctld", ["/usr/sbin/slurmctld", "-D", "-i", "-f", str(self.conf)], host=first)
        for h in self.hosts.hosts:
            (self.dir / f"d-{h.name}").mkdir()
            (self.dir / f"tmp-{h.name}").mkdir()
            self._start(f"slurmd-{h.name}", ["/usr/sbin/slurmd", "-D", "-N", h.name, "-f", str(self.conf)],
                        host=h.name)
        names = {h.name for h in self.hosts.hosts}
        self._wait(lambda: self._idle() == names, "every node idle in sinfo", timeout=60)

    def _write_conf(self) -> None:
        d, first = self.dir, self.hosts.hosts[0]
        nodes = "".join(f"NodeName={h.name} NodeAddr={h.address} CPUs={self.cpus} State=UNKNOWN\n"
                        for h in self.hosts.hosts)
        names = ",".join(h.name for h in self.hosts.hosts)
        self.conf.write_text(
            f"ClusterName={self.name}\n"
            f"SlurmctldHost={first.name}({first.address})\n"
            "SlurmUser=root\nSlurmdUser=root\n"
            "AuthType=auth/munge\nCredType=cred/munge\n"
            f"AuthInfo=socket={self.munge_socket}\n"
            "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n"
            "SelectType=select/cons_tres\nSelectTypeParameters=CR_CPU\n"
            "MpiDefault=none\nReturnToService=2\n"
            # Short timers: a cancelled job's node is free again in seconds, not minutes.
            "SlurmdTimeout=30\nInactiveLimit=0\nMinJobAge=30\nKillWait=5\nWaitTime=0\n"
            f"StateSaveLocation={d}/state\nSlurmdSpoolDir={d}/d-%n\n"
            # The pmix plugin makes each step's client folder under TmpFS, named by job and step only: with /tmp
            # shared by the hosts (as here, and on clusters whose /tmp is a shared file system) the second node
            # finds the first one's and the step fails ("Cannot create directory ... File exists"). %n: one per node.
            f"TmpFS={d}/tmp-%n\n"
            f"SlurmctldPidFile={d}/slurmctld.pid\nSlurmdPidFile={d}/slurmd-%n.pid\n"
            f"SlurmctldLogFile={d}/slurmctld.log\nSlurmdLogFile={d}/slurmd-%n.log\n"
            "SlurmctldDebug=info\nSlurmdDebug=info\n"
            "JobCompType=jobcomp/none\nAccountingStorageType=accounting_storage/none\n"
            "JobAcctGatherType=jobacct_gather/none\n"
            f"{nodes}PartitionName=test Nodes={names} Default=YES MaxTime=INFINITE State=UP\n")
        (d / "state").mkdir()
        # Beside slurm.conf, where Slurm looks for it. cgroup v1 named, not detected (see the module's docstring).
        (d / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\nCgroupMountpoint=/sys/fs/cgroup\n"
                                       "CgroupAutomount=no\n")

    def _start(self, name: str, command: list[str], host: str | None) -> None:
        log = open(self.dir / f"{name}.out", "ab")
        argv = self.hosts.argv(host, command) if host else command
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
                                env={**os.environ, **self.env})
        log.close()
        self.pids[name] = proc.pid
        self._procs[name] = proc

    def _idle(self) -> set[str]:
        for name, proc in self._procs.items():
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited ({proc.returncode}): {self._log_tail(name)}")
        out = self.run(["sinfo", "-h", "-N", "-o", "%N %t"], timeout=20)
        return {line.split()[0] for line in out.stdout.splitlines() if line.split()[1:] == ["idle"]}

    def _log_tail(self, name: str) -> str:
        texts = []
        for path in (self.dir / f"{name}.out", self.dir / f"{name}.log"):
            with contextlib.suppress(OSError):
                texts.append(path.read_text(errors="replace")[-600:])
        return " | ".join(t.strip() for t in texts if t.strip()) or "(no log)"

    @staticmethod
    def _wait(ready, what: str, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}")
            time.sleep(0.2)

    def down(self) -> None:
        """Stop every daemon (slurmd first, munged last) and remove the cluster's folder; safe to call twice."""
        for name in sorted(self.pids, key=lambda n: (n == "munged", n == "slurmctld")):
            pid = self.pids[name]
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            _wait_gone(pid, timeout=10)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            _wait_gone(pid)
        for proc in self._procs.values():
            proc.poll()  # reaped: no zombie left in a long test session
        self.pids, self._procs = {}, {}
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> SlurmCluster:
        return self.up()

    def __exit__(self, *exc) -> None:
        self.down()

    # -- jobs ------------------------------------------------------------------------------------------------
    def sbatch(self, argv: list[str], **kw) -> int:
        """Submit ``sbatch --parsable <argv>`` from the controller's host; returns the job id."""
        out = self.run(["sbatch", "--parsable", *argv], timeout=60, **kw)
        if out.returncode != 0:
            raise RuntimeError(f"sbatch {' '.join(argv)} failed ({out.returncode}): {out.stderr.strip()}")
        return int(out.stdout.strip().split(";")[0])

    def state(self, job: int) -> str:
        """The job's state (``PENDING``, ``RUNNING``, ``COMPLETED``, ``CANCELLED``, ``FAILED``...) from
        ``scontrol show job`` while the controller remembers it (``MinJobAge``), ``GONE`` once it says it does not, and
        ``UNKNOWN`` while it does not answer."""
        try:
            out = self.run(["scontrol", "-o", "show", "job", str(job)], timeout=20)
        except subprocess.TimeoutExpired:
            # slurmctld holds its job lock while it launches or reaps a step; on 2 loaded cores one answer has
            # taken over 20 s. The job's state is then unknown, not gone: the caller polls again.
            return "UNKNOWN"
        match = re.search(r"\bJobState=(\S+)", out.stdout)
        if match:
            return match[1]
        # Only the controller saying it no longer knows the job means gone; a controller that did not answer
        # ("Unable to contact slurm controller", a socket timeout) says nothing about the job.
        return "GONE" if "invalid job id" in out.stderr.lower() else "UNKNOWN"

    def wait(self, job: int, timeout: float = 300, until=("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT",
                                                              "NODE_FAIL", "OUT_OF_MEMORY", "GONE")) -> str:
        """Poll until the job reaches a state in ``until``; returns it (``scancel`` it and raise on timeout)."""
        deadline = time.monotonic() + timeout
        while True:
            state = self.state(job)
            if state in until:
                return state
            if time.monotonic() > deadline:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self.run(["scancel", str(job)], timeout=20)
                raise RuntimeError(f"job {job} still {state} after {timeout:.0f} s; cancelled")
            time.sleep(0.5)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hvdlab.slurm", description=__doc__.split("\n\n")[0])
    parser.add_argument("--prefix", default="hvdsync", help="the test hosts' prefix (default: hvdsync)")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("up", help="start Slurm on the test hosts that `python -m hvdlab.testhosts up` made")
    sub.add_parser("down", help="stop it and remove its folder")
    args = parser.parse_args(argv)
    try:
        hosts = TestHosts.load(args.prefix)
        slurm = SlurmCluster(hosts)
        if args.command == "up":
            slurm.up()
            print(f"SLURM_CONF={slurm.conf}\nrun on a host: python -m hvdlab.testhosts shell node1 -- "
                  f"env SLURM_CONF={slurm.conf} srun -N{len(hosts.hosts)} hostname")
        else:
            pids = slurm.dir / "pids.json"
            slurm.pids = json.loads(pids.read_text()) if pids.exists() else {}
            slurm.down()
    except (RuntimeError, ValueError) as exc:
        print(f"hvdlab.slurm: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
