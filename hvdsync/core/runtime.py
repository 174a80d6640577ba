"""What a worker knows about itself, framework-free."""
from __future__ import annotations

from dataclasses import dataclass

REDUCE_OP_NAMES = {"average": "Average", "sum": "Sum", "adasum": "Adasum"}


@dataclass(frozen=True)
class WorkerInfo:
    rank: int
    size: int
    local_rank: int
    local_size: int
