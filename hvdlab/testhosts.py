"""Several hosts on one Linux machine, reached over ssh: network namespaces joined by a switch.

Each test host is what a cluster node is to Horovod: its own network stack (a namespace), one interface ``hv0`` with
its own address (the same interface name on every host: Horovod keeps only the names common to all hosts), its own
host name (a UTS namespace), its own ``/etc/hosts`` and an sshd listening on its address. A bridge in a namespace of
its own is the switch, so any number of hosts can talk; ``rate`` puts a token-bucket limit (``tc ... tbf``) on each
host's outgoing link, a NIC of that speed. Everything else (the file system, the venv, the working directory) is
shared, as a cluster's shared file system would be.

Why each host has its own ``/etc/hosts`` and host name: Gloo tells its peers to dial the address the local host name
resolves to. Where a machine maps its own name to loopback (this one maps it to 127.0.0.1; Debian and Ubuntu write
``127.0.1.1 <hostname>``), every peer is told to dial 127.0.0.1 and the job dies with
``gloo::IoException ... connect [127.0.0.1]``. ``ip netns exec NAME`` bind-mounts ``/etc/netns/NAME/hosts`` over
``/etc/hosts``, so each host here maps every test host's name to its address, as a cluster's DNS would.

Nothing is left behind by :meth:`TestHosts.down`: the namespaces with every process in them, ``/etc/netns/<ns>``,
the run folder (the ssh key pair and sshd's host keys are made per run there, never added to ``~/.ssh``), and the
``known_hosts`` lines ssh added for the test hosts' addresses.

Try it by hand (root, Linux, ``iproute2``, ``openssh-server``)::

    python -m hvdlab.testhosts up --hosts 2 --rate 1gbit     # prints the hosts and how to use them
    python -m hvdlab.testhosts shell node1 -- hvdsync train --hosts node1:1,node2:1 \\
        --ssh-identity-file "$(python -m hvdlab.testhosts key)" --network-interface hv0
    python -m hvdlab.testhosts down
"""
from __future__ import annotations

import argparse
import base64
import contextlib
import hashlib
import hmac
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

INTERFACE = "hv0"
SSHD = "/usr/sbin/sshd"
TOOLS = ("ip", "tc", "unshare", "nsenter", "ssh", "ssh-keygen")


def own_link_bytes(interface: str = INTERFACE) -> dict[str, int]:
    """``{"tx_bytes", "rx_bytes"}`` this host has sent and received on ``interface`` so far, read by a process running
    on it (``ip netns exec`` mounts the namespace's own sysfs: these are the test host's counters); zeros where the
    interface is absent."""
    stats = Path("/sys/class/net") / interface / "statistics"
    try:
        return {k: int((stats / k).read_text()) for k in ("tx_bytes", "rx_bytes")}
    except OSError:
        return {"tx_bytes": 0, "rx_bytes": 0}


def venv_env(**extra: str) -> dict[str, str]:
    """This process's environment for a command run on a test host, with this interpreter's folder first on PATH
    (a host's login PATH does not know the venv) and ``extra`` on top."""
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}", **extra}


def unavailable() -> str | None:
    """Why test hosts cannot be made here, in one line; None when they can."""
    if not sys.platform.startswith("linux"):
        return f"test hosts need Linux network namespaces; this is {sys.platform}"
    if os.geteuid() != 0:
        return "test hosts need root (ip netns, veth links, sshd); run as root"
    missing = [t for t in TOOLS if shutil.which(t) is None] + ([] if os.path.exists(SSHD) else [SSHD])
    if missing:
        return (f"test hosts need {', '.join(missing)} (Debian: apt-get install iproute2 openssh-server "
                f"openssh-client util-linux); `make test` installs them where it runs as root")
    probe = f"hvdsync-probe-{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"`ip netns add` failed here ({made.stderr.strip()}): no network namespaces on this kernel or container"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


