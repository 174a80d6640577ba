"""Notebook 07 §5: a model on which Horovod's hooks can hide nearly all of the all-reduce.

Two things leave communication exposed after backward: a bucket whose transfer takes longer than the backward
compute that follows it (the transfers queue up and run on), and the last gradient of all, which is ready only when
backward ends. :func:`model` avoids both: each 1024 x 1024 layer's backward (~1 GFLOP at batch 256) takes longer than
its 4 MiB gradient's all-reduce here, and the input end is a layer with few parameters but much compute (an 8 -> 1024
projection applied to every one of ``tokens`` positions, then averaged), so that the last big gradient's transfer
runs while the input end is still differentiated, and the input end's own gradient (33 kB) is small.

:func:`probe` runs it through :mod:`hvdlab.torch.overlap`'s measurement (the hooks, and everything after backward).
"""
from __future__ import annotations

import horovod.torch as hvd
import torch
from torch import nn

from hvdlab.torch import overlap


class _MeanOverTokens(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=1)


def model(big: int = 1024, n_big: int = 4, features: int = 8) -> nn.Sequential:
    """(batch, tokens, features) -> Linear(features, big) per token, ReLU, mean over tokens -> ``n_big`` Linear(big,
    big) with ReLUs between."""
    layers: list[nn.Module] = [nn.Linear(features, big), nn.ReLU(), _MeanOverTokens()]
    for i in range(n_big):
        layers.append(nn.Linear(big, big))
        if i < n_big - 1:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def probe(batch: int = 256, tokens: int = 32, steps: int = 4, warmup: int = 1, seed: int = 0,
          variants: tuple[str, ...] = overlap.VARIANTS, **sizes) -> list[dict]:
    """In every worker of a Horovod job started with ``HOROVOD_TIMELINE``: per variant, the rows of
    :func:`hvdlab.torch.overlap.probe` (time segment, backward windows, ready stamps, step times, bytes) for
    :func:`model`."""
    hvd.init()
    torch.set_num_threads(1)
    rows = []
    for variant in variants:
        torch.manual_seed(seed)   # a fresh model per variant: Horovod's hooks stay on the parameters they were given
        net = model(**sizes)
        x = torch.randn(batch, tokens, net[0].in_features)
        rows.append(overlap._run(net, variant, x, steps, warmup))
    return rows
