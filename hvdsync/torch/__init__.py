"""hvdsync for PyTorch: the same names as :mod:`hvdsync.tensorflow`.

    init, fit, build, TorchBackend, distributed_optimizer, broadcast_state, ShardedLoader, CodecCompressor,
    SyncBatchNormalization, mlp, local_optimizer, elastic_state, run_elastic, fit_elastic
"""
from hvdsync.torch.compression import CodecCompressor
from hvdsync.torch.data import ShardedLoader
from hvdsync.torch.elastic import elastic_state, fit_elastic, run_elastic
from hvdsync.torch.layers import SyncBatchNormalization
from hvdsync.torch.models import local_optimizer, mlp
from hvdsync.torch.optimizer import broadcast_state, distributed_optimizer
from hvdsync.torch.runtime import init
from hvdsync.torch.train import TorchBackend, build, fit

__all__ = ["init", "fit", "build", "TorchBackend", "distributed_optimizer", "broadcast_state", "ShardedLoader",
           "CodecCompressor", "SyncBatchNormalization", "mlp", "local_optimizer", "elastic_state", "run_elastic",
           "fit_elastic"]
