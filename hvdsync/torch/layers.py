"""Synchronised batch normalisation for PyTorch: batch statistics over the samples of *all* ranks.

Horovod's own ``horovod.torch.SyncBatchNorm`` only runs on GPU tensors; this one runs on CPU and GPU, and mirrors
:class:`hvdsync.tensorflow.layers.SyncBatchNormalization`: each rank all-reduces (sum) its per-channel
``[sum, sum of squares, count]`` once per call and normalises with the global mean and variance
(:func:`hvdsync.core.train.batchnorm.global_moments`). Horovod's allreduce is differentiable (its backward all-reduces
the incoming gradients), so gradients flow to every rank's inputs without a hand-written backward.
"""
from __future__ import annotations

import horovod.torch as hvd
import torch
from torch import nn

from hvdsync.core.train.batchnorm import global_moments


class SyncBatchNormalization(nn.BatchNorm1d):
    """``nn.BatchNorm1d`` (inputs ``(N, C)`` or ``(N, C, L)``) whose training statistics are reduced across workers.

    In eval mode it uses the running statistics and communicates nothing. Every rank must call it in training mode
    the same number of times (each call is an all-reduce).
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or hvd.size() == 1:
            return super().forward(x)
        axes = [0] + list(range(2, x.dim()))
        count = torch.full((x.shape[1],), x.numel() / max(1, x.shape[1]), dtype=x.dtype, device=x.device)
        local = torch.stack([x.sum(axes), (x * x).sum(axes), count])
        # No name: Horovod numbers unnamed requests in call order, which is the same on every rank.
        total = hvd.allreduce(local, op=hvd.Sum)
        mean, var = global_moments(total, torch.clamp_min)
        with torch.no_grad():
            n = float(total[2][0])
            m = self.momentum if self.momentum is not None else 1.0 / float(self.num_batches_tracked + 1)
            self.running_mean.mul_(1 - m).add_(m * mean.detach())
            # Like nn.BatchNorm: running variance uses the unbiased estimate.
            self.running_var.mul_(1 - m).add_(m * var.detach() * n / max(1.0, n - 1))
            self.num_batches_tracked += 1
        shape = [1, -1] + [1] * (x.dim() - 2)
        y = (x - mean.view(shape)) / torch.sqrt(var.view(shape) + self.eps)
        return y * self.weight.view(shape) + self.bias.view(shape) if self.affine else y
