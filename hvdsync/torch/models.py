"""The small models the examples, tests and notebooks train."""
from __future__ import annotations

import torch
from torch import nn


def mlp(n_features: int, hidden: int, n_classes: int) -> nn.Module:
    """A one-hidden-layer perceptron: enough for >= 0.9 test accuracy on digits in a few seconds."""
    return nn.Sequential(nn.Linear(n_features, hidden), nn.ReLU(), nn.Linear(hidden, n_classes))


def local_optimizer(cfg, model: nn.Module, lr: float) -> torch.optim.Optimizer:
    """The per-rank optimizer that :func:`hvdsync.torch.distributed_optimizer` wraps."""
    if cfg.train.optimizer == "adam":
        return torch.optim.Adam(model.parameters(), lr=lr)
    return torch.optim.SGD(model.parameters(), lr=lr, momentum=cfg.train.momentum)
