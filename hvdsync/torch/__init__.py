"""hvdsync for PyTorch: the same names as :mod:`hvdsync.tensorflow`.

    init, fit, build, TorchBackend, distributed_optimizer, broadcast_state, PlanSampler, ShardedLoader,
    CodecCompressor, SyncBatchNormalization, mlp, CNN, local_optimizer, Callback,
    elastic_state, run_elastic, fit_elastic
"""
from hvdsync.core.train.loop import Callback
from hvdsync.torch.compression import CodecCompressor
from hvdsync.torch.data import LoaderSteps, PlanSampler, ShardedLoader
from hvdsync.torch.elastic import elastic_state, fit_elastic, run_elastic
from hvdsync.torch.evaluate import dataset_evaluator
from hvdsync.torch.layers import SyncBatchNormalization
from hvdsync.torch.models import CNN, local_optimizer, mlp
from hvdsync.torch.optimizer import broadcast_state, distributed_optimizer
from hvdsync.torch.runtime import init
from hvdsync.torch.train import TorchBackend, build, check_same_model, fit

__all__ = ["init", "fit", "build", "TorchBackend", "distributed_optimizer", "broadcast_state", "PlanSampler",
           "LoaderSteps", "ShardedLoader", "CodecCompressor", "SyncBatchNormalization", "mlp", "CNN",
           "local_optimizer", "Callback", "dataset_evaluator", "check_same_model",
           "elastic_state", "run_elastic", "fit_elastic"]
