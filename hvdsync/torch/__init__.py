"""hvdsync for PyTorch: the same module files, names and signatures as :mod:`hvdsync.tensorflow`
(:class:`hvdsync.adapter.Adapter`; what is PyTorch's only is named in tests/unit/test_adapter_protocol.py).

    init, fit, build, Callback, check_same_model, dataset_evaluator, distributed_optimizer, broadcast_state,
    CodecCompressor, PlanSampler, ShardedLoader, mlp, CNN, SyncBatchNormalization, local_optimizer,
    elastic_state, run_elastic, fit_elastic
    From the core, for a loop or script of your own: TrainContext, FitResult, ShardPlan, Step, PlanState, loss_scale,
    scaled_lr, warmup_lr, grown_lr, get_codec, Codec, CodecState, StepSpread, SampleLedger, CheckpointStore
    PyTorch's only: TorchBackend (the backend class, named after its framework), LoaderSteps (a DataLoader as the
    shared loop's steps)
"""
from hvdsync.core.comm.codecs.base import Codec
from hvdsync.core.comm.codecs.registry import get_codec
from hvdsync.core.comm.codecs.state import CodecState
from hvdsync.core.elastic._store import CheckpointStore
from hvdsync.core.elastic._ledger import SampleLedger
from hvdsync.core.telemetry._spread import StepSpread
from hvdsync.core.train._context import FitResult, TrainContext
from hvdsync.core.train.callbacks import Callback
from hvdsync.core.train._scaling import grown_lr, loss_scale, scaled_lr, warmup_lr
from hvdsync.core.train._plan import PlanState, ShardPlan, Step
from hvdsync.torch.compression import CodecCompressor
from hvdsync.torch.data import LoaderSteps, PlanSampler, ShardedLoader
from hvdsync.torch.elastic import elastic_state, fit_elastic, run_elastic
from hvdsync.torch.evaluate import dataset_evaluator
from hvdsync.torch.layers import SyncBatchNormalization
from hvdsync.torch.models import CNN, local_optimizer, mlp
from hvdsync.torch.optimizer import broadcast_state, distributed_optimizer
from hvdsync.torch.runtime import init
from hvdsync.torch.train import TorchBackend, build, check_same_model, fit

__all__ = ["init", "fit", "build", "Callback", "check_same_model", "dataset_evaluator", "distributed_optimizer",
           "broadcast_state", "CodecCompressor", "PlanSampler", "ShardedLoader", "mlp", "CNN",
           "SyncBatchNormalization", "local_optimizer", "elastic_state", "run_elastic", "fit_elastic",
           "TorchBackend", "LoaderSteps"]

# The core's names a loop or script of your own needs (hvdsync.adapter.FROM_THE_CORE), the same objects in both adapters.
__all__ += ["TrainContext", "FitResult", "ShardPlan", "Step", "PlanState", "loss_scale", "scaled_lr", "warmup_lr",
            "grown_lr", "get_codec", "Codec", "CodecState", "StepSpread", "SampleLedger", "CheckpointStore"]
