"""hvdsync on Ray clusters with token authentication (the session's 2-node cluster, tests/ray/conftest.py) and without
(a one-node cluster on the session's third test host, made here).

Once any plain ``ray.init()`` has run on a machine, Ray keeps a token in ``~/.ray/auth_token`` and ``ray start --head``
turns authentication on with it; hvdsync connected to such a cluster without its token, and Ray's client printed a
minute of ``InvalidAuthToken`` lines before "Failed to connect". These tests hold the fix: the token is found where Ray
keeps it (the other tests of tests/ray run that way: conftest.py's drivers have it only in their home's
``~/.ray/auth_token``), a missing or wrong one is one line before any worker starts, the token never reaches hvdsync's
output or the MLflow store, and a cluster without authentication still works with or without a token file around.
"""
import importlib.util
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.ray.conftest import BIN, NO_RAY, ROOT, clean_env, reap, user_home

if importlib.util.find_spec("ray") is None:
    pytest.skip(NO_RAY, allow_module_level=True)

GET_TOKEN = "print the cluster's token with `ray get-auth-token` on its head node"


def test_a_missing_or_wrong_token_stops_before_any_worker_in_one_line(ray_cluster, tmp_path):
    address = ray_cluster.address
    empty = user_home(tmp_path / "empty", None)
    line = ray_cluster.refused("--ray", address, HOME=str(empty))
    assert line == (f"hvdsync: error: ray_address: the Ray cluster at {address} requires token authentication and "
                    f"no token was found here (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH and {empty}/.ray/auth_token are "
                    f"all empty or absent); {GET_TOKEN} and save it as {empty}/.ray/auth_token here, or set "
                    "RAY_AUTH_TOKEN_PATH to a file that holds it")
    # `auto` (RAY_ADDRESS) is refused the same way: hvdsync checks the head it resolved to.
    assert ray_cluster.refused("--ray", "auto", HOME=str(empty), RAY_ADDRESS=address) == line

    stale = user_home(tmp_path / "stale", "0123456789abcdef0123456789abcdef")   # a token of another cluster
    line = ray_cluster.refused("--ray", address, HOME=str(stale))
    assert line == (f"hvdsync: error: ray_address: the Ray cluster at {address} rejected the token from "
                    f"{stale}/.ray/auth_token (not the cluster's token); {GET_TOKEN} and put it there, or set "
                    "RAY_AUTH_TOKEN_PATH to a file that holds it")
    line = ray_cluster.refused("--ray", address, RAY_AUTH_TOKEN="not-the-token")
    assert "rejected the token from RAY_AUTH_TOKEN (not the cluster's token)" in line and "not-the-token" not in line

    missing = tmp_path / "no-such-token"
    line = ray_cluster.refused("--ray", address, RAY_AUTH_TOKEN_PATH=str(missing))
    assert line == (f"hvdsync: error: RAY_AUTH_TOKEN_PATH: {missing} cannot be read (No such file or directory); "
                    f"point it at the file that holds the Ray cluster's token ({GET_TOKEN}), or unset it")
    line = ray_cluster.refused("--ray", address, RAY_AUTH_MODE="disabled")   # the right token in ~/.ray, mode off
    assert line == (f"hvdsync: error: ray_address: the Ray cluster at {address} requires token authentication, but "
                    "RAY_AUTH_MODE=disabled here; unset RAY_AUTH_MODE (hvdsync then finds the token as Ray's "
                    "clients do) or set RAY_AUTH_MODE=token")


def test_the_token_from_ray_auth_token_path_trains_and_never_leaves_the_driver(ray_cluster, tmp_path, monkeypatch):
    # The runner's own home holds another cluster's token, as after an earlier `ray.init()` on this machine: the
    # driver's environment never takes it (conftest gives every process a home of its own), and RAY_AUTH_TOKEN_PATH
    # comes before ~/.ray/auth_token, as in Ray's own clients.
    monkeypatch.setenv("HOME", str(user_home(tmp_path / "runner", "0123456789abcdef0123456789abcdef")))
    stale = user_home(tmp_path / "stale", "fedcba9876543210fedcba9876543210")
    store, logs = tmp_path / "mlflow.db", tmp_path / "logs"
    out = ray_cluster.hvdsync("train", "--ray", ray_cluster.address, "--framework", "torch", "--np", "2",
                              "--epochs", "1", "--tracking-uri", f"sqlite:///{store}", "--experiment", "ray-auth",
                              "--log-dir", str(logs), "--verbose", "--json", cwd=tmp_path,
                              HOME=str(stale), RAY_AUTH_TOKEN_PATH=str(ray_cluster.token_file))
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    result = json.loads(out.stdout[out.stdout.index("{"):])
    assert result["world_size"] == 2 and result["param_spread"] == 0.0
    assert "InvalidAuthToken" not in out.stderr
    # Not in what hvdsync printed (--verbose: the workers' output too), nor in the store, nor in any file it wrote.
    token = ray_cluster.token.encode()
    assert token not in out.stdout.encode() + out.stderr.encode()
    written = [p for p in tmp_path.rglob("*") if p.is_file() and p.parent != stale / ".ray"]
    artifacts = [p for p in written if p.is_relative_to(tmp_path / "mlruns")]   # the run's config and record
    assert store in written and artifacts and not [p for p in written if token in p.read_bytes()]


