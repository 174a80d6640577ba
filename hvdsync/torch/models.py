"""hvdsync's built-in PyTorch models (registered as ``train.model`` names in :mod:`hvdsync.registry`)."""
from __future__ import annotations

import torch
from torch import nn


def mlp(n_features: int, hidden: int, n_classes: int) -> nn.Module:
    """A one-hidden-layer perceptron: enough for >= 0.9 test accuracy on digits in a few seconds."""
    return nn.Sequential(nn.Linear(n_features, hidden), nn.ReLU(), nn.Linear(hidden, n_classes))


class ResidualBlock(nn.Module):
    """Two 3x3 convolutions with a skip connection (He et al., 2016), at constant width and resolution.

    GroupNorm, not BatchNorm: its statistics are per sample, so a rank's share of a batch normalises exactly as the
    whole batch would, and 2 workers x B stay equal to 1 process x 2B (BatchNorm would need
    :class:`~hvdsync.torch.SyncBatchNormalization` for that).
    """

    def __init__(self, width: int, groups: int = 4) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(width, width, 3, padding=1, bias=False), nn.GroupNorm(groups, width), nn.ReLU(),
            nn.Conv2d(width, width, 3, padding=1, bias=False), nn.GroupNorm(groups, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x + self.body(x))


class CNN(nn.Module):
    """A small ResNet-style network for images: a 3x3 stem, ``blocks`` residual blocks, global average pooling and
    a linear classifier. Returns logits.

    Args:
        in_channels: image channels; n_classes: outputs.
        width: channels of every convolution (a multiple of 4).
        blocks: residual blocks.
        channels_last: inputs are ``(N, H, W, C)`` (hvdsync's bundled images) rather than PyTorch's ``(N, C, H, W)``.
    """

    def __init__(self, in_channels: int, n_classes: int, width: int = 16, blocks: int = 2,
                 channels_last: bool = False) -> None:
        super().__init__()
        self.channels_last = channels_last
        self.stem = nn.Sequential(nn.Conv2d(in_channels, width, 3, padding=1, bias=False),
                                  nn.GroupNorm(4, width), nn.ReLU())
        self.blocks = nn.Sequential(*(ResidualBlock(width) for _ in range(blocks)))
        self.head = nn.Linear(width, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.channels_last:
            x = x.permute(0, 3, 1, 2)
        return self.head(self.blocks(self.stem(x)).mean(dim=(2, 3)))


def build_mlp(cfg, data) -> nn.Module:
    """``train.model: mlp``: ``train.hidden`` units; image samples are flattened first."""
    model = mlp(data.n_features, cfg.train.hidden, data.n_classes)
    return model if len(data.input_shape) == 1 else nn.Sequential(nn.Flatten(), model)


def build_cnn(cfg, data) -> nn.Module:
    """``train.model: cnn``: :class:`CNN` of width ``train.hidden`` for ``(H, W, C)`` image data sets."""
    if len(data.input_shape) != 3:
        raise ValueError(f"train.model: 'cnn' is not allowed with samples of shape {data.input_shape}; it needs "
                         "images (height, width, channels): choose data.dataset digits_images or synthetic_images")
    return CNN(data.input_shape[-1], data.n_classes, width=cfg.train.hidden, channels_last=True)


def local_optimizer(cfg, model: nn.Module, lr: float) -> torch.optim.Optimizer:
    """The per-rank optimizer that :func:`hvdsync.torch.distributed_optimizer` wraps."""
    if cfg.train.optimizer == "adam":
        return torch.optim.Adam(model.parameters(), lr=lr)
    return torch.optim.SGD(model.parameters(), lr=lr, momentum=cfg.train.momentum)
