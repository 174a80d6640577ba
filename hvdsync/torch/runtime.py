"""Start a PyTorch Horovod worker: ``hvd.init()``, threads, seeds, determinism."""
from __future__ import annotations

import horovod.torch as hvd
import torch

from hvdsync.core.train import seeding
from hvdsync.core.telemetry.observe import prepare_timeline
from hvdsync.core.train.runtime import WorkerInfo, apply_horovod_env, report_knobs


def init(cfg=None) -> WorkerInfo:
    """Initialise Horovod and seed this worker from ``cfg.train`` (defaults if ``cfg`` is None).

    Horovod's knobs (``cfg.sync.horovod_env()``: fusion threshold, cycle time, cache) go into the environment just
    before ``hvd.init()`` reads them, unless the user's environment already sets them (then that value wins, and
    rank 0 says so once): a plain ``horovodrun`` script gets what the config says, as under hvdsync's launcher.

    Every rank seeds torch with the *global* seed (so models start identical, as a 1-worker run would) and Python
    and numpy with its *rank* seed (for what should differ between ranks). Where CUDA is available each worker is
    pinned to the GPU of its local rank (:func:`device`).
    """
    from hvdsync.config import Config

    cfg = cfg or Config()
    if cfg.train.deterministic:
        seeding.apply_deterministic_env()
    prepare_timeline(cfg)  # HOROVOD_TIMELINE must be set before hvd.init
    knobs = apply_horovod_env(cfg.sync, initialized=hvd.is_initialized())
    hvd.init()
    report_knobs(knobs, hvd.rank())
    info = WorkerInfo(hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size())
    if torch.cuda.is_available():
        # One GPU per worker: the local rank picks it (Horovod's first rule; NCCL then all-reduces GPU tensors).
        torch.cuda.set_device(info.local_rank % torch.cuda.device_count())
    torch.set_num_threads(seeding.threads_per_worker(info.local_size))
    torch.manual_seed(cfg.train.seed)
    seeding.seed_python_and_numpy(seeding.rank_seed(cfg.train.seed, info.rank))
    if cfg.train.deterministic:
        torch.use_deterministic_algorithms(True)
    return info


def device() -> torch.device:
    """This worker's device: its pinned GPU where CUDA is available, else the CPU."""
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
