"""hvdsync for TensorFlow 2 with Keras 3: the same names as :mod:`hvdsync.torch`.

    init, fit, build, TensorFlowBackend, distributed_optimizer, broadcast_state, ShardedLoader, CodecCompressor,
    SyncBatchNormalization, mlp, local_optimizer

Horovod 0.28.1's own TensorFlow helpers (``DistributedGradientTape``, the Keras callbacks, ``SyncBatchNormalization``)
are written for Keras 2 and fail on Keras 3 variables; this adapter builds on Horovod's low-level collectives
(``grouped_allreduce``, ``broadcast``, ``allreduce``, ``allgather``), which work.
"""
import os

# Before TensorFlow's first import (the submodules below import it): without this every worker prints a screenful
# of C++ start-up lines (oneDNN, CUDA drivers, CPU features). A user's own setting wins.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from hvdsync.tensorflow.compression import CodecCompressor  # noqa: E402
from hvdsync.tensorflow.data import ShardedLoader
from hvdsync.tensorflow.layers import SyncBatchNormalization  # noqa: E402  # noqa: E402
from hvdsync.tensorflow.models import local_optimizer, mlp  # noqa: E402
from hvdsync.tensorflow.optimizer import broadcast_state, distributed_optimizer  # noqa: E402
from hvdsync.tensorflow.runtime import init  # noqa: E402
from hvdsync.tensorflow.train import TensorFlowBackend, build, fit  # noqa: E402

__all__ = ["init", "fit", "build", "TensorFlowBackend", "distributed_optimizer", "broadcast_state", "ShardedLoader",
           "CodecCompressor", "SyncBatchNormalization", "mlp", "local_optimizer"]
