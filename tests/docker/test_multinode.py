"""Two containers as two Horovod hosts, over ssh, as in Horovod's multi-node Docker guide (opt-in, `docker` marker:
`pytest -m docker tests/docker/test_multinode.py`; docker/README.md, "Several hosts (multi-node)").

One build of hvdsync:cpu (``docker/build.py``, as tests/docker/test_images.py), a user-defined network, a key pair made
for the test and mounted into two containers that run ``hvdsync-sshd``; then a 4-rank job (2 + 2) from the first
container, once with ``horovodrun`` and the example script, once with ``hvdsync train --hosts``; and once the script of
the Kubernetes launcher (examples/kubernetes/launcher.yaml, its env and user) in a third container that runs no rank,
the two workers standing in for the StatefulSet's pods under their DNS names. Which ranks ran where is read from the
worker processes themselves while the job runs (their HOROVOD_RANK in /proc), not from the launcher. Containers,
network and key are removed however the test ends. The figures are printed for docker/README.md.
"""
import re
import shutil
import subprocess
import threading
import time
import uuid

import pytest
import yaml

from tests.docker.test_images import ROOT, _build, _docker

pytestmark = [pytest.mark.docker, pytest.mark.timeout(7200)]
PORT = 12345            # Horovod's Docker guide uses this port; the image's default for hvdsync-sshd
SLOTS = 2               # ranks per container: 2 containers x 2 = 4 ranks on this 2-core machine
USER = "hvdsync"        # the image's plain user (uid 10001): the only one sshd lets in
KUBERNETES = ROOT / "examples" / "kubernetes"
RESULT = re.compile(r"torch x4: test accuracy ([0-9.]+) after \d+ epochs.*params equal across ranks: (\w+)")


@pytest.fixture(scope="module")
def image():
    return _build("cpu")[0]


def _run(*args, timeout=120):
    out = _docker(*args, timeout=timeout)
    assert out.returncode == 0, f"docker {' '.join(args)}:\n{out.stdout}{out.stderr}"
    return out.stdout


def _kubernetes(kind):
    """The one object of ``kind`` in examples/kubernetes/."""
    docs = [d for f in sorted(KUBERNETES.glob("*.yaml")) for d in yaml.safe_load_all(f.read_text()) if d]
    [found] = [d for d in docs if d["kind"] == kind]
    return found


def _mount(pod, volume):
    """Where the first container of ``pod`` (a pod template's spec) mounts ``volume``."""
    return next(m["mountPath"] for m in pod["containers"][0]["volumeMounts"] if m["name"] == volume)


@pytest.fixture(scope="module")
def cluster(image, tmp_path_factory):
    """Two running worker containers on their own network, each with sshd on PORT and the test's key; yields
    (names, network, key folder)."""
    tag = uuid.uuid4().hex[:8]
    network, names = f"hvdsync-mn-{tag}", [f"hvdsync-mn-{tag}-{i}" for i in (1, 2)]
    keys = tmp_path_factory.mktemp("ssh-keys")
    # The workers also answer to the DNS names the Kubernetes launcher's hostfile lists (<statefulset>-<i>.<service>).
    # They have no folder of the launcher's --log-dir: rank 0 shows plain progress lines in the log instead.
    env = {e["name"]: e["value"] for e in _kubernetes("Job")["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert int(env["WORKERS"]) == len(names) and int(env["SSH_PORT"]) == PORT, env
    try:
        # A key for this test only: never in the image, mounted read-only, removed at the end.
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "hvdsync-multinode-test",
                        "-f", str(keys / "id_ed25519")], check=True, timeout=60)
        shutil.copy(keys / "id_ed25519.pub", keys / "authorized_keys")
        _run("network", "create", network)
        for i, name in enumerate(names):
            # The host name is the container's name: Docker's /etc/hosts maps it to the container's own eth0
            # address (not to loopback), and the network's DNS gives the other container's by the same name.
            # no-new-privileges: as the StatefulSet's allowPrivilegeEscalation: false (sshd still logs users in).
            _run("run", "-d", "--name", name, "--hostname", name, "--network", network,
                 "--network-alias", f"{env['STATEFULSET']}-{i}.{env['SERVICE']}", "--user", "root",
                 "--security-opt", "no-new-privileges:true",
                 "-v", f"{keys}:/etc/hvdsync/ssh:ro", image, "hvdsync-sshd", str(PORT))
        deadline = time.monotonic() + 120
        while True:  # sshd is up when the first container logs in to the second
            probe = _docker("exec", "-u", USER, names[0], "ssh", "-o", "BatchMode=yes", names[1], "true", timeout=60)
            if probe.returncode == 0:
                break
            assert time.monotonic() < deadline, probe.stderr + _docker("logs", names[1]).stderr
            time.sleep(1)
        yield names, network, keys
    finally:
        for name in names:
            _docker("rm", "-f", name)
        _docker("network", "rm", network)
        shutil.rmtree(keys, ignore_errors=True)


