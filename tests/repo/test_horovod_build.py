"""The Horovod build in this environment, and the cache key that decides when it is rebuilt."""
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

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
    # Where an MPI is installed (make test installs Open MPI before building), the build has its controller too.
    mpi = "[X] MPI" if shutil.which("mpicxx") and shutil.which("mpirun") else "[ ] MPI"
    assert out.split("Available Controllers:")[1].split("Available Tensor Operations:")[0].count(mpi) == 1, out


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


# ---- the build's decisions, read with --plan (nothing is compiled) ----------------------------------------------
# A made-up environment: the frameworks as build_horovod.sh reads them (package metadata, torch/version.py,
# TensorFlow's build_info.py) in a folder that a `python -S` (no site-packages: this venv's real torch and
# TensorFlow stay out of sight) finds on PYTHONPATH, a CUDA toolkit and NCCL as files, and a PATH of the few tools the
# script's decision part uses, so that no nvcc of the machine running the tests takes part.
TOOLS = ("bash", "sh", "sed", "paste", "sha256sum", "cut", "cat", "ls", "head", "id", "dirname", "awk", "grep", "c++")


def _dist(site, name, version):
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


def _fake_env(tmp_path, torch=None, tf=None, nvcc=None, nccl=True):
    """torch: (version, CUDA or None); tf: (distribution, version, CUDA or None); nvcc: its CUDA release or None."""
    site = tmp_path / "site"
    site.mkdir(parents=True)
    if torch:
        (site / "torch").mkdir()
        (site / "torch" / "__init__.py").write_text("")
        (site / "torch" / "version.py").write_text(f"cuda: Optional[str] = {torch[1]!r}\n")
        _dist(site, "torch", torch[0])
    if tf:
        platform = site / "tensorflow" / "python" / "platform"
        platform.mkdir(parents=True)
        (site / "tensorflow" / "__init__.py").write_text("")
        info = [("is_cuda_build", tf[2] is not None)] + ([("cuda_version", tf[2])] if tf[2] else [])
        (platform / "build_info.py").write_text(f"build_info = collections.OrderedDict({info!r})\n")
        _dist(site, tf[0], tf[1])
    bare = tmp_path / "bin"
    bare.mkdir()
    for tool in TOOLS:
        found = shutil.which(tool, path="/usr/bin:/bin")
        if found:
            (bare / tool).symlink_to(found)
    python = bare / "python"
    python.write_text(f'#!/bin/sh\nexec {sys.executable} -S "$@"\n')
    python.chmod(0o755)
    env = {"PYTHON": str(python), "PYTHONPATH": str(site), "PATH": str(bare), "CUDA_HOME": str(tmp_path / "no-cuda"),
           "HVDSYNC_CACHE": str(tmp_path / "cache")}
    if nvcc:
        cuda = tmp_path / "cuda"
        (cuda / "include").mkdir(parents=True)
        (cuda / "include" / "cuda_runtime.h").write_text("")
        (bare / "nvcc").write_text(f'#!/bin/sh\ncase "$*" in *--version*) echo "Cuda compilation tools, release {nvcc}, '
                                   f'V{nvcc}.88";;\n  *) echo "#$ TOP={cuda}" >&2;; esac\n')
        (bare / "nvcc").chmod(0o755)
    if nccl:
        (tmp_path / "nccl" / "include").mkdir(parents=True)
        (tmp_path / "nccl" / "include" / "nccl.h").write_text(
            "#define NCCL_MAJOR 2\n#define NCCL_MINOR 29\n#define NCCL_PATCH 7\n")
        env["HOROVOD_NCCL_HOME"] = str(tmp_path / "nccl")
    return env


def _plan(env, script_dir=ROOT / "scripts", arg="--plan"):
    """(plan as a dict, stderr, return code): the environment given is all the script sees, plus HOME."""
    out = subprocess.run(["bash", str(script_dir / "build_horovod.sh"), arg], capture_output=True, text=True,
                         timeout=60, env={"HOME": os.environ.get("HOME", "/root"), **env})
    plan = dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)
    return plan, out.stderr, out.returncode


CUDA_TORCH = ("2.13.0", "13.0")
CPU_TORCH = ("2.13.0+cpu", None)
TF_CPU = ("tensorflow-cpu", "2.21.0", None)
TF_CUDA = ("tensorflow", "2.21.0", "12.5.1")


