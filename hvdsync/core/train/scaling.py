"""Deprecated path: ``loss_scale``, ``scaled_lr``, ``warmup_lr`` and ``grown_lr`` are ``hvdsync.torch``'s and
``hvdsync.tensorflow``'s. Imported from here they warn, naming the adapter, until hvdsync 0.4.0; hvdsync imports
them from :mod:`hvdsync.core.train._scaling`, a private module so that the product's own imports never warn."""
from hvdsync.core._moved import to_adapters

__getattr__ = to_adapters(__name__, dict.fromkeys(("loss_scale", "scaled_lr", "warmup_lr", "grown_lr"),
                                                         "hvdsync.core.train._scaling"), until="0.4.0")
