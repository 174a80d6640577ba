"""Evaluation of a user's ``Dataset`` for the shared loop: each rank scores its share, the loop adds them up."""
from __future__ import annotations

from typing import Callable, Sequence

import horovod.torch as hvd
import torch
from torch.utils.data import DataLoader, Subset

from hvdsync.core.train.shares import share_slice


def dataset_evaluator(model: torch.nn.Module, dataset, batch_size: int = 256,
                      shares: Callable[[], Sequence[float] | None] | None = None) -> Callable[[], dict]:
    """``evaluate()`` for :func:`hvdsync.core.train.loop.fit_loop`: accuracy of ``model`` (argmax of its outputs) on the
    ``(input, label)`` samples of ``dataset``, on the device the model's parameters are on. Each rank scores its
    contiguous part, cut by ``shares()`` (the shares of the training steps in force; ``None`` or no ``shares``:
    equal parts; a slow rank scores fewer, as it trains on fewer); it returns ``{"test_accuracy": (correct,
    count)}`` and the loop sums both over ranks, so the figure is over the whole set. The same arguments as
    :func:`hvdsync.tensorflow.dataset_evaluator`."""

    @torch.no_grad()
    def evaluate() -> dict:
        part = share_slice(len(dataset), hvd.rank(), hvd.size(), shares() if shares is not None else None)
        device = next(model.parameters()).device
        model.eval()
        correct, count = 0, 0
        try:
            for x, y in DataLoader(Subset(dataset, range(part.start, part.stop)), batch_size=batch_size):
                predicted = model(x.to(device)).argmax(dim=1).cpu()
                correct += int((predicted == torch.as_tensor(y)).sum())
                count += len(y)
        finally:
            model.train()
        return {"test_accuracy": (correct, count)}

    return evaluate
