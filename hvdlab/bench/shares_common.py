"""What both parts of ``benchmarks/shares.py`` share: the data set, the batch, the run's config and the slowdown.

    compare     equal against adaptive shares, with the bound of perfect shares (the runner's own ``main``)
    timeline    every phase of every step on both ranks (:mod:`hvdlab.bench.shares_timeline`)

Both train the same MLP on the same synthetic samples, with rank 1 computing :data:`SLOWDOWN` times slower (the
lab's straggler, :class:`hvdlab.straggler.SlowRank`) in the equal and adaptive runs.
"""
from __future__ import annotations

# Enough compute per step (a 64-1024-10 MLP, 2048 samples per rank) that a rank's speed, not the all-reduce or
# Python's per-step overhead, decides the step time: what unequal shares can fix.
SAMPLES = 65536

# Rank 1 computes this many times slower in the equal and adaptive runs.
SLOWDOWN = 2.0


def batch_for(samples: int) -> int:
    """Samples per rank per step: 2048, or a 16th of a smaller data set."""
    return min(2048, samples // 16)


def config(framework: str, epochs: int, hidden: int = 1024, samples: int = SAMPLES, **data):
    from hvdsync.config import Config

    return Config.from_dict({
        "data": {"dataset": "synthetic", "synthetic_samples": samples, "batch_size": batch_for(samples), **data},
        "train": {"framework": framework, "epochs": epochs, "hidden": hidden, "lr": 0.05},
        "tracking": {"enabled": False}, "monitor": {"every": 0}})