@dataclass(frozen=True)
class Host:
    name: str        # its host name, and the name the other hosts know it by
    namespace: str   # its network namespace
    address: str     # the address of its interface hv0


def _run(argv: list[str], check: bool = True, **kw) -> subprocess.CompletedProcess:
    out = subprocess.run(argv, capture_output=True, text=True, **kw)
    if check and out.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({out.returncode}): {out.stderr.strip() or out.stdout.strip()}")
    return out


def _split(cpus: list[int], n: int) -> list[set[int]]:
    """``n`` hosts' shares of ``cpus``: disjoint and even where there are at least n, else one CPU each, reused."""
    if len(cpus) < n:
        return [{cpus[i % len(cpus)]} for i in range(n)]
    return [set(cpus[i * len(cpus) // n:(i + 1) * len(cpus) // n]) for i in range(n)]


def rate_bits(rate: str) -> float:
    """Bits per second of a tc rate ('1gbit', '100mbit', '500kbit', '8000bit')."""
    for unit, scale in {"kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "bit": 1}.items():
        if rate.endswith(unit):
            try:
                return float(rate[: -len(unit)]) * scale
            except ValueError:
                break
    raise ValueError(f"rate: {rate!r} is not allowed; expected a number with kbit, mbit or gbit, e.g. '1gbit'")


def _burst(rate: str) -> str:
    """A tbf burst for ``rate``: 10 ms worth of the rate, at least 32 KiB (the bucket must hold more than one timer
    tick's worth, or tbf cannot reach the rate)."""
    return f"{max(32 * 1024, int(rate_bits(rate) / 8 / 100))}b"


class TestHosts:
    """``n`` test hosts ``node1`` .. ``nodeN`` at ``<subnet>.1`` .. ``<subnet>.N``; a context manager.

    Example:
        >>> with TestHosts(2, rate="1gbit") as cluster:                                       # doctest: +SKIP
        ...     cluster.run("node1", ["hvdsync", "train", "--hosts", cluster.hosts_arg(1), *cluster.ssh_args()])
    """

    __test__ = False  # not a pytest test class, despite its name

    def __init__(self, n: int = 2, prefix: str = "hvdsync", subnet: str = "10.77.0", rate: str | None = None,
                 ssh_port: int = 22, run_dir: str | Path | None = None, split_cpus: bool = False) -> None:
        if not isinstance(n, int) or not 1 <= n <= 200:
            raise ValueError(f"n: {n!r} is not allowed; expected 1 to 200 hosts")
        # split_cpus: each host's sshd, and so everything started on the host over ssh, may run only on its own share
        # of this machine's CPUs, as on separate machines (their workers then size their thread pools to it, and do
        # not fight over the same cores).
        self.cpus = _split(sorted(os.sched_getaffinity(0)), n) if split_cpus else None
        if rate is not None:
            _burst(rate)
        self.prefix, self.rate, self.ssh_port = prefix, rate, ssh_port
        self.hosts = [Host(f"node{i}", f"{prefix}-node{i}", f"{subnet}.{i}") for i in range(1, n + 1)]
        self.switch = f"{prefix}-switch"
        self.dir = Path(run_dir) if run_dir else Path(tempfile.gettempdir()) / f"hvdsync-testhosts-{prefix}"
        self.holders: dict[str, int] = {}   # host -> pid of the process that holds its UTS namespace (host name)
        self.sshd: dict[str, int] = {}      # host -> sshd pid
        self._known_before: list[str] = _known_hosts_lines()  # lines of ~/.ssh/known_hosts that down() keeps

    # -- what users and tests need ---------------------------------------------------------------------------
    @property
    def key(self) -> Path:
        """The private key that every test host accepts (``--ssh-identity-file``)."""
        return self.dir / "id_ed25519"

    def host(self, name: str) -> Host:
        for h in self.hosts:
            if h.name == name:
                return h
        raise KeyError(f"no test host {name!r}; there are {', '.join(h.name for h in self.hosts)}")

    def hosts_arg(self, slots: int, names: list[str] | None = None) -> str:
        """Horovod's ``-H``: ``node1:2,node2:2``."""
        return ",".join(f"{h}:{slots}" for h in (names or [h.name for h in self.hosts]))

    def ssh_args(self) -> list[str]:
        """hvdsync train's options to reach the test hosts."""
        return ["--ssh-identity-file", str(self.key), "--ssh-port", str(self.ssh_port),
                "--network-interface", INTERFACE]

    def argv(self, name: str, command: list[str]) -> list[str]:
        """``command`` as run on host ``name`` (its network, its /etc/hosts, its host name)."""
        h = self.host(name)
        return ["ip", "netns", "exec", h.namespace, "nsenter", f"--uts=/proc/{self.holders[name]}/ns/uts", "--",
                *command]

    def run(self, name: str, command: list[str], **kw) -> subprocess.CompletedProcess:
        """Run ``command`` on host ``name`` and wait (``subprocess.run``'s keywords; text output by default)."""
        kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        return subprocess.run(self.argv(name, command), **self._pinned(name, kw))

    def popen(self, name: str, command: list[str], **kw) -> subprocess.Popen:
        return subprocess.Popen(self.argv(name, command), **self._pinned(name, kw))

    def _pinned(self, name: str, kw: dict) -> dict:
        # With split_cpus, a command run here directly (not over ssh) runs on the host's cores too: a job's launcher
        # on node1 starts its local worker without ssh, and that worker would otherwise run on every core.
        cpus = self.cpus[self.hosts.index(self.host(name))] if self.cpus else None
        if cpus and "preexec_fn" not in kw:
            kw["preexec_fn"] = lambda: os.sched_setaffinity(0, cpus)
        return kw

    def link_bytes(self, name: str) -> dict[str, int]:
        """Bytes and packets host ``name`` sent and received on hv0 since it was made (the link's own counters)."""
        out = _run(["ip", "-n", self.host(name).namespace, "-s", "-j", "link", "show", "dev", INTERFACE])
        stats = json.loads(out.stdout)[0]["stats64"]
        return {"tx_bytes": stats["tx"]["bytes"], "rx_bytes": stats["rx"]["bytes"],
                "tx_packets": stats["tx"]["packets"], "rx_packets": stats["rx"]["packets"]}

    def set_rate(self, rate: str | None) -> None:
        """Limit every host's outgoing link to ``rate`` (None: no limit)."""
        burst = _burst(rate) if rate else None
        for h in self.hosts:
            if rate:
                _run(["tc", "-n", h.namespace, "qdisc", "replace", "dev", INTERFACE, "root", "tbf", "rate", rate,
                      "burst", burst, "latency", "100ms"])
            else:
                _run(["tc", "-n", h.namespace, "qdisc", "del", "dev", INTERFACE, "root"], check=False)
        self.rate = rate

    def processes(self, name: str) -> list[int]:
        """Pids of every process on host ``name`` (its namespace), sshd and the host-name holder included."""
        out = _run(["ip", "netns", "pids", self.host(name).namespace], check=False)
        return [int(p) for p in out.stdout.split()]

    def lose(self, name: str) -> None:
        """Take host ``name`` off the cluster as a crash would: every process on it killed (workers, sshd), its
        link down. :meth:`restore` brings it back."""
        for pid in self.processes(name):
            if pid != self.holders.get(name):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        self.sshd.pop(name, None)
        _run(["ip", "-n", self.host(name).namespace, "link", "set", INTERFACE, "down"])

    def restore(self, name: str) -> None:
        """Bring host ``name`` back after :meth:`lose`: link up, sshd started."""
        _run(["ip", "-n", self.host(name).namespace, "link", "set", INTERFACE, "up"])
        self._start_sshd(self.host(name))

    def stop_sshd(self, name: str) -> None:
        """Stop only sshd on host ``name`` (its link stays up: ssh is refused)."""
        pid = self.sshd.pop(name, None)
        if pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            _wait_gone(pid)

    # -- making and unmaking ---------------------------------------------------------------------------------
    def up(self) -> TestHosts:
        why = unavailable()
        if why:
            raise RuntimeError(why)
        taken = [ns for ns in [self.switch, *(h.namespace for h in self.hosts)] if _netns_exists(ns)]
        if taken or self.dir.exists():
            raise RuntimeError(f"test hosts {self.prefix!r} are up already ({', '.join(taken) or self.dir}); "
                               f"`python -m hvdlab.testhosts down --prefix {self.prefix}` takes them down")
        self.dir.mkdir(mode=0o700, parents=True)
        try:
            self._make()
        except BaseException:
            self.down()
            raise
        self._save()
        return self

    def _make(self) -> None:
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "hvdsync-testhosts", "-f", str(self.key)])
        (self.dir / "authorized_keys").write_text(Path(f"{self.key}.pub").read_text())
        _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.dir / "host_key")])
        # sshd's privilege separation folder (Debian's ssh service makes it at boot). Made where missing and never
        # removed: it is the system's, an empty folder, and another session's sshd may be starting with it.
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
        _run(["ip", "netns", "add", self.switch])
        _run(["ip", "-n", self.switch, "link", "add", "br0", "type", "bridge"])
        _run(["ip", "-n", self.switch, "link", "set", "br0", "up"])
        names = "".join(f"{h.address} {h.name}\n" for h in self.hosts)
        for i, h in enumerate(self.hosts, 1):
            _run(["ip", "netns", "add", h.namespace])
            etc = Path("/etc/netns") / h.namespace
            etc.mkdir(parents=True, exist_ok=True)
            (etc / "hosts").write_text(f"127.0.0.1 localhost\n{names}")
            _run(["ip", "link", "add", INTERFACE, "netns", h.namespace, "type", "veth", "peer", "name", f"port{i}",
                  "netns", self.switch])
            _run(["ip", "-n", self.switch, "link", "set", f"port{i}", "master", "br0", "up"])
            _run(["ip", "-n", h.namespace, "addr", "add", f"{h.address}/24", "dev", INTERFACE])
            _run(["ip", "-n", h.namespace, "link", "set", INTERFACE, "up"])
            _run(["ip", "-n", h.namespace, "link", "set", "lo", "up"])
            # A process that only holds this host's UTS namespace, with its host name set: everything run on the
            # host (sshd, and through it Horovod's workers) joins it.
            # Like every process that outlives `up`, it holds none of the caller's stdio: an inherited stdout would
            # keep `python -m hvdlab.testhosts up | tail` waiting for an end of file that never comes.
            with open(self.dir / f"holder-{h.name}.log", "ab") as log:
                holder = subprocess.Popen(["ip", "netns", "exec", h.namespace, "unshare", "--uts", "sh", "-c",
                                           f"hostname {h.name} && exec sleep infinity"], start_new_session=True,
                                          stdin=subprocess.DEVNULL, stdout=log, stderr=log)
            self.holders[h.name] = holder.pid
            _wait_for(lambda pid=holder.pid, name=h.name: _uts_name(pid) == name, f"host name of {h.name}")
            self._start_sshd(h)
        if self.rate:
            self.set_rate(self.rate)

    def _start_sshd(self, h: Host) -> None:
        options = {"ListenAddress": h.address, "Port": str(self.ssh_port), "HostKey": str(self.dir / "host_key"),
                   "AuthorizedKeysFile": str(self.dir / "authorized_keys"), "PidFile": "none", "UsePAM": "no",
                   "StrictModes": "no", "PermitRootLogin": "prohibit-password", "PasswordAuthentication": "no",
                   "KbdInteractiveAuthentication": "no", "MaxStartups": "200", "MaxSessions": "200",
                   "LogLevel": "ERROR"}
        command = [SSHD, "-D", "-f", "/dev/null", *(a for k, v in options.items() for a in ("-o", f"{k}={v}"))]
        log = open(self.dir / f"sshd-{h.name}.log", "ab")
        cpus = self.cpus[self.hosts.index(h)] if self.cpus else None
        proc = subprocess.Popen(self.argv(h.name, command), stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                start_new_session=True,
                                preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None)
        log.close()
        self.sshd[h.name] = proc.pid
        _wait_for(lambda: proc.poll() is not None or self._listening(h), f"sshd on {h.name}")
        if proc.poll() is not None:
            raise RuntimeError(f"sshd on {h.name} exited ({proc.returncode}): "
                               f"{(self.dir / f'sshd-{h.name}.log').read_text()[-500:]}")

    def _listening(self, h: Host) -> bool:
        out = _run(["ip", "netns", "exec", h.namespace, "ss", "-Hltn", f"sport = :{self.ssh_port}"], check=False)
        return h.address in out.stdout

    def down(self) -> None:
        """Take everything down; safe to call twice, and after a half-made :meth:`up`."""
        ours = [*(h.namespace for h in self.hosts), self.switch]
        left = sorted(p.name for p in Path("/run/netns").glob(f"{self.prefix}-node*") if p.name not in ours)
        for ns in [*ours, *left]:  # `left`: hosts of a session that crashed, if it had more than this one
            if _netns_exists(ns):
                pids = _run(["ip", "netns", "pids", ns], check=False).stdout.split()
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError, ValueError):
                        os.kill(int(pid), signal.SIGKILL)
                for pid in pids:
                    _wait_gone(int(pid))
                _run(["ip", "netns", "del", ns], check=False)
            shutil.rmtree(Path("/etc/netns") / ns, ignore_errors=True)
        for pid in self.holders.values():  # outlives its namespace only if `ip netns pids` missed it
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(OSError):
            Path("/etc/netns").rmdir()  # only when empty: someone else's namespaces keep theirs
        _forget_known_hosts({h.address for h in self.hosts} | {h.name for h in self.hosts}, self.ssh_port,
                            keep=set(self._known_before))
        shutil.rmtree(self.dir, ignore_errors=True)
        self.holders, self.sshd = {}, {}

    def __enter__(self) -> TestHosts:
        return self.up()

    def __exit__(self, *exc) -> None:
        self.down()

    # -- a session the CLI keeps between calls ---------------------------------------------------------------
    def _save(self) -> None:
        state = {"hosts": [asdict(h) for h in self.hosts], "switch": self.switch, "rate": self.rate,
                 "ssh_port": self.ssh_port, "holders": self.holders, "sshd": self.sshd,
                 "known_before": self._known_before}
        (self.dir / "state.json").write_text(json.dumps(state, indent=1))

    @classmethod
    def load(cls, prefix: str = "hvdsync") -> TestHosts:
        path = Path(tempfile.gettempdir()) / f"hvdsync-testhosts-{prefix}" / "state.json"
        if not path.exists():
            raise RuntimeError(f"no test hosts {prefix!r} are up (no {path}); `python -m hvdlab.testhosts up`")
        state = json.loads(path.read_text())
        self = cls(len(state["hosts"]), prefix=prefix, rate=state["rate"], ssh_port=state["ssh_port"])
        self.hosts = [Host(**h) for h in state["hosts"]]
        self.holders, self.sshd = state["holders"], state["sshd"]
        self._known_before = state.get("known_before", [])
        return self