class _RankWatcher:
    """Samples, while a job runs, which Horovod ranks have a process in each container (HOROVOD_RANK in the
    environment of that container's processes): evidence of where the workers ran, independent of the launcher."""

    # Run as the workers' user: another user's /proc/<pid>/environ needs CAP_SYS_PTRACE, which even a container's
    # root lacks (Docker's default capabilities); the other processes' files are unreadable and skipped.
    SCRIPT = "for e in /proc/[0-9]*/environ; do tr '\\0' '\\n' < \"$e\" | grep '^HOROVOD_RANK='; done 2>/dev/null | sort -u"

    def __init__(self, names):
        self.names, self.seen = names, {name: set() for name in names}
        self.stop, self.thread = threading.Event(), threading.Thread(target=self._loop, daemon=True)

    def _loop(self):
        while not self.stop.is_set():
            for name in self.names:
                out = _docker("exec", "-u", USER, name, "bash", "-c", self.SCRIPT, timeout=60).stdout
                self.seen[name] |= {int(rank) for rank in re.findall(r"HOROVOD_RANK=(\d+)", out)}
            self.stop.wait(0.5)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(timeout=120)


def _job(names, *command, timeout=1200, docker=None):
    """Run ``command`` as the plain user in the first container (or run ``docker`` arguments as given); returns
    (output, seconds, ranks seen per name)."""
    start = time.monotonic()
    with _RankWatcher(names) as watcher:
        out = _docker(*(docker or ("exec", "-u", USER, "-w", f"/home/{USER}", names[0], *command)), timeout=timeout)
    seconds = time.monotonic() - start
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-6000:]
    return out.stdout + out.stderr, seconds, watcher.seen


def test_image_holds_no_ssh_keys_and_sshd_refuses_bad_setups(image):
    # No host key and no user key baked in; the default user is still the plain one.
    listing = _run("run", "--rm", image, "bash", "-c", "ls /etc/ssh; ls -a ~/.ssh 2>&1; id -u")
    assert "ssh_host_" not in listing and "No such file" in listing and listing.split()[-1] == "10001", listing
    # Started without root, or without a key to let in: one line that says what to do, exit 2.
    out = _docker("run", "--rm", image, "hvdsync-sshd")
    assert out.returncode == 2 and "--user root" in out.stderr and out.stderr.count("\n") == 1, out.stderr
    out = _docker("run", "--rm", "--user", "root", image, "hvdsync-sshd")
    assert out.returncode == 2 and "authorized_keys" in out.stderr and "-v" in out.stderr, out.stderr
    out = _docker("run", "--rm", "--user", "root", image, "hvdsync-sshd", "port")
    assert out.returncode == 2 and "'port' is not a port number" in out.stderr, out.stderr


