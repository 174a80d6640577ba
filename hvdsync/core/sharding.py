"""Moved: :mod:`hvdsync.core.train.sharding` (``ShardPlan``, ``Step``, ...). This path imports, with a
DeprecationWarning naming the new one, until hvdsync 0.3.0."""
from hvdsync.core._moved import forward

__getattr__ = forward(__name__, "hvdsync.core.train.sharding", until="0.3.0")
