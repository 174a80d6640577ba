"""Moved in 0.2.0 (to ``hvdsync.core.train.sharding``, itself deprecated in 0.3.0): ``ShardPlan``, ``Step`` and
``PlanState`` are the adapters' public names (``hvdsync.torch.ShardPlan``, ``hvdsync.tensorflow.ShardPlan``). This
path imports, with a DeprecationWarning naming the adapter, until 0.3.0."""
from hvdsync.core._moved import to_adapters

__getattr__ = to_adapters(__name__, dict.fromkeys(("ShardPlan", "Step", "PlanState"), "hvdsync.core.train._plan"),
                          until="0.3.0")