def test_plan_of_this_environment_is_the_default_build_with_the_key_it_always_had():
    env = {**os.environ, "PYTHON": sys.executable}
    plan, err, rc = _plan(env)
    assert rc == 0, err
    assert plan["FRAMEWORKS"] == "torch,tensorflow"
    assert plan["HOROVOD_WITH_PYTORCH"] == "1" and plan["HOROVOD_WITH_TENSORFLOW"] == "1"
    assert plan["SDIST"] == "pypi"
    assert plan["KEY"] == _key(ROOT / "scripts") and plan["GPU"] in plan["KEY"]
    # Both frameworks is the default: asking for them by name (in any order) is the same build, the same key.
    for asked in ("torch,tensorflow", "tensorflow,torch"):
        assert _plan({**env, "HVDSYNC_HOROVOD_FRAMEWORKS": asked})[0]["KEY"] == plan["KEY"]


def test_one_framework_builds_name_only_their_framework_in_the_key():
    env = {**os.environ, "PYTHON": sys.executable, "HVDSYNC_HOROVOD_GPU": "cpu"}
    both = _plan(env)[0]
    torch_only = _plan({**env, "HVDSYNC_HOROVOD_FRAMEWORKS": "torch"})[0]
    tf_only = _plan({**env, "HVDSYNC_HOROVOD_FRAMEWORKS": "tensorflow"})[0]
    assert torch_only["FRAMEWORKS"] == "torch" and torch_only["HOROVOD_WITHOUT_TENSORFLOW"] == "1"
    assert tf_only["FRAMEWORKS"] == "tensorflow" and tf_only["HOROVOD_WITHOUT_PYTORCH"] == "1"
    assert "-torch" in torch_only["KEY"] and "-tf" not in torch_only["KEY"] and "tensorflow" not in torch_only["KEY"]
    assert "-torch" not in tf_only["KEY"] and "-tf2.21.0-" in tf_only["KEY"]
    assert len({both["KEY"], torch_only["KEY"], tf_only["KEY"], both["KEY_DIR"], torch_only["KEY_DIR"]}) == 5


def test_auto_builds_the_frameworks_installed_and_refuses_one_that_is_not(tmp_path):
    env = _fake_env(tmp_path, torch=CPU_TORCH)
    plan, err, rc = _plan(env)
    assert rc == 0, err
    assert plan["FRAMEWORKS"] == "torch" and plan["HOROVOD_WITHOUT_TENSORFLOW"] == "1"
    assert "-torch2.13.0+cpu-cpu-gcc" in plan["KEY"]
    _, err, rc = _plan({**env, "HVDSYNC_HOROVOD_FRAMEWORKS": "torch,tensorflow"})
    assert rc == 2 and err.count("\n") == 1 and "tensorflow is not installed" in err, err
    _, err, rc = _plan({**env, "HVDSYNC_HOROVOD_FRAMEWORKS": "jax"})
    assert rc == 2 and "HVDSYNC_HOROVOD_FRAMEWORKS: 'jax' is not allowed; choose one of: auto, torch, tensorflow" in err
    _, err, rc = _plan(_fake_env(tmp_path / "empty"))
    assert rc == 2 and err.count("\n") == 1 and "neither torch nor tensorflow is installed" in err, err


@pytest.mark.parametrize("mode", ["auto", "nccl"])
def test_nccl_is_never_built_for_a_cpu_only_framework(tmp_path, mode):
    # CUDA torch beside tensorflow-cpu, with a complete CUDA toolkit and NCCL: one line naming both and both ways out.
    env = {**_fake_env(tmp_path, torch=CUDA_TORCH, tf=TF_CPU, nvcc="13.0"), "HVDSYNC_HOROVOD_GPU": mode}
    plan, err, rc = _plan(env)
    assert rc == 2 and plan == {} and err.count("\n") == 1, err
    assert "torch 2.13.0 (a CUDA 13.0 build) but tensorflow-cpu 2.21.0 (a CPU build)" in err
    assert "pip uninstall tensorflow-cpu && pip install tensorflow==2.21.0" in err
    assert "HVDSYNC_HOROVOD_FRAMEWORKS=torch " in err and "HVDSYNC_HOROVOD_GPU=cpu" in err
    # ... and the way out named: torch only builds with NCCL.
    plan, err, rc = _plan({**env, "HVDSYNC_HOROVOD_FRAMEWORKS": "torch"})
    assert rc == 0, err
    assert plan["FRAMEWORKS"] == "torch" and plan["HOROVOD_WITHOUT_TENSORFLOW"] == "1"
    assert plan["GPU_OPERATIONS"] == "NCCL" and plan["GPU"] == "cuda13.0-nccl2.29.7-cc80,90"
    assert plan["NCCL_HOME"] == env["HOROVOD_NCCL_HOME"] and plan["KEY"].endswith(
        "-torch2.13.0-cuda13.0-nccl2.29.7-cc80," + plan["KEY"].split("-cc80,")[1])
    # The other way round: CPU torch beside TensorFlow's CUDA 12 build, with a CUDA 12 compiler.
    env = {**_fake_env(tmp_path / "b", torch=CPU_TORCH, tf=TF_CUDA, nvcc="12.5"), "HVDSYNC_HOROVOD_GPU": mode}
    plan, err, rc = _plan(env)
    assert rc == 2 and err.count("\n") == 1, err
    assert "tensorflow 2.21.0 (a CUDA 12.5.1 build) but torch 2.13.0+cpu (a CPU build)" in err
    assert "pip install torch==2.13.0 from PyPI" in err and "HVDSYNC_HOROVOD_FRAMEWORKS=tensorflow " in err
    plan, err, rc = _plan({**env, "HVDSYNC_HOROVOD_FRAMEWORKS": "tensorflow"})
    assert rc == 0 and plan["GPU"] == "cuda12.5-nccl2.29.7-cc80,90" and "-tensorflow2.21.0-cuda12.5-" in plan["KEY"]


