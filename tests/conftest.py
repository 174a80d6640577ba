"""The whole suite runs in a home of its own: nothing a test does depends on what the home of whoever runs it holds.

A user who has run the tools before has ``~/.ray/auth_token`` (Ray then turns token authentication on for clusters it
starts), MLflow runs under ``./mlruns`` or a spool under ``~/.cache/hvdsync/spool`` (``hvdsync runs push`` would send
them), Keras and matplotlib caches, ``~/.config``. Every test and every process it starts sees ``HOME`` and the XDG
folders under this session's temp dir instead (made at start, removed at the end), so a machine where the user has
run hvdsync, Ray or MLflow before runs the suite as a new one does, and nothing is left in the user's home.

One thing is kept: where scripts/build_horovod.sh caches its wheels (``BUILD_CACHE``), for the opt-in Docker tests,
which pass that cache into the images as ``make docker-cpu`` does. ssh is not covered by ``HOME``: OpenSSH finds
``~/.ssh`` from the password database; the test hosts use a key pair and sshd of their own (hvdlab.testhosts) and remove
the ``known_hosts`` lines ssh adds for them.
"""
import os
import shutil
import tempfile
from pathlib import Path

# The wheel cache as the build script finds it, from the environment pytest was started with.
BUILD_CACHE = os.environ.get("HVDSYNC_CACHE") or str(
    Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "hvdsync")
_HOME: Path | None = None


def pytest_configure(config):
    global _HOME
    if _HOME is not None or os.environ.get("HVDSYNC_TEST_HOME") == os.environ.get("HOME"):
        return  # a pytest started by a test (it inherits this session's home)
    _HOME = Path(tempfile.mkdtemp(prefix="hvdsync-test-home-"))
    os.environ["HOME"] = os.environ["HVDSYNC_TEST_HOME"] = str(_HOME)
    for name, sub in (("XDG_CACHE_HOME", ".cache"), ("XDG_CONFIG_HOME", ".config"), ("XDG_DATA_HOME", ".local/share"),
                      ("XDG_STATE_HOME", ".local/state"), ("HVDSYNC_CACHE", ".cache/hvdsync")):
        os.environ[name] = str(_HOME / sub)
    # Not inherited from the caller: Ray's and MLflow's settings a user may have exported for their own work.
    for name in ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "MLFLOW_TRACKING_URI",
                 "MLFLOW_EXPERIMENT_NAME", "MLFLOW_RUN_ID"):
        os.environ.pop(name, None)


def pytest_unconfigure(config):
    if _HOME is not None:
        shutil.rmtree(_HOME, ignore_errors=True)
