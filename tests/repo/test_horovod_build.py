"""The Horovod build in this environment, and the cache key that decides when it is rebuilt."""
import os
import pathlib
import shutil
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
BIN = pathlib.Path(sys.executable).parent


def _key(script_dir, **env):
    out = subprocess.run(["bash", str(script_dir / "build_horovod.sh"), "--print-key"], capture_output=True,
                         text=True, check=True, env={**os.environ, "PYTHON": sys.executable, **env})
    return out.stdout.split("\n")[0]


def test_check_build_lists_pytorch_tensorflow_and_gloo():
    out = subprocess.run([str(BIN / "horovodrun"), "--check-build"], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}).stdout
    for line in ("[X] TensorFlow", "[X] PyTorch", "[X] Gloo"):
        assert line in out, out


def test_cache_key_names_what_the_wheel_was_built_against(tmp_path):
    import torch
    from importlib import metadata

    key = _key(ROOT / "scripts")
    assert key == _key(ROOT / "scripts")                      # stable
    assert key.startswith("horovod0.28.1-cp{}{}-".format(*sys.version_info[:2]))
    assert f"torch{torch.__version__}" in key
    assert f"tf{metadata.version('tensorflow-cpu')}" in key
    assert "-cpu-" in key                                       # no nvcc/NCCL here -> a Gloo-only build
    # Changing a fix changes the key (so the next set-up rebuilds), as does the compiler.
    scripts = tmp_path / "scripts"
    shutil.copytree(ROOT / "scripts", scripts)
    patch = next((scripts / "horovod-patches").glob("0001-*.patch"))
    patch.write_text(patch.read_text() + "\n")
    assert _key(scripts) != key
    assert _key(ROOT / "scripts", CXX="false") != key


def test_installed_build_is_recognised_without_rebuilding():
    # The set-up (make test runs it first) recorded the key of the Horovod it installed beside the environment.
    installed = (pathlib.Path(sys.prefix) / "hvdsync-horovod-build-key").read_text().strip()
    assert installed == _key(ROOT / "scripts"), "the installed Horovod was built for another key: run `make install`"
    out = subprocess.run(["bash", str(ROOT / "scripts" / "build_horovod.sh")], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "PYTHON": sys.executable})
    assert out.returncode == 0, out.stderr
    assert "already installed for this key" in out.stderr
