"""Start a TensorFlow Horovod worker: ``hvd.init()``, threads, seeds, determinism."""
from __future__ import annotations

import horovod.tensorflow as hvd
import keras
import tensorflow as tf

from hvdsync.core.train import seeding
from hvdsync.core.telemetry.observe import prepare_timeline
from hvdsync.core.train.runtime import WorkerInfo, apply_horovod_env, report_knobs


def _set_threads(n: int) -> None:
    # TensorFlow fixes its thread pools when it runs its first op; after that the setters raise (unless the value
    # is unchanged). Then warn rather than fail: training still works, only slower from oversubscription.
    try:
        tf.config.threading.set_intra_op_parallelism_threads(n)
        tf.config.threading.set_inter_op_parallelism_threads(n)
    except RuntimeError as exc:
        import warnings

        warnings.warn(f"hvdsync: TensorFlow threads already fixed, not set to {n} per worker ({exc})", stacklevel=3)


def _pin_gpu(local_rank: int) -> None:
    # One GPU per worker, picked by the local rank (Horovod's first rule), with memory grown on demand so that the
    # workers of one host do not each reserve every GPU. tensorflow-cpu sees no GPU: nothing to do.
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        gpu = gpus[local_rank % len(gpus)]
        tf.config.experimental.set_memory_growth(gpu, True)
        tf.config.set_visible_devices(gpu, "GPU")


def init(cfg=None) -> WorkerInfo:
    """Initialise Horovod and seed this worker from ``cfg.train`` (defaults if ``cfg`` is None).

    TensorFlow's op-level seed is the *global* seed on every rank; Python and numpy get the *rank* seed (for what
    should differ between ranks). Keras 3 draws each unseeded initializer's and dropout layer's seed from Python's
    ``random`` when the layer is made, so a model built after ``init`` starts different on each rank (and its
    dropout masks differ, as they should) until :func:`~hvdsync.tensorflow.broadcast_state` copies rank 0's. Rank 0's
    seed does not depend on the world size, so a 1-worker and an N-worker run start from the same model. Call
    ``init`` before the first TensorFlow op, so that the per-worker thread count can still be set.
    """
    from hvdsync.config import Config

    cfg = cfg or Config()
    if cfg.train.deterministic:
        seeding.apply_deterministic_env()
    prepare_timeline(cfg)  # HOROVOD_TIMELINE must be set before hvd.init
    # Horovod's knobs from cfg.sync unless the environment sets them (hvdsync.core.train.runtime), as in hvdsync.torch.init.
    knobs = apply_horovod_env(cfg.sync, initialized=hvd.is_initialized())
    hvd.init()
    report_knobs(knobs, hvd.rank())
    info = WorkerInfo(hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size())
    _pin_gpu(info.local_rank)
    _set_threads(seeding.threads_per_worker(info.local_size))
    keras.utils.set_random_seed(cfg.train.seed)  # TensorFlow's seed and Keras' global generator (reset)
    seeding.seed_python_and_numpy(seeding.rank_seed(cfg.train.seed, info.rank))
    if cfg.train.deterministic:
        tf.config.experimental.enable_op_determinism()
    return info
