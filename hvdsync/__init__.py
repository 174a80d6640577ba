"""hvdsync: synchronised data-parallel training on Horovod, for PyTorch and TensorFlow.

The framework-free core lives in :mod:`hvdsync.core`; the adapters are :mod:`hvdsync.torch` and
:mod:`hvdsync.tensorflow` (import the one you use); :mod:`hvdsync.launch.local` starts local workers.
"""
from hvdsync.config import Config, ConfigError, DataConfig, SyncConfig, TrackingConfig, TrainConfig

__version__ = "0.3.0.dev0"
__all__ = ["Config", "ConfigError", "SyncConfig", "DataConfig", "TrainConfig", "TrackingConfig", "__version__"]
