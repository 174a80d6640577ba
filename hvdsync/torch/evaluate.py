"""Evaluation of a user's ``Dataset`` for the shared loop: each rank scores its share, the loop adds them up."""
from __future__ import annotations

from typing import Callable

import horovod.torch as hvd
import torch
from torch.utils.data import DataLoader, Subset


def dataset_evaluator(model: torch.nn.Module, dataset, batch_size: int = 256,
                      device: torch.device | None = None) -> Callable[[], dict]:
    """``evaluate()`` for :func:`hvdsync.core.loop.fit_loop`: accuracy of ``model`` (argmax of its outputs) on the
    ``(input, label)`` samples of ``dataset``. Rank ``r`` scores samples ``r, r + size, ...``; it returns
    ``{"test_accuracy": (correct, count)}`` and the loop sums both over ranks, so the figure is over the whole set."""
    share = Subset(dataset, range(hvd.rank(), len(dataset), hvd.size()))
    device = device or torch.device("cpu")

    @torch.no_grad()
    def evaluate() -> dict:
        model.eval()
        correct, count = 0, 0
        try:
            for x, y in DataLoader(share, batch_size=batch_size):
                predicted = model(x.to(device)).argmax(dim=1).cpu()
                correct += int((predicted == torch.as_tensor(y)).sum())
                count += len(y)
        finally:
            model.train()
        return {"test_accuracy": (correct, count)}

    return evaluate