def _netns_exists(name: str) -> bool:
    return os.path.exists(f"/run/netns/{name}")


def _uts_name(pid: int) -> str | None:
    out = subprocess.run(["nsenter", f"--uts=/proc/{pid}/ns/uts", "hostname"], capture_output=True, text=True)
    return out.stdout.strip() if out.returncode == 0 else None


def _wait_for(ready, what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.05)


def _wait_gone(pid: int, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        with contextlib.suppress(ChildProcessError):  # reap it where it is our child
            os.waitpid(pid, os.WNOHANG)
        time.sleep(0.02)


def _names_match(field: str, keys: set[str]) -> bool:
    """Whether a known_hosts line's host field names one of ``keys``: plain (``a,b``) or hashed
    (``|1|salt|HMAC-SHA1(salt, name)``, what Debian's default ``HashKnownHosts yes`` writes)."""
    if field.startswith("|1|"):
        try:
            salt, digest = (base64.b64decode(part) for part in field[3:].split("|", 1))
        except ValueError:
            return False
        return any(hmac.compare_digest(hmac.new(salt, k.encode(), hashlib.sha1).digest(), digest) for k in keys)
    return bool(set(field.split(",")) & keys)


def _known_hosts() -> Path:
    # ssh's own ~: the password database's home, not $HOME (which a test suite may point elsewhere).
    return Path(pwd.getpwuid(os.getuid()).pw_dir) / ".ssh" / "known_hosts"


def _known_hosts_lines() -> list[str]:
    path = _known_hosts()
    return path.read_text().splitlines(keepends=True) if path.exists() else []


def _forget_known_hosts(names: set[str], port: int, keep: set[str]) -> None:
    """Remove the lines ssh added to ``~/.ssh/known_hosts`` for the test hosts while they were up (Horovod's ssh
    runs with ``StrictHostKeyChecking=no``, which records every new host). Lines that were there before, such as a
    real host that happens to be called ``node1``, stay."""
    path = _known_hosts()
    lines = _known_hosts_lines()
    keys = names | {f"[{n}]:{port}" for n in names}
    kept = [line for line in lines if line in keep or not _names_match(line.split(" ", 1)[0], keys)]
    if len(kept) != len(lines):
        path.write_text("".join(kept))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hvdlab.testhosts", description=__doc__.split("\n\n")[0])
    parser.add_argument("--prefix", default="hvdsync", help="names of the namespaces (default: hvdsync)")
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="make the test hosts")
    up.add_argument("--hosts", type=int, default=2, help="how many (default: 2)")
    up.add_argument("--rate", help="limit each host's outgoing link, e.g. 1gbit or 100mbit (tc tbf)")
    up.add_argument("--subnet", default="10.77.0", help="the hosts' /24 (default: 10.77.0)")
    sub.add_parser("down", help="take them down, leaving nothing behind")
    sub.add_parser("key", help="print the path of the ssh key the hosts accept")
    shell = sub.add_parser("shell", help="run a command on a host (default: a shell)")
    shell.add_argument("host")
    shell.add_argument("cmd", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    try:
        if args.command == "up":
            cluster = TestHosts(args.hosts, prefix=args.prefix, subnet=args.subnet, rate=args.rate).up()
            for h in cluster.hosts:
                print(f"{h.name}  {h.address}  (namespace {h.namespace})")
            print(f"ssh key: {cluster.key}\nrun on a host: python -m hvdlab.testhosts shell node1 -- <command>\n"
                  f"e.g. ... shell node1 -- hvdsync train --hosts {cluster.hosts_arg(1)} {' '.join(cluster.ssh_args())}")
        elif args.command == "down":
            with contextlib.suppress(RuntimeError):
                TestHosts.load(args.prefix).down()
                return 0
            TestHosts(1, prefix=args.prefix).down()  # whatever a crashed session left
        elif args.command == "key":
            print(TestHosts.load(args.prefix).key)
        else:
            cluster = TestHosts.load(args.prefix)
            cmd = [c for c in args.cmd if c != "--"] or [os.environ.get("SHELL", "/bin/sh")]
            return subprocess.call(cluster.argv(args.host, cmd))
    except (RuntimeError, ValueError, KeyError) as exc:
        print(f"hvdlab.testhosts: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
