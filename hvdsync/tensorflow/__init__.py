"""hvdsync for TensorFlow 2 with Keras 3: the same module files, names and signatures as :mod:`hvdsync.torch`
(:class:`hvdsync.adapter.Adapter`; what is TensorFlow's only is named in tests/unit/test_adapter_protocol.py).

    init, fit, build, Callback, check_same_model, dataset_evaluator, distributed_optimizer, broadcast_state,
    CodecCompressor, PlanSampler, ShardedLoader, mlp, CNN, SyncBatchNormalization, local_optimizer,
    elastic_state, run_elastic, fit_elastic
    From the core, for a loop or script of your own: TrainContext, FitResult, ShardPlan, Step, PlanState, loss_scale,
    scaled_lr, warmup_lr, grown_lr, get_codec, Codec, CodecState, StepSpread, SampleLedger, CheckpointStore
    TensorFlow's only: TensorFlowBackend (the backend class, named after its framework), DistributedOptimizer (a
    Keras optimizer, for compile), callbacks (Keras callbacks), keras_fit (elastic Keras fit of your own model)

Horovod 0.28.1's own TensorFlow helpers (``DistributedGradientTape``, ``horovod.tensorflow.keras``' optimizer and
callbacks, ``SyncBatchNormalization``) were written for Keras 2 and fail on Keras 3 variables as released; hvdsync's
Horovod build patches them for Keras 3 (scripts/horovod-patches/0008), so a plain Horovod script runs on it
(examples/plain/horovod_keras_fit.py, horovod_tf2_tape.py). This adapter does not need them: it builds on Horovod's
low-level collectives (``grouped_allreduce``, ``broadcast``, ``allreduce``, ``allgather``), which work on any build.
"""
import os

from hvdsync.launch.quiet import quiet_imports

# Before TensorFlow's first import (the submodules below import it). TF_CPP_MIN_LOG_LEVEL quiets TensorFlow's own
# C++ logging (CUDA drivers, CPU features); the lines absl writes while the libraries load, before TensorFlow reads
# that variable (oneDNN on AVX-512 CPUs), are filtered from stderr by quiet_imports. A user's own level wins.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
quiet_imports()

from hvdsync.core.comm.codecs.base import Codec  # noqa: E402
from hvdsync.core.comm.codecs.registry import get_codec  # noqa: E402
from hvdsync.core.comm.codecs.state import CodecState  # noqa: E402
from hvdsync.core.elastic._store import CheckpointStore  # noqa: E402
from hvdsync.core.elastic._ledger import SampleLedger  # noqa: E402
from hvdsync.core.telemetry._spread import StepSpread  # noqa: E402
from hvdsync.core.train._context import FitResult, TrainContext  # noqa: E402
from hvdsync.core.train.callbacks import Callback  # noqa: E402
from hvdsync.core.train._scaling import grown_lr, loss_scale, scaled_lr, warmup_lr  # noqa: E402
from hvdsync.core.train._plan import PlanState, ShardPlan, Step  # noqa: E402
from hvdsync.tensorflow import callbacks  # noqa: E402
from hvdsync.tensorflow.compression import CodecCompressor  # noqa: E402
from hvdsync.tensorflow.data import PlanSampler, ShardedLoader  # noqa: E402
from hvdsync.tensorflow.elastic import elastic_state, fit_elastic, keras_fit, run_elastic  # noqa: E402
from hvdsync.tensorflow.evaluate import dataset_evaluator  # noqa: E402
from hvdsync.tensorflow.layers import SyncBatchNormalization  # noqa: E402
from hvdsync.tensorflow.models import CNN, local_optimizer, mlp  # noqa: E402
from hvdsync.tensorflow.optimizer import DistributedOptimizer, broadcast_state, distributed_optimizer  # noqa: E402
from hvdsync.tensorflow.runtime import init  # noqa: E402
from hvdsync.tensorflow.train import TensorFlowBackend, build, check_same_model, fit  # noqa: E402

__all__ = ["init", "fit", "build", "Callback", "check_same_model", "dataset_evaluator", "distributed_optimizer",
           "broadcast_state", "CodecCompressor", "PlanSampler", "ShardedLoader", "mlp", "CNN",
           "SyncBatchNormalization", "local_optimizer", "elastic_state", "run_elastic", "fit_elastic",
           "TensorFlowBackend", "DistributedOptimizer", "callbacks", "keras_fit"]

# The core's names a loop or script of your own needs (hvdsync.adapter.FROM_THE_CORE), the same objects in both adapters.
__all__ += ["TrainContext", "FitResult", "ShardPlan", "Step", "PlanState", "loss_scale", "scaled_lr", "warmup_lr",
            "grown_lr", "get_codec", "Codec", "CodecState", "StepSpread", "SampleLedger", "CheckpointStore"]