def test_the_runners_home_is_never_read(ray_cluster, tmp_path, monkeypatch):
    # Whether or not the runner's ~/.ray/auth_token exists, and whatever token it holds, the cluster and its drivers
    # use their own: conftest's environments name their own homes and drop the caller's RAY_AUTH_* variables.
    for token in ("0123456789abcdef0123456789abcdef", None):
        home = user_home(tmp_path / f"runner-{token is None}", token)
        monkeypatch.setenv("HOME", str(home))
        monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
        env = ray_cluster.env()
        assert env["HOME"] == str(ray_cluster.user_home) and "RAY_AUTH_MODE" not in env
    # A job driven from the worse of the two (a stale token in the runner's home, authentication "disabled" in its
    # environment) still reaches the cluster: the environment asserted equal above is the one the driver gets, so
    # the home without a token needs no job of its own.
    monkeypatch.setenv("HOME", str(user_home(tmp_path / "runner-stale", "0123456789abcdef0123456789abcdef")))
    out = ray_cluster.drive({"job": "user_torch_fit", "np": 2, "address": ray_cluster.address,
                             "kwargs": {"n": 200, "epochs": 1}})
    assert [r["rank"] for r in out["result"]] == [0, 1]


@pytest.fixture(scope="module")
def open_cluster(ray_cluster):
    """A one-node cluster with authentication off on test host node3 (``RAY_AUTH_MODE=disabled``: without it ``ray
    start`` would turn authentication on, finding the token its home holds), 2 CPUs; its driver runs on node3 too."""
    hosts = ray_cluster.hosts
    temp = Path(tempfile.mkdtemp(prefix="hvdray-open-"))
    home = user_home(temp / "home", "0123456789abcdef0123456789abcdef")
    address = f"{hosts.host('node3').address}:6380"
    argv = [str(BIN / "ray"), "start", "--block", "--head", "--port=6380", f"--node-ip-address={address[:-5]}",
            "--num-cpus=2", "--num-gpus=0", f"--temp-dir={temp / 'ray'}", "--disable-usage-stats",
            "--include-dashboard=false", "--object-store-memory=100000000"]
    with open(temp / "head.log", "wb") as log:
        head = hosts.popen("node3", argv, cwd=ROOT, env=clean_env(home, RAY_AUTH_MODE="disabled"), stdout=log,
                           stderr=subprocess.STDOUT, start_new_session=True)
    try:
        ready = ("import socket, sys, time; t = time.time()\n"
                 "while True:\n"
                 "    try: socket.create_connection((sys.argv[1], 6380), timeout=1).close(); break\n"
                 "    except OSError: assert time.time() - t < 90; time.sleep(0.5)\n")
        out = hosts.run("node3", [sys.executable, "-c", ready, address[:-5]], timeout=120)
        assert out.returncode == 0 and head.poll() is None, (temp / "head.log").read_text()[-3000:]
        yield address, temp
    finally:
        head.terminate()
        reap(head, timeout=30)
        shutil.rmtree(temp, ignore_errors=True)


@pytest.mark.parametrize("token_file", ["present", "absent"])
def test_an_unauthenticated_cluster_still_works_with_or_without_a_token_file(ray_cluster, open_cluster, token_file,
                                                                               tmp_path):
    address, temp = open_cluster
    home = user_home(tmp_path / "home", "0123456789abcdef0123456789abcdef" if token_file == "present" else None)
    out = ray_cluster.hosts.run("node3", [str(BIN / "hvdsync"), "train", "--ray", address, "--framework", "torch",
                                          "--np", "2", "--epochs", "1", "--no-track", "--json"], cwd=ROOT,
                                env=clean_env(home), timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:] + (temp / "head.log").read_text()[-2000:]
    result = json.loads(out.stdout[out.stdout.index("{"):])
    assert result["world_size"] == 2 and result["param_spread"] == 0.0
