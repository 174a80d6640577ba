"""The sequential reference: what one process without Horovod computes on the same global batches.

Synchronous data parallelism promises that N workers x B samples take exactly the steps of one process on N x B;
the tests and the notebooks check it against this one function rather than each writing its own loop.
"""
from __future__ import annotations

from typing import Callable, Iterable, Iterator

import numpy as np
import torch
import torch.nn.functional as F

from hvdsync.core.train._plan import ShardPlan


def global_batches(plan: ShardPlan, epochs: int = 1, steps: int | None = None) -> Iterator[np.ndarray]:
    """The global batches of ``plan`` in order (all ranks' samples of each step), over ``epochs`` epochs, at most
    ``steps`` of them: what one process reads when it takes the whole global step alone."""
    taken = 0
    for epoch in range(epochs):
        order = plan.order(epoch)
        for lo in range(0, plan.dataset_size, plan.global_batch):
            if steps is not None and taken >= steps:
                return
            taken += 1
            yield order[lo:lo + plan.global_batch]


def sequential_sgd(model: torch.nn.Module, x: np.ndarray, y: np.ndarray, batches: Iterable[np.ndarray], lr: float,
                   momentum: float = 0.0, loss: Callable | None = None,
                   on_step: Callable[[int, torch.nn.Module], None] | None = None) -> list[np.ndarray]:
    """Train ``model`` in place with plain ``torch.optim.SGD``, one process, no Horovod, no hvdsync scaling: the
    batch *mean* loss on each index array of ``batches``. Returns the final parameters as numpy copies.

    Args:
        model: the model, already holding the start parameters.
        x, y: the training arrays; batches: index arrays, e.g. :func:`global_batches`.
        lr, momentum: the SGD settings. loss: ``loss(outputs, targets)`` (batch mean); default cross-entropy.
        on_step: ``on_step(i, model)`` after step ``i`` (0-based), e.g. to compare with a parallel run step by step.

    Example:
        >>> ref = sequential_sgd(mlp(64, 32, 10), x, y, global_batches(plan, steps=12), lr=0.2)  # doctest: +SKIP
    """
    loss = loss if loss is not None else F.cross_entropy
    sgd = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    for i, idx in enumerate(batches):
        sgd.zero_grad()
        loss(model(torch.from_numpy(x[idx])), torch.from_numpy(y[idx])).backward()
        sgd.step()
        if on_step is not None:
            on_step(i, model)
    return [p.detach().numpy().copy() for p in model.parameters()]