def test_containers_reach_each_other_as_the_plain_user_with_fresh_host_keys(cluster):
    names = cluster[0]
    first, second = names
    # A plain ssh login lands as uid 10001 on the other container and finds the venv's python (sshd's SetEnv).
    out = _run("exec", "-u", USER, first, "ssh", second, "hostname; id -u; command -v python")
    assert out.split() == [second, "10001", "/opt/venv/bin/python"], out
    # No root login, whatever the key.
    refused = _docker("exec", "-u", USER, first, "ssh", "-o", "BatchMode=yes", f"root@{second}", "true")
    assert refused.returncode != 0
    # Each container made its own host key at start.
    keys = [_run("exec", name, "cat", "/etc/ssh/ssh_host_ed25519_key.pub").split()[1] for name in names]
    assert keys[0] != keys[1]
    # Each host name resolves to the container's eth0 address, not to loopback (Gloo would dial 127.0.0.1).
    for name in names:
        address, *eth0 = _run("exec", name, "python", "-c", "import psutil, socket; print(socket.gethostbyname("
                              "socket.gethostname()), *(a.address for a in psutil.net_if_addrs()['eth0'] "
                              "if a.family == socket.AF_INET))").split()
        assert address in eth0 and not address.startswith("127."), (address, eth0)


def test_horovodrun_trains_on_both_containers(cluster):
    names = cluster[0]
    first, second = names
    hosts = ",".join(f"{name}:{SLOTS}" for name in names)
    output, seconds, seen = _job(names, "horovodrun", "--gloo", "-np", "4", "-H", hosts, "-p", str(PORT),
                                 "--network-interface", "eth0", "python", "/opt/hvdsync/examples/train_torch.py",
                                 "--set", "tracking.enabled=false")
    match = RESULT.search(output)
    assert match, output[-6000:]
    print(f"\nhorovodrun -np 4 -H {hosts}: {seconds:.0f}s, ranks seen {seen}; {match.group(0)}")
    assert float(match.group(1)) >= 0.90 and match.group(2) == "True"
    assert seen == {first: {0, 1}, second: {2, 3}}, seen


def test_hvdsync_train_trains_on_both_containers(cluster):
    names = cluster[0]
    first, second = names
    hosts = ",".join(f"{name}:{SLOTS}" for name in names)
    output, seconds, seen = _job(names, "hvdsync", "train", "--framework", "torch", "--np", "4", "--hosts", hosts,
                                 "--ssh-port", str(PORT), "--network-interface", "eth0", "--no-track")
    match = RESULT.search(output)
    assert match, output[-6000:]
    print(f"\nhvdsync train --np 4 --hosts {hosts}: {seconds:.0f}s, ranks seen {seen}; {match.group(0)}")
    assert float(match.group(1)) >= 0.90 and match.group(2) == "True"
    assert seen == {first: {0, 1}, second: {2, 3}}, seen


def test_the_kubernetes_launcher_trains_on_both_workers_from_a_third_container(cluster, image, tmp_path):
    # launcher.yaml's own script, env, user and mounts, in a container that runs no rank (as the Job's pod): it
    # writes the hostfile from the DNS names, waits for each sshd, and runs hvdsync train --hostfile over ssh.
    names, network, keys = cluster
    first, second = names
    pod = _kubernetes("Job")["spec"]["template"]["spec"]
    launcher = pod["containers"][0]
    # The key as the Job's pod sees the Secret with fsGroup: readable by the plain user, not owned by it.
    secret = tmp_path / "secret"
    secret.mkdir(mode=0o755)
    shutil.copy(keys / "id_ed25519", secret / "id_ed25519")
    (secret / "id_ed25519").chmod(0o444)
    env = [o for e in launcher["env"] for o in ("-e", f"{e['name']}={e['value']}")]
    try:
        output, seconds, seen = _job(names, docker=(
            "run", "--rm", "--network", network, "--user", str(pod["securityContext"]["runAsUser"]), *env,
            "-v", f"{secret}:{_mount(pod, 'ssh')}:ro",
            "--mount", f"type=tmpfs,destination={_mount(pod, 'job')},tmpfs-mode=1777",
            image, *launcher["command"], *launcher["args"]))
    finally:
        shutil.rmtree(secret, ignore_errors=True)
    match = RESULT.search(output)
    assert match, output[-6000:]
    print(f"\nKubernetes launcher (hostfile of DNS names, from a third container): {seconds:.0f}s, ranks seen "
          f"{seen}; {match.group(0)}")
    assert float(match.group(1)) >= 0.90 and match.group(2) == "True"
    assert seen == {first: {0, 1}, second: {2, 3}}, seen
    assert "hvdsync-worker-0.hvdsync-workers slots=2" in output   # the hostfile the script printed
