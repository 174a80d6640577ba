"""examples/kubernetes/ holds together without a cluster: the objects agree with each other (names, labels, replicas,
slots, the ssh port), with the images docker/build.py makes, and with hvdsync's own command line; the launcher's
script, run here with stand-ins for ssh and hvdsync, writes a hostfile hvdsync reads and a command line it accepts.
(A real run of that script against two sshd containers: tests/docker/test_multinode.py, opt-in.)
"""
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hvdsync.launch import cli
from hvdsync.launch.hosts import Host, check_slots, parse_hostfile

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "kubernetes"
# docker/build.py is a script, not a package module: load it by path for the variants it builds.
_spec = importlib.util.spec_from_file_location("hvdsync_docker_build_k8s", ROOT / "docker" / "build.py")
build = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(build)
API_VERSIONS = {"Service": "v1", "StatefulSet": "apps/v1", "Job": "batch/v1"}


def _objects() -> list[dict]:
    return [doc for path in sorted(EXAMPLE.glob("*.yaml")) for doc in yaml.safe_load_all(path.read_text()) if doc]


@pytest.fixture(scope="module")
def objs() -> dict:
    found = _objects()
    kinds = [o["kind"] for o in found]
    assert sorted(kinds) == sorted(API_VERSIONS), kinds           # each exactly once
    return {o["kind"]: o for o in found}


def _pod(obj: dict) -> dict:
    return obj["spec"]["template"]["spec"]


def _env(objs) -> dict:
    return {e["name"]: e["value"] for e in _pod(objs["Job"])["containers"][0]["env"]}


def _mount(pod: dict, volume: str) -> dict:
    [mount] = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == volume]
    return mount


def _volume(pod: dict, name: str) -> dict:
    [volume] = [v for v in pod["volumes"] if v["name"] == name]
    return volume


def _ssh_port(objs) -> int:
    """The port the workers' sshd listens on: the argument of their hvdsync-sshd command."""
    worker = _pod(objs["StatefulSet"])["containers"][0]
    assert worker["command"][0] == "hvdsync-sshd" and len(worker["command"]) == 2, worker["command"]
    return int(worker["command"][1])


def test_kinds_api_versions_and_names(objs):
    for kind, obj in objs.items():
        assert obj["apiVersion"] == API_VERSIONS[kind], (kind, obj["apiVersion"])
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", obj["metadata"]["name"]), obj["metadata"]
    assert _pod(objs["Job"])["restartPolicy"] in ("Never", "OnFailure")


