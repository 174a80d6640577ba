"""``fit`` for PyTorch: a :class:`TorchBackend` (model, Horovod optimizer) driven by the shared loop.

Launch with hvdsync's launcher (``hvdsync train --framework torch --np 2``) or inside any Horovod job::

    horovodrun -np 2 -H localhost:2 --gloo python examples/train_torch.py
"""
from __future__ import annotations

import horovod.torch as hvd
import numpy as np
import torch
import torch.nn.functional as F

from hvdsync.core import data as datasets
from hvdsync.core import seeding
from hvdsync.core.codecs import WireCounter
from hvdsync.core.loop import FitResult, fit_with
from hvdsync.core.profiling import PhaseTimer
from hvdsync.core.scaling import scaled_lr
from hvdsync.torch.models import local_optimizer, mlp
from hvdsync.torch.optimizer import broadcast_state, distributed_optimizer
from hvdsync.torch.precision import MixedPrecision
from hvdsync.torch.runtime import device, init


class TorchBackend:
    """The PyTorch side of :class:`hvdsync.core.loop.Backend`."""

    framework = "torch"

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, sync, precision: str = "fp32",
                 seed: int = 0, broadcast: bool = True) -> None:
        self.rank, self.size = hvd.rank(), hvd.size()
        self.device = device()
        self.model = model.to(self.device)
        self.wire = WireCounter()
        self.timer = PhaseTimer()
        self.optimizer = distributed_optimizer(optimizer, model, sync, self.wire, seed)
        self.precision = MixedPrecision(precision, self.device)  # autocast, loss scale, rank-consistent skip
        self.precision.attach(self.optimizer)
        if broadcast:  # an elastic job broadcasts in its state's first sync instead (hvdsync.torch.elastic)
            broadcast_state(self.model, self.optimizer)
        self.wire.reset()  # the optimizer-state broadcast is not gradient traffic

    def refresh(self) -> None:
        """Re-read rank and world size (they change when an elastic job resets)."""
        self.rank, self.size = hvd.rank(), hvd.size()

    @property
    def grad_tensors(self) -> int:
        return sum(1 for p in self.model.parameters() if p.requires_grad)

    def train_step(self, micro, scale: float) -> float:
        self.optimizer.zero_grad()
        total = 0.0
        for x, y in micro:
            with self.timer.phase("compute"):
                with self.precision.autocast():
                    logits = self.model(torch.as_tensor(x).to(self.device))
                    loss = F.cross_entropy(logits, torch.as_tensor(y).to(self.device), reduction="sum")
                # Summed loss times the global-step scale (hvdsync.core.scaling): backward passes *add* into .grad,
                # so after `accumulate` passes the gradient is the mean over the whole global step.
                self.precision.backward(loss * scale)
            total += float(loss.detach())
        with self.timer.phase("sync_wait"):
            # Horovod started the all-reduce asynchronously from the last backward pass's hooks; wait for it here.
            self.optimizer.synchronize()
        with self.timer.phase("update"):
            self.precision.step(self.optimizer)  # skipped on every rank if any rank's fp16 gradients overflowed
        return total

    @torch.no_grad()
    def count_correct(self, x: np.ndarray, y: np.ndarray) -> int:
        self.model.eval()
        try:
            logits = self.model(torch.as_tensor(x).to(self.device))
            return int((logits.argmax(dim=1).cpu() == torch.as_tensor(y)).sum())
        finally:
            self.model.train()

    def allgather(self, values: np.ndarray) -> np.ndarray:
        t = torch.as_tensor(np.asarray(values, dtype=np.float64)).reshape(1, -1)
        return hvd.allgather(t, name="hvdsync.metrics").numpy().reshape((self.size,) + np.shape(values))

    def parameters(self) -> list[np.ndarray]:
        return [p.detach().cpu().numpy() for p in self.model.parameters()]

    @torch.no_grad()
    def grad_norm(self) -> float:
        """L2 norm of the last step's (all-reduced) gradient, for the monitor."""
        grads = [p.grad.detach().double().norm() for p in self.model.parameters() if p.grad is not None]
        return float(torch.stack(grads).norm()) if grads else 0.0


def build(cfg, data: datasets.Dataset, broadcast: bool = True) -> TorchBackend:
    """Model, local optimizer (learning rate scaled per ``train.lr_scaling``) and Horovod wrapping; ``broadcast``
    rank 0's state now (an elastic job leaves that to its state's first sync)."""
    model = mlp(data.n_features, cfg.train.hidden, data.n_classes)
    optimizer = local_optimizer(cfg, model, scaled_lr(cfg.train.lr, hvd.size(), cfg.train.lr_scaling))
    backend = TorchBackend(model, optimizer, cfg.sync, cfg.train.precision, cfg.train.seed, broadcast=broadcast)
    # The model was built from the global seed (identical start, then broadcast anyway); from here on torch's
    # generator draws per rank, so dropout masks and noise differ between ranks as they should (notebook 02).
    torch.manual_seed(seeding.rank_seed(cfg.train.seed, hvd.rank()))
    return backend


def fit(cfg=None, data: datasets.Dataset | None = None, before_step=None) -> FitResult:
    """Initialise this PyTorch worker, build the model, train it (:func:`hvdsync.core.loop.fit_with`); returns
    this rank's :class:`~hvdsync.core.loop.FitResult`. ``cfg`` defaults to ``Config()``, ``data`` to the dataset
    ``cfg.data`` names; ``before_step(epoch, step)`` is an optional hook."""
    return fit_with(init, build, cfg, data, before_step)
