"""Start a TensorFlow Horovod worker: ``hvd.init()``, its GPU, threads, seeds, determinism."""
from __future__ import annotations

import os

import horovod.tensorflow as hvd
import keras
import tensorflow as tf

from hvdsync.adapter import start_horovod
from hvdsync.core.train import seeding
from hvdsync.core.train.gpus import (check_nccl, check_not_shared, driver_cuda, gpu_placement, present_gpus,
                                     visible_gpus)
from hvdsync.core.train.runtime import WorkerInfo


def _set_threads(n: int) -> None:
    # TensorFlow fixes its thread pools when it runs its first op; after that the setters raise (unless the value
    # is unchanged). Then warn rather than fail: training still works, only slower from oversubscription.
    try:
        tf.config.threading.set_intra_op_parallelism_threads(n)
        tf.config.threading.set_inter_op_parallelism_threads(n)
    except RuntimeError as exc:
        import warnings

        warnings.warn(f"hvdsync: TensorFlow threads already fixed, not set to {n} per worker ({exc})", stacklevel=3)


def _pin_gpu(info: WorkerInfo, device: str) -> None:
    # One GPU per worker, picked by the local rank (Horovod's first rule; hvdsync.core.train.gpus), with memory grown on
    # demand so that the workers of one host do not each reserve every GPU. tensorflow-cpu sees no GPU: nothing to do.
    if device == "cpu":
        # Possible only before TensorFlow's first op (init's docstring asks for that): the device list is then fixed.
        try:
            tf.config.set_visible_devices([], "GPU")
        except RuntimeError:
            if tf.config.get_visible_devices("GPU"):
                raise RuntimeError("hvdsync: train.device=cpu but TensorFlow already ran an op with its GPUs visible; "
                                   "call hvdsync.tensorflow.init before any TensorFlow op") from None
        return
    gpus = tf.config.list_physical_devices("GPU")
    facts = _cuda_facts(len(gpus))
    index = gpu_placement(info.local_rank, info.local_size, **facts, device=device)
    if index is not None:
        check_nccl(index, hvd.nccl_built(), facts["framework"])
        # Pinned first: the gather below is a TensorFlow op, and TensorFlow's first op fixes its devices (pinning after
        # it raised "Physical devices cannot be modified after being initialized" on a GPU).
        _use_only(gpus[index])
        # On the CPU (Gloo): this checks for two ranks sharing one GPU, where NCCL would refuse, or hang in, the gather.
        with tf.device("/CPU:0"):
            check_not_shared(index, info, facts["visible"], hvd.allgather_object)


def _use_only(gpu) -> None:
    """This worker's one GPU, its memory grown on demand; TensorFlow allows both only before its first op."""
    tf.config.experimental.set_memory_growth(gpu, True)
    tf.config.set_visible_devices(gpu, "GPU")


def _cuda_facts(visible: int) -> dict:
    """What :func:`gpu_placement` decides from, as TensorFlow sees it (the driver is asked only when TensorFlow's CUDA
    build sees no GPU)."""
    build = tf.sysconfig.get_build_info()
    cuda_build = build.get("cuda_version") if build.get("is_cuda_build") else None
    facts = {"visible": visible, "framework": f"TensorFlow {tf.__version__}", "cuda_build": cuda_build,
             "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
             # TensorFlow's GPU wheels leave CUDA's libraries to the `and-cuda` extra: without it no GPU is seen.
             "hint": f"its CUDA {str(cuda_build).split('.')[0]} libraries are likely missing (pip install "
                     f"'tensorflow[and-cuda]=={tf.__version__}'; TensorFlow's start-up lines name the library)"}
    if visible == 0 and cuda_build:
        facts["present"] = visible_gpus(present_gpus(), facts["cuda_visible_devices"])
        facts["driver_cuda"] = driver_cuda() if facts["present"] else None
    return facts


def init(cfg=None) -> WorkerInfo:
    """Initialise Horovod and seed this worker from ``cfg.train`` (defaults if ``cfg`` is None).

    TensorFlow's op-level seed is the *global* seed on every rank; Python and numpy get the *rank* seed (for what
    should differ between ranks). Keras 3 draws each unseeded initializer's and dropout layer's seed from Python's
    ``random`` when the layer is made, so a model built after ``init`` starts different on each rank (and its
    dropout masks differ, as they should) until :func:`~hvdsync.tensorflow.broadcast_state` copies rank 0's. Rank 0's
    seed does not depend on the world size, so a 1-worker and an N-worker run start from the same model. Call
    ``init`` before the first TensorFlow op, so that the per-worker thread count can still be set.

    GPUs as in :func:`hvdsync.torch.init`: one per worker (:func:`gpu_placement`), and more ranks on a host than
    GPUs, or GPUs that TensorFlow's CUDA build cannot use, stop here with one line; ``CUDA_VISIBLE_DEVICES`` is
    honoured (empty: the CPU). ``cfg.train.device``: ``auto`` (the above), ``cpu`` (GPUs hidden from TensorFlow,
    even where present), ``cuda`` (no usable GPU stops here, with the reason).
    """
    from hvdsync.config import Config

    cfg = cfg or Config()
    info = start_horovod(hvd, cfg)
    _pin_gpu(info, cfg.train.device)
    _set_threads(seeding.threads_per_worker(info.local_size))
    keras.utils.set_random_seed(cfg.train.seed)  # TensorFlow's seed and Keras' global generator (reset)
    seeding.seed_python_and_numpy(seeding.rank_seed(cfg.train.seed, info.rank))
    if cfg.train.deterministic:
        tf.config.experimental.enable_op_determinism()
    return info
