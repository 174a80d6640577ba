"""Moved in 0.2.0 (to ``hvdsync.core.train.scaling``, itself deprecated in 0.3.0): ``loss_scale``, ``scaled_lr``,
``warmup_lr`` and ``grown_lr`` are the adapters' public names (``hvdsync.torch.loss_scale``,
``hvdsync.tensorflow.loss_scale``). This path imports, with a DeprecationWarning naming the adapter, until 0.3.0."""
from hvdsync.core._moved import to_adapters

__getattr__ = to_adapters(__name__, dict.fromkeys(("loss_scale", "scaled_lr", "warmup_lr", "grown_lr"),
                                                  "hvdsync.core.train._scaling"), until="0.3.0")
