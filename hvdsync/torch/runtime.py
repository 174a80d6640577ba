"""Start a PyTorch Horovod worker: ``hvd.init()``, its GPU, threads, seeds, determinism."""
from __future__ import annotations

import ctypes
import functools
import os
import time

import horovod.torch as hvd
import torch

from hvdsync.adapter import start_horovod
from hvdsync.core.train import seeding
from hvdsync.core.train.gpus import (check_nccl, check_not_shared, driver_cuda, gpu_placement, present_gpus,
                                     visible_gpus)
from hvdsync.core.train.runtime import WorkerInfo


def init(cfg=None) -> WorkerInfo:
    """Initialise Horovod and seed this worker from ``cfg.train`` (defaults if ``cfg`` is None).

    Horovod's knobs (``cfg.sync.horovod_env()``: fusion threshold, cycle time, cache) go into the environment just
    before ``hvd.init()`` reads them, unless the user's environment already sets them (then that value wins, and
    rank 0 says so once): a plain ``horovodrun`` script gets what the config says, as under hvdsync's launcher.

    Every rank seeds torch with the *global* seed (so models start identical, as a 1-worker run would) and Python
    and numpy with its *rank* seed (for what should differ between ranks). Where torch can use CUDA each worker is
    pinned to one GPU of its own, the one of its local rank (:func:`gpu_placement`); more ranks on a host than GPUs,
    or GPUs that torch's CUDA build cannot use, stop here with one line saying what was found and what to do, rather
    than as an NCCL error later or a silent run on the CPU. ``CUDA_VISIBLE_DEVICES`` is honoured (empty: the CPU).
    ``cfg.train.device`` picks: ``auto`` (the above), ``cpu`` (CUDA is never initialised, even with GPUs present),
    ``cuda`` (no usable GPU stops here, with the reason).
    """
    from hvdsync.config import Config

    global _on_cpu
    cfg = cfg or Config()
    _on_cpu = cfg.train.device == "cpu"
    if _on_cpu:
        # Before hvd.init and torch's first CUDA call: neither this process nor Horovod's NCCL side then opens a GPU
        # (a CUDA context costs ~500 MB of GPU memory per rank, and a rank on a busy GPU slows its owner).
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    info = start_horovod(hvd, cfg)
    index = None
    if not _on_cpu:
        facts = _cuda_facts()
        index = gpu_placement(info.local_rank, info.local_size, **facts, device=cfg.train.device)
    if index is not None:
        check_nccl(index, hvd.nccl_built(), facts["framework"])
        check_not_shared(index, info, facts["visible"], hvd.allgather_object)
        # One GPU per worker (Horovod's first rule; NCCL then all-reduces GPU tensors).
        torch.cuda.set_device(index)
    torch.set_num_threads(seeding.threads_per_worker(info.local_size))
    torch.manual_seed(cfg.train.seed)
    seeding.seed_python_and_numpy(seeding.rank_seed(cfg.train.seed, info.rank))
    if cfg.train.deterministic:
        torch.use_deterministic_algorithms(True)
    return info


_on_cpu = False  # train.device=cpu in the last init: device() then says the CPU even if torch met CUDA before


def device() -> torch.device:
    """This worker's device: its pinned GPU where CUDA is available (and ``train.device`` is not ``cpu``), else the
    CPU."""
    if _on_cpu or not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda", torch.cuda.current_device())


def _cuda_facts() -> dict:
    """What :func:`gpu_placement` decides from, as torch sees it (the driver is asked only when torch cannot use it)."""
    usable = torch.cuda.is_available()
    facts = {"visible": torch.cuda.device_count() if usable else 0, "framework": f"torch {torch.__version__}",
             "cuda_build": torch.version.cuda, "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
             "hint": "torch.cuda.is_available() is False; the warning torch printed says why"}
    if not usable and torch.version.cuda:
        facts["present"] = visible_gpus(present_gpus(), facts["cuda_visible_devices"])
        facts["driver_cuda"] = driver_cuda() if facts["present"] else None
    return facts


POLL_S = 50e-6  # between polls of a pending Horovod call: well under a cycle (1 ms), long enough to free the core
# HandleManager::WaitHandle(int), what hvdsync's Horovod patch 0005 adds: hvd.synchronize then waits on a condition
# variable (scripts/horovod-patches/0005-torch-wait-without-spinning.patch).
WAIT_SYMBOL = "_ZN7horovod5torch13HandleManager10WaitHandleEi"


@functools.cache
def synchronize_blocks(symbol: str = WAIT_SYMBOL) -> bool:
    """Whether ``hvd.synchronize`` blocks (the installed Horovod's PyTorch library exports ``symbol``, patch 0005's
    wait) rather than spinning on ``sched_yield`` as Horovod 0.28.1 does."""
    try:
        from horovod.torch import mpi_lib_v2

        return hasattr(ctypes.CDLL(mpi_lib_v2.__file__), symbol)
    except (ImportError, OSError):
        return False


def wait(handle, poll_s: float = POLL_S):
    """The result of a pending Horovod call, waited for without taking a core from the threads doing the work.

    Where :func:`synchronize_blocks`, ``hvd.synchronize`` itself. Else it sleeps ``poll_s`` between polls: an
    unpatched Horovod's ``hvd.synchronize`` spins, and on a host with no spare core it slows Horovod's and Gloo's
    threads of every rank (docs/measurements/allreduce.md, "Where the time goes", point 4). Polling is not free either:
    with one core per rank, up to 20,000 wake-ups a second take time from Gloo's threads while they reduce.
    """
    if not synchronize_blocks():
        while not hvd.poll(handle):
            time.sleep(poll_s)
    return hvd.synchronize(handle)
