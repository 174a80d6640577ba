"""Sync modes side by side on PyTorch, for the notebooks and tests that compare them on one pair of workers."""
from __future__ import annotations

import torch

from hvdlab import modes
from hvdsync.torch.runtime import init
from hvdsync.torch.schemes import GossipOptimizer
from hvdsync.torch.train import build


def train_modes(cfg_dict: dict, runs: dict[str, dict], track_consensus: bool = True,
                trace: bool = False) -> dict[str, dict]:
    """Train the same model from the same start once per entry of ``runs`` (name -> ``sync`` overrides) in this
    worker; every rank calls it (e.g. through :func:`hvdsync.launch.local.run`). For notebooks and tests that compare
    sync modes side by side on one pair of workers; what it returns: :func:`hvdlab.modes.train_modes`.

    Example::

        out = launch.run(train_modes, args=(cfg.to_dict(), {"ring": {}, "ps": {"mode": "ps"}}), np=2)[0]
    """
    def prepare(opt) -> None:
        if isinstance(opt, GossipOptimizer):
            opt.track_consensus = track_consensus

    return modes.train_modes(cfg_dict, runs, init, build, torch.manual_seed, prepare, trace)
