"""Co-design comparisons shared by both frameworks' lab modules (:mod:`hvdlab.torch.codesign`,
:mod:`hvdlab.tensorflow.codesign`)."""
from __future__ import annotations

from typing import Any, Callable

from hvdsync.config import Config


def compare_local_and_sync(framework: str, data, world: int, batch_sizes, epochs: int, lr: float, seed: int,
                           train: Callable[[Any, bool], Any]) -> list[dict]:
    """Local against synchronised batch norm per per-rank batch size, for either adapter's ``batchnorm_comparison``.

    ``train(cfg, synchronised)`` builds the adapter's model (from ``seed``) and returns its ``fit`` result; every run
    gets the same config but for the batch size, so the two kinds see the same samples and steps. One row per
    (batch size, kind): test accuracy, seconds, optimizer steps.
    """

    rows = []
    for batch in batch_sizes:
        for synchronised in (False, True):
            cfg = Config.from_dict({"data": {"batch_size": batch}, "tracking": {"enabled": False},
                                    "monitor": {"every": 0},
                                    "train": {"epochs": epochs, "lr": lr, "seed": seed, "framework": framework}})
            result = train(cfg, synchronised)
            rows.append({"framework": framework, "batch_per_rank": batch, "global_batch": batch * world,
                         "bn": "sync" if synchronised else "local", "test_accuracy": result.test_accuracy,
                         "seconds": result.total_seconds, "steps": result.optimizer_steps})
    return rows
