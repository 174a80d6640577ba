"""Runs inside 2 Horovod workers (sent by value): mixed precision's rank-consistent skip, for either framework.

tests/parallel/test_codecs.py asserts on the numbers; the codecs' training runs go through
``hvdsync.launch.train_many`` (one worker job for all codecs).
"""
import importlib

import numpy as np


def overflow_checks(framework: str, compressions=("none", "topk:0.01"), steps: int = 6, overflow_at: int = 3) -> dict:
    """fp16 with a dynamic loss scale: at step ``overflow_at`` only rank 0's gradients are made non-finite
    (:meth:`MixedPrecision.inject_overflow`). Returns, per compression, every step's loss scale, whether it stepped,
    the parameter change and the spread of parameter fingerprints across ranks."""
    from hvdsync.config import Config
    from hvdsync.core import data as datasets
    from hvdsync.core import monitor
    from hvdsync.core.scaling import loss_scale
    from hvdsync.core.sharding import ShardPlan

    adapter = importlib.import_module(f"hvdsync.{framework}")
    out = {}
    for spec in compressions:
        cfg = Config.from_dict({"sync": {"compression": spec}, "train": {"framework": framework, "precision": "fp16"},
                                "tracking": {"enabled": False}})
        adapter.init(cfg)
        data = datasets.load(cfg.data, cfg.train.seed)
        backend = adapter.build(cfg, data)
        plan = ShardPlan(len(data.x_train), backend.size, cfg.data.batch_size, 1, cfg.train.seed)
        rows = []
        for i, step in enumerate(plan.epoch(0, backend.rank)[:steps]):
            before = [p.copy() for p in backend.parameters()]
            scale_before = backend.precision.scale
            if i == overflow_at and backend.rank == 0:
                backend.precision.inject_overflow()
            skipped_before = backend.precision.skipped_steps
            backend.train_step([(data.x_train[m], data.y_train[m]) for m in step.micro],
                               loss_scale(step.global_count, backend.size, "average"))
            after = backend.parameters()
            rows.append({"scale_before": scale_before, "scale_after": backend.precision.scale,
                         "skipped": backend.precision.skipped_steps > skipped_before,
                         "change": float(max(np.abs(a - b).max() for a, b in zip(after, before))),
                         "spread": monitor.spread(backend.allgather(monitor.fingerprint(after)))})
        out[spec] = rows
    return out


# The digits runs: plain SGD (no momentum; see README, "Gradient compression": momentum with top-k's error feedback
# needs DGC's momentum correction, which hvdsync does not do) at lr 0.5, 10 epochs of 2 x 32 samples (220 steps).
TRAIN = {"epochs": 10, "optimizer": "sgd", "momentum": 0.0, "lr": 0.5}
# (compression, error feedback, the accuracy each must reach on digits). none reaches 0.951 with these settings.
CODECS = [("none", True, 0.94), ("fp16", True, 0.94), ("bf16", True, 0.94), ("topk:0.01", True, 0.94),
          ("topk:0.01", False, 0.85), ("randk:0.1", True, 0.93), ("int8", True, 0.94), ("powersgd:2", True, 0.93)]


def configs(framework: str) -> list[dict]:
    from hvdsync.config import Config

    return [Config.from_dict({"sync": {"compression": spec, "error_feedback": ef},
                              "train": {"framework": framework, **TRAIN}, "tracking": {"enabled": False}}).to_dict()
            for spec, ef, _ in CODECS]


def all_checks(framework: str) -> dict:
    """One worker job per framework: every codec trains digits (ranks compared after every step), then the
    forced-overflow checks."""
    from hvdsync.launch import fit_many

    return {"runs": fit_many(configs(framework), check_every_step=True), "overflow": overflow_checks(framework)}
