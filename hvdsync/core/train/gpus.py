"""One rank per GPU: where each worker trains, decided from what it finds, and the one-line errors when it cannot.

Pure functions of counts, versions and ``CUDA_VISIBLE_DEVICES`` (no framework, no Horovod), so the unit tests hold
every case without a GPU (tests/unit/test_gpu_placement.py) and both adapters' ``init`` share one rule: each gathers
its framework's facts and hands them here.
"""
from __future__ import annotations

import ctypes
import os
import re
import socket

_CPU_ON_PURPOSE = "set train.device=cpu (or CUDA_VISIBLE_DEVICES= empty) to train on the CPU"
DEVICES = ("auto", "cpu", "cuda")  # train.device: what each runtime's init honours (see gpu_placement)


def visible_gpus(present: int, cuda_visible_devices: str | None) -> int:
    """How many of the ``present`` NVIDIA GPUs CUDA shows a process under ``CUDA_VISIBLE_DEVICES``: CUDA reads a
    comma-separated list of indices or ``GPU-``/``MIG-`` UUIDs and stops at the first entry that names no GPU (so
    ``-1`` or an empty value hides them all)."""
    if cuda_visible_devices is None:
        return present
    seen: list[str] = []
    for entry in (e.strip() for e in cuda_visible_devices.split(",")):
        if entry in seen or not ((entry.isdigit() and int(entry) < present) or entry.startswith(("GPU-", "MIG-"))):
            break
        seen.append(entry)
    return len(seen)


def gpu_id(cuda_visible_devices: str | None, index: int) -> str:
    """The GPU that device ``index`` of this process is, as the driver names it (CUDA_VISIBLE_DEVICES' entry)."""
    entries = [e.strip() for e in cuda_visible_devices.split(",")] if cuda_visible_devices is not None else []
    return entries[index] if index < len(entries) else str(index)


def _too_many(ranks: int, gpus: int, found: str) -> str:
    return (f"hvdsync: {ranks} ranks on this host but {gpus} GPU(s) for them ({found}): one rank per GPU, as NCCL "
            f"refuses two ranks on one GPU; start at most {gpus} rank(s) per host, make {ranks} GPUs visible, or "
            f"{_CPU_ON_PURPOSE}")


def gpu_placement(local_rank: int, local_size: int, visible: int, *, framework: str, cuda_build: str | None = None,
                  present: int = 0, driver_cuda: str | None = None, cuda_visible_devices: str | None = None,
                  hint: str = "", device: str = "auto") -> int | None:
    """The GPU index this rank trains on, ``None`` for the CPU, or a one-line ``RuntimeError`` naming what was found
    and what to do (more ranks than GPUs; GPUs the framework cannot use).

    Args:
        local_rank, local_size: this rank's place among the ranks of its host.
        visible: the GPUs the framework can use here (0 where it cannot use CUDA).
        framework: the framework and its version, for the messages (``"torch 2.13.0"``).
        cuda_build: the CUDA version the framework is built for (``None``: a CPU build).
        present: the NVIDIA GPUs that the driver shows and CUDA_VISIBLE_DEVICES leaves (:func:`visible_gpus`).
        driver_cuda: the newest CUDA version the NVIDIA driver supports (``"12.4"``), ``None`` if unknown.
        cuda_visible_devices: the variable's value (``None``: not set).
        hint: the framework's own likely reason, when neither count nor versions explain an unusable GPU.
        device: ``train.device``: ``auto`` trains on the CPU where there is no GPU to use, ``cuda`` makes that an
            error naming why (a CPU build, no GPU, GPUs hidden); ``cpu`` is decided before any GPU is asked about
            and never reaches here.

    With CUDA_VISIBLE_DEVICES set, fewer GPUs than local ranks can still be right (a launcher that gives each rank
    its own, as Slurm's per-task binding does): the index is then ``local_rank % visible`` and the ranks together
    check that no two of a host share one (:func:`shared_gpu_error`).
    """
    if device not in DEVICES:
        raise ValueError(f"train.device: {device!r} is not allowed; choose one of: {', '.join(DEVICES)}")
    if visible == 0:
        if not cuda_build or present == 0:
            if device == "cuda":
                raise RuntimeError(_no_gpu(framework, cuda_build, cuda_visible_devices))
            return None  # a CPU build, no GPU, or CUDA_VISIBLE_DEVICES hiding them: the CPU, as asked
        gpus = f"the {present} NVIDIA GPU(s) here"
        if driver_cuda is None:
            why = (f"{framework} is built for CUDA {cuda_build} but cannot use {gpus}: the NVIDIA driver's library "
                   f"(libcuda.so.1) does not answer; check the driver with nvidia-smi")
        elif int(driver_cuda.split(".")[0]) < int(cuda_build.split(".")[0]):
            why = (f"{framework} is built for CUDA {cuda_build} but the NVIDIA driver supports CUDA {driver_cuda} at "
                   f"most, so it cannot use {gpus}; install a driver for CUDA {cuda_build.split('.')[0]}, or "
                   f"{framework.split()[0]}'s build for CUDA {driver_cuda.split('.')[0]}")
        else:
            why = (f"{framework} is built for CUDA {cuda_build} and the driver supports CUDA {driver_cuda}, yet it "
                   f"cannot use {gpus}" + (f": {hint}" if hint else ""))
        raise RuntimeError(f"hvdsync: {why}; or {_CPU_ON_PURPOSE} on purpose")
    if local_size <= visible:
        return local_rank
    if cuda_visible_devices is None:  # every rank of this host sees these same GPUs: they would share them
        raise RuntimeError(_too_many(local_size, visible, f"{visible} visible, CUDA_VISIBLE_DEVICES not set"))
    return local_rank % visible


