"""The test hosts themselves: separate hosts as Horovod sees them, reached over ssh, a rate limit that holds, and
nothing left behind."""
import os
import subprocess
import time
from pathlib import Path

from hvdlab.testhosts import TestHosts, _known_hosts_lines


def test_each_host_has_its_own_name_address_and_hosts_file(cluster, on_host):
    for h in cluster.hosts:
        out = on_host(h.name, ["sh", "-c", "hostname; getent hosts $(hostname); ls /sys/class/net"])
        name, resolved, *ifaces = out.stdout.split("\n", 2)[0:2] + out.stdout.split("\n", 2)[2].split()
        assert name == h.name
        assert resolved.split()[0] == h.address          # its own name resolves to its link, not to loopback
        assert sorted(ifaces) == ["hv0", "lo"]


def test_ssh_between_hosts_lands_on_the_other_host(cluster, on_host):
    ssh = ["ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no", "-i", str(cluster.key)]
    out = on_host("node1", [*ssh, "node2", "hostname; echo $SSH_CONNECTION"], timeout=60)
    assert out.returncode == 0, out.stderr
    name, conn = out.stdout.split("\n")[:2]
    client, _, server, port = conn.split()
    assert (name, client, server, port) == ("node2", cluster.host("node1").address, cluster.host("node2").address,
                                            str(cluster.ssh_port))


def test_rate_limit_holds_on_the_link(cluster, on_host):
    # 8 MB through a 100 Mbit/s link takes >= 0.64 s (timed by the receiver, first byte to the end); unlimited, a
    # veth moves it in a few ms.
    address = cluster.host("node2").address
    server = cluster.popen("node2", ["python3", "-c", (
        "import socket, time; s = socket.create_server(('%s', 5999)); c, _ = s.accept(); n = len(c.recv(1 << 20))\n"
        "t = time.monotonic()\nwhile (b := c.recv(1 << 20)): n += len(b)\nprint(n, time.monotonic() - t)"
        .replace("%s", address))], stdout=subprocess.PIPE, text=True)
    time.sleep(0.5)
    cluster.set_rate("100mbit")
    try:
        before = cluster.link_bytes("node1")["tx_bytes"]
        out = on_host("node1", ["python3", "-c", (
            f"import socket; c = socket.create_connection(('{address}', 5999)); c.sendall(bytes(8_000_000)); "
            "c.close()")], timeout=60)
        assert out.returncode == 0, out.stderr
        received, seconds = server.communicate(timeout=60)[0].split()
    finally:
        cluster.set_rate(None)
        server.kill()
    sent = cluster.link_bytes("node1")["tx_bytes"] - before
    assert int(received) == 8_000_000
    assert 8_000_000 <= sent <= 8_000_000 * 1.1               # payload plus TCP/IP headers, counted by the link
    assert float(seconds) >= 8_000_000 * 8 / 100e6 * 0.85, seconds   # the limit held


def _cpu_list(text: str) -> set[int]:
    """/proc's ``Cpus_allowed_list`` ('0-3,6') as a set."""
    cpus = set()
    for part in text.split(":", 1)[1].strip().split(","):
        low, _, high = part.partition("-")
        cpus.update(range(int(low), int(high or low) + 1))
    return cpus


def test_down_leaves_nothing_behind_and_split_cpus_gives_each_host_its_own_cores():
    before = _known_hosts_lines()
    hosts = TestHosts(2, prefix=f"hvdgone{os.getpid()}", subnet="10.77.2", split_cpus=True).up()
    run_dir, spaces = hosts.dir, [h.namespace for h in hosts.hosts] + [hosts.switch]
    try:
        # A process started on node2 over ssh (as Horovod starts its workers) may run only on node2's share.
        out = hosts.run("node1", ["ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no", "-i",
                                  str(hosts.key), hosts.host("node2").address,
                                  "grep Cpus_allowed_list /proc/self/status"], timeout=60)
        assert out.returncode == 0, out.stderr
        assert _cpu_list(out.stdout) == hosts.cpus[1]
        assert not hosts.cpus[0] & hosts.cpus[1] or len(os.sched_getaffinity(0)) < 2
        assert len(_known_hosts_lines()) == len(before) + 1   # ssh recorded 10.77.2.2 (StrictHostKeyChecking=no)
        sshd = list(hosts.sshd.values())
    finally:
        hosts.down()
    assert not any(Path(f"/run/netns/{ns}").exists() for ns in spaces)
    assert not any(Path(f"/etc/netns/{ns}").exists() for ns in spaces)
    assert not run_dir.exists()
    assert not any(Path(f"/proc/{pid}").exists() and "sshd" in Path(f"/proc/{pid}/cmdline").read_text()
                   for pid in sshd)
    assert set(_known_hosts_lines()) <= set(before)   # and that line is gone again
