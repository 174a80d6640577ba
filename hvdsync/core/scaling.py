"""Moved: :mod:`hvdsync.core.train.scaling` (``loss_scale``, ``scaled_lr``, ...). This path imports, with a
DeprecationWarning naming the new one, until hvdsync 0.3.0."""
from hvdsync.core._moved import forward

__getattr__ = forward(__name__, "hvdsync.core.train.scaling", until="0.3.0")