def test_print_key_names_the_refused_build_and_says_it_is_refused(tmp_path):
    # --print-key answers "which key" for any environment asked about (tests/repo/test_docker.py asks it of a CUDA torch
    # beside this venv's tensorflow-cpu); --plan and the build answer "may it be built".
    env = _fake_env(tmp_path, torch=CUDA_TORCH, tf=TF_CPU, nvcc="13.0")
    out = subprocess.run(["bash", str(ROOT / "scripts" / "build_horovod.sh"), "--print-key"], capture_output=True,
                         text=True, timeout=60, env={"HOME": os.environ.get("HOME", "/root"), **env})
    assert out.returncode == 0 and "-cuda13.0-nccl2.29.7-" in out.stdout
    assert "a build that --plan and the build refuse" in out.stderr


def test_a_cuda_framework_without_a_toolkit_builds_gloo_only_in_auto_and_stops_in_nccl(tmp_path):
    env = _fake_env(tmp_path, torch=CUDA_TORCH, nccl=False)
    plan, err, rc = _plan(env)
    assert rc == 0 and plan["GPU_OPERATIONS"] == "none" and plan["GPU"] == "cpu", err
    assert err.count("\n") == 1 and "building without NCCL (Gloo only), missing: a CUDA compiler" in err
    _, err, rc = _plan({**env, "HVDSYNC_HOROVOD_GPU": "nccl"})
    assert rc == 2 and err.count("\n") == 1 and "HVDSYNC_HOROVOD_GPU=nccl, but this is missing: a CUDA compiler" in err
    # With tensorflow-cpu beside it, both problems in the one line.
    env = _fake_env(tmp_path / "b", torch=CUDA_TORCH, tf=TF_CPU, nccl=False)
    _, err, rc = _plan({**env, "HVDSYNC_HOROVOD_GPU": "nccl"})
    assert rc == 2 and err.count("\n") == 1 and "missing: a CUDA compiler" in err and "tensorflow-cpu 2.21.0" in err


def test_nvcc_beside_cpu_frameworks_builds_gloo_only_and_says_why(tmp_path):
    env = _fake_env(tmp_path, torch=CPU_TORCH, tf=TF_CPU, nvcc="13.0")
    plan, err, rc = _plan(env)
    assert rc == 0 and plan["GPU_OPERATIONS"] == "none" and plan["GPU"] == "cpu", err
    assert err.count("\n") == 1 and f"{tmp_path / 'bin' / 'nvcc'} (CUDA 13.0) is here, but no GPU build is possible" \
        in err and "torch 2.13.0+cpu (a CPU build) and tensorflow-cpu 2.21.0 (a CPU build)" in err, err
    assert _plan({**env, "HVDSYNC_HOROVOD_GPU": "cpu"})[1] == ""          # Gloo only, asked for: nothing to say
    _, err, rc = _plan({**env, "HVDSYNC_HOROVOD_GPU": "nccl"})
    assert rc == 2 and err.count("\n") == 1 and "missing: the CUDA build of torch" in err


