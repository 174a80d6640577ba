"""The reproducibility record of a run: what it takes to run it again and to know why a rerun differs.

Recorded by rank 0 as the artifact ``hvdsync/record.json`` (and the headline items as run parameters): the config,
seeds (the global one and each rank's), versions of Python and the libraries, how Horovod was built (its cache key,
frameworks, MPI / NCCL / Gloo), the command line, the git commit when run inside a repository, and the environment
variables that change numerics or Horovod's behaviour, with every variable whose *name* looks like a secret removed
and passwords in URLs masked. ``hvdsync runs reproduce RUN_ID`` reads it back.
"""
from __future__ import annotations

import functools
import json
import os
import platform
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from hvdsync.core.train.seeding import rank_seed

# Environment variables worth recording: they change numerics, threading or Horovod's behaviour.
ENV_PREFIXES = ("HOROVOD_", "HVDSYNC_", "OMP_", "MKL_", "OPENBLAS_", "KMP_", "CUDA_", "NCCL_", "CUBLAS_",
                "TORCH_", "PYTORCH_", "KERAS_", "MLFLOW_", "GLOO_", "PYTHONHASHSEED", "CUDNN_")
# TensorFlow's own variables, by name (``TF_`` is also other tools' prefix: Terraform's TF_CLI_CONFIG_FILE, TF_VAR_*):
# threading, determinism, oneDNN, XLA, GPU memory, logging, Keras 2/3 and the cluster spec.
TF_NAMES = ("TF_CPP_MIN_LOG_LEVEL", "TF_CPP_MAX_VLOG_LEVEL", "TF_CPP_VMODULE", "TF_ENABLE_ONEDNN_OPTS",
            "TF_DETERMINISTIC_OPS", "TF_CUDNN_DETERMINISTIC", "TF_NUM_INTEROP_THREADS", "TF_NUM_INTRAOP_THREADS",
            "TF_XLA_FLAGS", "TF_GPU_ALLOCATOR", "TF_FORCE_GPU_ALLOW_GROWTH", "TF_GPU_THREAD_MODE",
            "TF_GPU_THREAD_COUNT", "TF_USE_LEGACY_KERAS", "TF_CONFIG", "TF_FORCE_UNIFIED_MEMORY",
            "TF_ENABLE_AUTO_MIXED_PRECISION", "TF_USE_CUDNN_AUTOTUNE", "TF_DISABLE_MKL", "TF_ENABLE_XLA")
# A name containing any of these is never recorded, whatever its prefix.
SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH|PRIVATE|COOKIE|SESSION", re.I)
_URL_PASSWORD = re.compile(r"(?P<scheme>[a-z][a-z0-9+.-]*://)(?P<user>[^:/@\s]*):(?P<password>[^@/\s]*)@", re.I)
PACKAGES = ("hvdsync", "horovod", "torch", "tensorflow", "tensorflow-cpu", "keras", "numpy", "mlflow",
            "scikit-learn", "psutil")


def mask_url_passwords(text: str) -> str:
    """``http://user:pw@host`` -> ``http://user:***@host`` (anywhere in ``text``)."""
    return _URL_PASSWORD.sub(lambda m: f"{m['scheme']}{m['user']}:***@", text)


def recorded_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The relevant environment variables (:data:`ENV_PREFIXES`, :data:`TF_NAMES`), without any named like a
    secret."""
    environ = dict(os.environ if environ is None else environ)
    return {k: mask_url_passwords(v) for k, v in sorted(environ.items())
            if (k.startswith(ENV_PREFIXES) or k in TF_NAMES) and not SECRET_NAME.search(k)}


def versions() -> dict[str, str]:
    """Python and the installed versions of :data:`PACKAGES` (from package metadata: imports nothing)."""
    out = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return out


@functools.lru_cache(maxsize=1)
def horovod_build() -> dict[str, Any]:
    """How the installed Horovod was built: hvdsync's build key (written beside the environment by
    ``scripts/build_horovod.sh``), the frameworks it has extensions for, and whether it links MPI and NCCL
    (read from the binaries: no framework is imported)."""
    import importlib.util

    key_file = Path(sys.prefix) / "hvdsync-horovod-build-key"
    out: dict[str, Any] = {"build_key": key_file.read_text().strip() if key_file.is_file() else "unknown"}
    spec = importlib.util.find_spec("horovod")
    if spec is None or not spec.submodule_search_locations:
        return {**out, "frameworks": []}
    root = Path(list(spec.submodule_search_locations)[0])
    libs = {"torch": sorted(root.glob("torch/mpi_lib_v2*.so")), "tensorflow": sorted(root.glob("tensorflow/mpi_lib*.so"))}
    blobs = [lib.read_bytes() for found in libs.values() for lib in found]
    out["frameworks"] = [name for name, found in libs.items() if found]
    out["mpi"] = any(b"MPI_Init_thread" in b for b in blobs)
    out["nccl"] = any(b"ncclAllReduce" in b for b in blobs)
    out["gloo"] = any(b"gloo" in b for b in blobs)
    return out


def git_commit(cwd: str | Path | None = None) -> dict[str, Any] | None:
    """``{"commit": ..., "dirty": bool}`` of the git repository around ``cwd`` (None outside one)."""
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10)
        if commit.returncode != 0:
            return None
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd,
                                capture_output=True, text=True, timeout=10)
        return {"commit": commit.stdout.strip(), "dirty": bool(status.stdout.strip())}
    except (OSError, subprocess.SubprocessError):
        return None


def command_line() -> list[str]:
    """The command that started the job: the launcher's (``hvdsync train ...``, handed to the workers in
    ``HVDSYNC_COMMAND_LINE``) or, under ``horovodrun``, this worker's own."""
    argv = json.loads(os.environ["HVDSYNC_COMMAND_LINE"]) if os.environ.get("HVDSYNC_COMMAND_LINE") else sys.argv
    return [mask_url_passwords(a) for a in argv]


def build_record(config: dict[str, Any], framework: str, world_size: int, seed: int = 0,
                 deterministic: bool = False) -> dict[str, Any]:
    """The whole record for a run of ``config`` (the config as a dict) on ``world_size`` workers of ``framework``,
    seeded with ``seed`` (``train.seed``; each rank's seed follows from it) and ``deterministic`` or not."""
    return {
        "config": config,
        "framework": framework,
        "world_size": world_size,
        "seeds": {"train.seed": seed, "rank_seeds": [rank_seed(seed, r) for r in range(world_size)]},
        "deterministic": deterministic,
        "versions": versions(),
        "horovod_build": dict(horovod_build()),
        "command_line": command_line(),
        "git": git_commit(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "env": recorded_env(),
    }


def record_params(record: dict[str, Any]) -> dict[str, str]:
    """The headline items of ``record`` as MLflow run parameters (versions, build key, git commit)."""
    params = {f"version.{k}": v for k, v in record["versions"].items()}
    build = record["horovod_build"]
    params["horovod.build_key"] = build["build_key"]
    params["horovod.built_for"] = ",".join(build.get("frameworks", []))
    params["horovod.mpi"], params["horovod.nccl"] = str(build.get("mpi")), str(build.get("nccl"))
    if record.get("git"):
        params["git.commit"] = record["git"]["commit"] + ("+dirty" if record["git"]["dirty"] else "")
    return params
