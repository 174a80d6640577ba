"""Can the job reach its hosts? One ssh per remote host, all at once, before any worker starts.

Horovod's own launcher finds an unreachable host too, but late and loudly: after seconds of its own start-up, as
``ssh ... returned non-zero`` lines or a Gloo timeout minutes later, and a missing interface only as a rendezvous that
never completes. Here each host gets one short ssh (the options Horovod will use: port, key, no password prompt) that
lists its network interfaces, so each failure is one line naming the host and what to do:

* the name does not resolve;
* ssh cannot connect (no route, timed out) or is refused (no sshd on that port), or the key is not accepted;
* an interface given with ``--network-interface`` is missing on some hosts (with what they do have).

Hosts that are this machine (by address, as Horovod decides which hosts it starts without ssh) are checked locally.
"""
from __future__ import annotations

import socket
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from hvdsync.config import ConfigError
from hvdsync.launch.hosts import Host

# Seconds ssh may take to connect to one host (Horovod's own check allows 10 per attempt).
CONNECT_TIMEOUT_S = 10
_LIST_INTERFACES = "ls /sys/class/net"


def local_addresses() -> set[str]:
    """This machine's IPv4 addresses: a host resolving to one of them is started without ssh (Horovod's rule)."""
    import psutil

    return {a.address for addrs in psutil.net_if_addrs().values() for a in addrs if a.family == socket.AF_INET}


def local_interfaces() -> list[str]:
    import psutil

    return sorted(psutil.net_if_addrs())


def _hint(stderr: str, name: str, ssh_port: int | None) -> str:
    port = ssh_port or 22
    if "Connection refused" in stderr:
        return f"nothing listens for ssh on port {port} of {name}: start sshd there, or give its port (--ssh-port)"
    if "Permission denied" in stderr:
        return (f"{name} does not accept this machine's ssh key: give the key it accepts (--ssh-identity-file) or "
                f"add this key to ~/.ssh/authorized_keys on {name}")
    return f"check that {name} is up and reachable from this machine on port {port}"


def _ssh(name: str, ssh_port: int | None, identity: str | None, timeout: int) -> subprocess.CompletedProcess:
    # BatchMode: fail instead of asking for a password, as Horovod's launcher (which has no terminal) would.
    # StrictHostKeyChecking=no: what Horovod's own ssh uses, so a host ssh has not seen yet passes here as there.
    argv = ["ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no", "-o", f"ConnectTimeout={timeout}"]
    if ssh_port is not None:
        argv += ["-p", str(ssh_port)]
    if identity is not None:
        argv += ["-i", identity]
    try:
        return subprocess.run([*argv, name, _LIST_INTERFACES], capture_output=True, text=True, timeout=timeout + 20,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(argv, 255, "", f"ssh to {name} did not finish in {timeout + 20} s")


def check_hosts(hosts: list[Host], ssh_port: int | None = None, ssh_identity_file: str | None = None,
                network_interfaces: list[str] | None = None, timeout: int = CONNECT_TIMEOUT_S) -> None:
    """Raise :class:`ConfigError` naming the first host that cannot run workers, and why (the module docstring).

    Returns quietly when every host is this machine and no interface was named (a local job: no ssh at all).
    """
    if ssh_identity_file is not None and not Path(ssh_identity_file).is_file():
        raise ConfigError(f"ssh_identity_file: {ssh_identity_file!r} is not a file; give the private key the hosts "
                          "accept")
    mine = local_addresses()
    resolved: dict[str, str] = {}
    for host in hosts:
        try:
            resolved[host.name] = socket.gethostbyname(host.name)
        except OSError as exc:
            raise ConfigError(f"hosts: {host.name!r} does not resolve to an address ({exc.strerror or exc}); check "
                              "the name, or add it to DNS or /etc/hosts on this machine") from None
    remote = [h.name for h in hosts if resolved[h.name] not in mine]
    interfaces: dict[str, list[str]] = {}
    if len(remote) < len(hosts) and network_interfaces:
        interfaces["this machine"] = local_interfaces()
    if remote:
        with ThreadPoolExecutor(max_workers=min(32, len(remote))) as pool:
            outcomes = dict(zip(remote, pool.map(lambda n: _ssh(n, ssh_port, ssh_identity_file, timeout), remote)))
        for name, out in outcomes.items():
            if out.returncode != 0:
                said = (out.stderr.strip().splitlines() or [f"exit status {out.returncode}"])[-1]
                raise ConfigError(f"hosts: cannot run workers on {name} ({resolved[name]}) over ssh: {said}; "
                                  f"{_hint(out.stderr, name, ssh_port)}")
            interfaces[name] = out.stdout.split()
    for wanted in network_interfaces or []:
        missing = [where for where, have in interfaces.items() if wanted not in have]
        if missing:
            have = sorted(set.intersection(*(set(v) for v in interfaces.values())))
            raise ConfigError(f"network_interfaces: {wanted!r} is missing on {', '.join(missing)}; the interfaces "
                              f"every host has: {', '.join(have) or 'none in common'} (give one of them, or leave "
                              "--network-interface out and Horovod picks the common ones)")