def _no_gpu(framework: str, cuda_build: str | None, cuda_visible_devices: str | None) -> str:
    # train.device=cuda asked for a GPU that the facts say is not there: name which fact, and the two ways out.
    if not cuda_build:
        name, version = framework.split()[0], framework.split()[-1].split("+")[0]
        build = (f"pip install 'tensorflow[and-cuda]=={version}'" if name == "TensorFlow" else
                 f"install {name}'s CUDA build (PyPI's {name}=={version}, not a +cpu wheel)")
        why = f"{framework} is a CPU build (no CUDA); {build}"
    elif cuda_visible_devices is not None:
        why = (f"CUDA_VISIBLE_DEVICES={cuda_visible_devices!r} leaves {framework} (CUDA {cuda_build}) no GPU; "
               f"list a GPU there or unset it")
    else:
        why = (f"{framework} (CUDA {cuda_build}) finds no NVIDIA GPU here (no /dev/nvidia* device; nvidia-smi "
               f"lists none); run on a machine or container with a GPU and its driver")
    return f"hvdsync: train.device=cuda but {why}; or set train.device=cpu (or auto) to train on the CPU"


def check_nccl(index: int, nccl_built: bool, framework: str) -> None:
    """A rank placed on GPU ``index`` needs Horovod's NCCL: without it Horovod has no GPU all-reduce, and the first
    gradient on the GPU would fail deep inside it. One line at ``init`` instead, with the two ways out."""
    if not nccl_built:
        raise RuntimeError(f"hvdsync: this rank trains on GPU {index} but the Horovod installed here is built without "
                           f"NCCL (horovodrun --check-build lists no NCCL), so it cannot all-reduce {framework}'s GPU "
                           f"tensors; rebuild it: HVDSYNC_HOROVOD_GPU=nccl bash scripts/build_horovod.sh "
                           f"(docs/install.md), or {_CPU_ON_PURPOSE}")


def shared_gpu_error(placements: list) -> str | None:
    """One line if two ranks of one host use one GPU, else ``None``; ``placements[rank]`` is that rank's
    ``(host, gpu_id(...), CUDA_VISIBLE_DEVICES)``, as every rank gathered them."""
    first: dict = {}
    for rank, (host, gpu, cuda_visible_devices) in enumerate(placements):
        if (host, gpu) in first:
            here = [g for h, g, _ in placements if h == host]
            return _too_many(len(here), len(set(here)), f"ranks {first[host, gpu]} and {rank} on {host} both use GPU "
                             f"{gpu}; CUDA_VISIBLE_DEVICES={cuda_visible_devices!r}")
        first[host, gpu] = rank
    return None


def present_gpus() -> int:
    """NVIDIA GPUs the driver shows this process (its device files; a container gets only its own), whatever the
    framework makes of them."""
    try:
        return sum(1 for name in os.listdir("/dev") if re.fullmatch(r"nvidia\d+", name))
    except OSError:
        return 0


def driver_cuda() -> str | None:
    """The newest CUDA version the installed NVIDIA driver supports, asked of libcuda (no CUDA context is made)."""
    try:
        version = ctypes.c_int()
        if ctypes.CDLL("libcuda.so.1").cuDriverGetVersion(ctypes.byref(version)) != 0:
            return None
    except (OSError, AttributeError):
        return None
    return f"{version.value // 1000}.{version.value % 1000 // 10}"


def check_not_shared(index: int, info, visible: int, allgather_object) -> None:
    """Where CUDA_VISIBLE_DEVICES leaves fewer GPUs than local ranks, ask every rank which GPU it took (one small
    gather at start-up; every rank of such a job takes this path alike) and stop if two of a host share one."""
    cuda_visible_devices = os.environ.get("CUDA_VISIBLE_DEVICES")
    if cuda_visible_devices is None or info.local_size <= visible:
        return
    error = shared_gpu_error(allgather_object((socket.gethostname(), gpu_id(cuda_visible_devices, index),
                                               cuda_visible_devices), name="hvdsync.gpu_placement"))
    if error:
        raise RuntimeError(error)