def test_a_local_sdist_must_be_horovods_own(tmp_path):
    env = {**os.environ, "PYTHON": sys.executable, "HVDSYNC_HOROVOD_GPU": "cpu"}
    _, err, rc = _plan({**env, "HVDSYNC_HOROVOD_SDIST": str(tmp_path / "nothing.tar.gz")})
    assert rc == 2 and err.count("\n") == 1 and "no such file" in err and "gpu.sh --prepare DIR" in err, err
    other = tmp_path / "horovod-0.28.1.tar.gz"
    other.write_bytes(b"not horovod")
    _, err, rc = _plan({**env, "HVDSYNC_HOROVOD_SDIST": str(other)})
    assert rc == 2 and err.count("\n") == 1 and "its sha256 is " in err and "PyPI's horovod-0.28.1.tar.gz" in err, err
    # With the script's pinned hash that of this file (a copy of scripts/), the file or its folder is the source, and
    # the key is the same as with PyPI's sdist (it is the same file).
    import hashlib

    scripts = tmp_path / "scripts"
    shutil.copytree(ROOT / "scripts", scripts)
    text = (scripts / "build_horovod.sh").read_text()
    pinned = re.search(r"^HOROVOD_SDIST_SHA256=([0-9a-f]{64})$", text, re.M).group(1)
    (scripts / "build_horovod.sh").write_text(text.replace(pinned, hashlib.sha256(b"not horovod").hexdigest()))
    from_pypi = _plan(env, scripts)[0]
    for given in (other, tmp_path):
        plan, err, rc = _plan({**env, "HVDSYNC_HOROVOD_SDIST": str(given)}, scripts)
        assert rc == 0, err
        assert plan["SDIST"] == str(other.resolve()) and plan["KEY"] == from_pypi["KEY"]


def _fake_mpi(env, banner: str | None) -> None:
    """An MPI on the made-up environment's PATH: mpicxx, and an mpirun whose --version prints ``banner`` (None: no
    MPI at all)."""
    bare = pathlib.Path(env["PATH"])
    for tool in ("mpicxx", "mpirun"):
        (bare / tool).unlink(missing_ok=True)
    if banner is None:
        return
    (bare / "mpicxx").write_text("#!/bin/sh\nexit 0\n")
    (bare / "mpirun").write_text("#!/bin/sh\ncat <<'EOF'\n" + banner + "\nEOF\n")
    for tool in ("mpicxx", "mpirun"):
        (bare / tool).chmod(0o755)


def test_mpi_is_built_beside_gloo_where_an_mpi_is_found_and_named_in_the_key(tmp_path):
    env = _fake_env(tmp_path, torch=CPU_TORCH, nccl=False)
    plan, err, rc = _plan(env)
    assert rc == 0 and plan["MPI"] == "none" and plan["HOROVOD_WITHOUT_MPI"] == "1", err
    without = plan["KEY"]
    assert "mpi" not in without                                         # no MPI: the key it always had
    _fake_mpi(env, "mpirun (Open MPI) 4.1.4\n\nReport bugs to http://www.open-mpi.org/community/help/")
    plan, err, rc = _plan(env)
    assert rc == 0 and plan["MPI"] == "openmpi4.1.4" and plan["HOROVOD_WITH_MPI"] == "1", err
    assert plan["KEY"] == without.replace("-cpu-gcc", "-cpu-openmpi4.1.4-gcc")
    _fake_mpi(env, "HYDRA build details:\n    Version:                                 4.0.2\n    Release Date: x")
    assert _plan(env)[0]["KEY"] == without.replace("-cpu-gcc", "-cpu-mpich4.0.2-gcc")
    # off: Gloo only, the key of a machine without MPI; on: an MPI or one line.
    plan = _plan({**env, "HVDSYNC_HOROVOD_MPI": "off"})[0]
    assert plan["KEY"] == without and plan["HOROVOD_WITHOUT_MPI"] == "1" and plan["MPI"] == "none"
    _fake_mpi(env, "some other launcher 1.0")
    plan, err, rc = _plan(env)
    assert rc == 0 and plan["KEY"] == without and err == ""             # auto: an unknown MPI is left out
    _, err, rc = _plan({**env, "HVDSYNC_HOROVOD_MPI": "on"})
    assert rc == 2 and err.count("\n") == 1 and "names neither Open MPI nor MPICH" in err, err
    _fake_mpi(env, None)
    _, err, rc = _plan({**env, "HVDSYNC_HOROVOD_MPI": "on"})
    assert rc == 2 and err.count("\n") == 1, err
    assert "HVDSYNC_HOROVOD_MPI=on, but this is missing: an MPI: no mpicxx and mpirun on PATH (Debian: apt-get " \
           "install openmpi-bin libopenmpi-dev)" in err
    _, err, rc = _plan({**env, "HVDSYNC_HOROVOD_MPI": "yes"})
    assert rc == 2 and "HVDSYNC_HOROVOD_MPI: 'yes' is not allowed; choose one of: auto, on, off" in err