def test_the_headless_service_selects_the_worker_pods_and_names_them(objs):
    service, workers = objs["Service"], objs["StatefulSet"]
    assert service["spec"]["clusterIP"] == "None"          # headless: one DNS name per pod
    assert workers["spec"]["serviceName"] == service["metadata"]["name"]
    labels = workers["spec"]["template"]["metadata"]["labels"]
    assert workers["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert service["spec"]["selector"].items() <= labels.items()
    # ... and not the launcher's pod, which runs no sshd.
    assert not service["spec"]["selector"].items() <= objs["Job"]["spec"]["template"]["metadata"]["labels"].items()


def test_one_ssh_port_everywhere(objs):
    port = _ssh_port(objs)
    worker = _pod(objs["StatefulSet"])["containers"][0]
    [container_port] = worker["ports"]
    assert container_port["containerPort"] == port
    [service_port] = objs["Service"]["spec"]["ports"]
    assert service_port["port"] == port and service_port["targetPort"] in (port, container_port["name"])
    assert worker["readinessProbe"]["tcpSocket"]["port"] in (port, container_port["name"])
    assert int(_env(objs)["SSH_PORT"]) == port


def test_the_launcher_names_the_statefulset_its_replicas_and_their_cpus(objs):
    env, workers = _env(objs), objs["StatefulSet"]
    assert env["STATEFULSET"] == workers["metadata"]["name"]
    assert env["SERVICE"] == objs["Service"]["metadata"]["name"]
    assert int(env["WORKERS"]) == workers["spec"]["replicas"]
    # Each pod asks for at least one CPU per rank it runs.
    cpus = _pod(workers)["containers"][0]["resources"]["requests"]["cpu"]
    assert int(env["SLOTS"]) >= 1 and float(str(cpus).rstrip("m")) / (1000 if str(cpus).endswith("m") else 1) \
        >= int(env["SLOTS"]), (cpus, env["SLOTS"])


def test_images_are_the_ones_docker_build_makes_and_carry_hvdsync_sshd(objs):
    tags = {f"hvdsync:{variant}": variant for variant in build.DEFAULT_BASES}   # build.py's default --tag
    for kind in ("StatefulSet", "Job"):
        for container in _pod(objs[kind])["containers"]:
            assert container["image"] in tags, (kind, container["image"], sorted(tags))
            dockerfile = (ROOT / "docker" / f"Dockerfile.{tags[container['image']]}").read_text()
            assert re.search(r"^COPY docker/sshd\.sh /usr/local/bin/hvdsync-sshd$", dockerfile, re.M)


def test_the_key_comes_from_the_secret_and_the_readme_makes_that_secret(objs):
    workers, launcher = _pod(objs["StatefulSet"]), _pod(objs["Job"])
    # hvdsync-sshd reads authorized_keys from its default folder: the workers mount the Secret there.
    default = re.search(r'keys="\$\{HVDSYNC_SSH_DIR:-(\S+)\}"', (ROOT / "docker" / "sshd.sh").read_text()).group(1)
    names = set()
    for pod, where in ((workers, default), (launcher, str(Path(_env(objs)["SSH_KEY"]).parent))):
        mount, volume = _mount(pod, "ssh"), _volume(pod, "ssh")
        assert mount["mountPath"] == where and mount["readOnly"] is True
        names.add(volume["secret"]["secretName"])
    assert len(names) == 1, names
    # The launcher runs as the plain user; fsGroup + a group-readable mode let it read the key.
    security = launcher["securityContext"]
    assert security["runAsUser"] == security["fsGroup"] == 10001 and security["runAsNonRoot"] is True
    assert _volume(launcher, "ssh")["secret"]["defaultMode"] & 0o040
    # The README's kubectl line creates that Secret with the two files the pods read.
    readme = (EXAMPLE / "README.md").read_text()
    line = re.search(r"^kubectl create secret generic (\S+) (.*)$", readme, re.M)
    assert line and line.group(1) == names.pop(), line
    files = set(re.findall(r"--from-file=(\S+)", line.group(2)))
    assert files == {"authorized_keys", Path(_env(objs)["SSH_KEY"]).name}, files
    # No key material in any manifest.
    assert "PRIVATE KEY" not in "".join(p.read_text() for p in EXAMPLE.iterdir())


def test_the_launchers_log_dir_is_a_volume_of_its_own_pod(objs):
    # The workers' log stays in the launcher pod; rank 0 (in worker 0, without that folder) prints plain progress
    # lines into it (hvdsync.core.telemetry.progress), so the workers need no such volume.
    assert "emptyDir" in _volume(_pod(objs["Job"]), "job")
    assert all(v["name"] != "job" for v in _pod(objs["StatefulSet"]).get("volumes", []))


def _run_launcher(objs, tmp_path, ssh_exit=0, **env_over):
    """The Job's script under bash with stand-ins: `ssh` records its arguments, `hvdsync` records its argv."""
    stubs, home = tmp_path / "bin", tmp_path / "home"
    stubs.mkdir()
    home.mkdir()
    (stubs / "ssh").write_text(f'#!/bin/sh\nprintf "%s\\n" "$*" >> "{tmp_path}/ssh.calls"\nexit {ssh_exit}\n')
    (stubs / "hvdsync").write_text(f"#!{sys.executable}\nimport json, sys\n"
                                   f"json.dump(sys.argv[1:], open({str(tmp_path / 'argv.json')!r}, 'w'))\n")
    for stub in stubs.iterdir():
        stub.chmod(0o755)
    container = _pod(objs["Job"])["containers"][0]
    assert container["command"] == ["bash", "-c"] and len(container["args"]) == 1
    env = {"PATH": f"{stubs}{os.pathsep}/usr/bin{os.pathsep}/bin", "HOME": str(home), **_env(objs), **env_over}
    return subprocess.run([shutil.which("bash"), "-c", container["args"][0]], env=env, capture_output=True,
                          text=True, timeout=60)


def test_the_launcher_writes_the_hostfile_and_a_command_line_hvdsync_accepts(objs, tmp_path):
    out = _run_launcher(objs, tmp_path)
    assert out.returncode == 0, out.stderr
    env, port = _env(objs), _ssh_port(objs)
    expected = [Host(f"{env['STATEFULSET']}-{i}.{env['SERVICE']}", int(env["SLOTS"]))
                for i in range(objs["StatefulSet"]["spec"]["replicas"])]
    # The hostfile: Horovod's format, one line per replica with the slots, in hvdsync's own reader.
    hostfile = tmp_path / "home" / "hostfile"
    assert parse_hostfile(hostfile.read_text(), str(hostfile)) == expected
    # It waited for a login on every worker, on the workers' port with the Secret's key.
    calls = (tmp_path / "ssh.calls").read_text().splitlines()
    assert [c.split()[-2] for c in calls] == [h.name for h in expected], calls
    assert all(f"-p {port} -i {env['SSH_KEY']} " in c for c in calls), calls
    # The command line passes hvdsync's own parser, and means what the manifests say.
    argv = json.loads((tmp_path / "argv.json").read_text())
    ns = cli._parser().parse_args(argv)
    assert ns.command == "train" and ns.hostfile == str(hostfile) and ns.hosts is None
    assert ns.ssh_port == port and ns.ssh_identity_file == env["SSH_KEY"] and ns.network_interface == "eth0"
    assert ns.log_dir == str(tmp_path / "home" / "job")   # the emptyDir's path under the image user's home
    assert Path(_mount(_pod(objs["Job"]), "job")["mountPath"]).name == Path(ns.log_dir).name
    cfg = cli._config(ns)
    assert cfg.train.np == sum(h.slots for h in expected) and cfg.train.framework == "torch"
    where = cli._where(ns)
    assert where["hosts"] == expected and where["ssh_port"] == port and where["network_interfaces"] == ["eth0"]
    check_slots(where["hosts"], cfg.train.np)


@pytest.mark.parametrize("override, message", [
    ({"WORKERS": "two"}, "WORKERS must be a whole number, not 'two'"),
    ({"SLOTS": "0"}, "WORKERS and SLOTS must be at least 1"),
    ({"SSH_PORT": ""}, "SSH_PORT must be a whole number"),
])
def test_the_launcher_refuses_bad_settings_before_anything_starts(objs, tmp_path, override, message):
    out = _run_launcher(objs, tmp_path, **override)
    assert out.returncode == 2 and message in out.stderr, out.stderr
    assert not (tmp_path / "argv.json").exists() and not (tmp_path / "ssh.calls").exists()


def test_the_launcher_gives_up_on_a_worker_whose_sshd_never_answers(objs, tmp_path):
    out = _run_launcher(objs, tmp_path, ssh_exit=255, WAIT_SECONDS="0")
    env = _env(objs)
    assert out.returncode == 1, out.stderr
    assert f"no ssh login to {env['STATEFULSET']}-0.{env['SERVICE']}:{env['SSH_PORT']} after 0 s" in out.stderr
    assert not (tmp_path / "argv.json").exists()
