"""What goes wrong without a global plan, for teaching (notebook 02) and for the tests that show the failure; the
plan that does it right is :class:`hvdsync.torch.ShardPlan`."""
from __future__ import annotations

import numpy as np


def naive_shards(dataset_size: int, world_size: int, rank: int, seed: int | None) -> np.ndarray:
    """What goes wrong without a global plan: each rank shuffles on its own seed and takes every W-th sample.

    With ``seed=None`` every rank draws an unseeded order (as a script that forgets to seed would); with
    per-rank seeds the orders differ too. Either way samples are read twice or never.
    """
    rng = np.random.default_rng(None if seed is None else [seed, rank])
    return rng.permutation(dataset_size)[rank::world_size]
