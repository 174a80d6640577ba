"""Deprecated path: ``ShardPlan``, ``Step`` and ``PlanState`` are ``hvdsync.torch``'s and ``hvdsync.tensorflow``'s.
Imported from here they warn, naming the adapter, until hvdsync 0.4.0; hvdsync imports them from
:mod:`hvdsync.core.train._plan`, a private module so that the product's own imports never warn."""
from hvdsync.core._moved import to_adapters

__getattr__ = to_adapters(__name__, dict.fromkeys(("ShardPlan", "Step", "PlanState"), "hvdsync.core.train._plan"), until="0.4.0")
