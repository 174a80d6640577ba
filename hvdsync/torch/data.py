"""Data for PyTorch by the core plan (:class:`hvdsync.torch.ShardPlan`): a batch sampler for the user's own ``Dataset``
read by a ``DataLoader``, and a loader over in-memory arrays."""
from __future__ import annotations

from typing import Iterator, Sized

import horovod.torch as hvd
import numpy as np
import torch
from torch.utils.data import Sampler

from hvdsync.core.train.loader import PlanCursor, PlanLoader
from hvdsync.core.train._scaling import loss_scale
from hvdsync.core.train._plan import ShardPlan, Step


class PlanSampler(PlanCursor, Sampler):
    """A ``DataLoader`` batch sampler that reads this rank's share of the global plan, micro-batch by micro-batch.

    Every sample is read exactly once per epoch over all ranks; every rank runs the same number of steps (so no rank
    waits in an all-reduce another never joins); the micro-batches of a step come out in order, also with
    ``num_workers > 0``. :meth:`steps` turns the loader's batches back into optimizer steps, and :meth:`scale` is
    the factor for a micro-batch's *summed* loss that keeps every sample's weight at 1 / (samples in the global
    step), also on the short last step. ``state_dict()`` holds ``(epoch, consumed)``: loaded into a fresh sampler,
    also one for another world size, it continues the epoch with exactly the unread samples.

    Args:
        dataset: the data set (or its length).
        batch_size: samples per rank per optimizer step (split into ``accumulate`` micro-batches).
        accumulate: micro-batches per optimizer step.
        seed: the global seed of the epochs' order; shuffle: False reads 0..N-1 every epoch.
        rank, world_size: default ``hvd.rank()`` and ``hvd.size()`` (after ``init``).
        op: Horovod's reduce op (``average``, ``sum``), for :meth:`scale`.
        growth: ``{epoch: factor}``, a batch that grows over the epochs (``data.batch_growth``).

    Straggler-aware shares in your own loop: at each epoch's end call ``sampler.rebalance(work_seconds)`` on every
    rank (your seconds of reading, forward and backward; not the wait in ``optimizer.synchronize()``); the next
    epochs give each rank a share of every global step proportional to its throughput (:mod:`hvdsync.core.train.shares`),
    with the same guarantees.

    Example::

        sampler = PlanSampler(dataset, batch_size=32, accumulate=2)
        loader = DataLoader(dataset, batch_sampler=sampler, num_workers=2, pin_memory=True)
        for epoch in range(epochs):
            sampler.set_epoch(epoch)
            for micro, step in sampler.steps(loader):
                opt.zero_grad()
                for x, y in micro:  # why summed, times scale: the gradient is the mean over the global step
                    (F.cross_entropy(model(x), y, reduction="sum") * sampler.scale(step)).backward()
                opt.step()
    """

    def __init__(self, dataset: Sized | int, batch_size: int, accumulate: int = 1, seed: int = 0,
                 shuffle: bool = True, rank: int | None = None, world_size: int | None = None,
                 op: str = "average", growth=()) -> None:
        size = dataset if isinstance(dataset, int) else len(dataset)
        world_size = hvd.size() if world_size is None else world_size
        plan = ShardPlan(size, world_size, batch_size, accumulate, seed, shuffle, growth=growth)
        super().__init__(plan, hvd.rank() if rank is None else rank)
        loss_scale(1, world_size, op)  # checks op now, not at the first step
        self.op = op

    @classmethod
    def from_plan(cls, plan: ShardPlan, rank: int | None = None, op: str = "average") -> "PlanSampler":
        """The sampler for an existing plan (world size, shares, growth and all)."""
        sampler = cls(plan.dataset_size, plan.batch_size, plan.accumulate, plan.seed, plan.shuffle, rank,
                      plan.world_size, op, plan.growth)
        sampler.set_shares(plan.shares)
        return sampler

    @classmethod
    def from_config(cls, cfg, dataset: Sized | int, rank: int | None = None,
                    world_size: int | None = None) -> "PlanSampler":
        """Batch size, accumulation, seed, shuffle, op and batch growth from a :class:`hvdsync.config.Config`."""
        return cls(dataset, cfg.data.batch_size, cfg.sync.accumulate, cfg.train.seed, cfg.data.shuffle, rank,
                   world_size, cfg.sync.op, cfg.data.batch_growth)

    def __iter__(self) -> Iterator[list[int]]:
        return self.micro_batches()

    def __len__(self) -> int:
        return self.count_micro_batches()

    def steps(self, loader) -> Iterator[tuple[list, Step]]:
        """``(micro_batches, step)`` per optimizer step from ``loader`` (a ``DataLoader`` over this sampler)."""
        return self.group(loader)

    def rebalance(self, work_seconds: float, allgather=None) -> tuple[float, ...]:
        """Re-divide the next epochs' global steps by each rank's throughput in this one (all-gathered through
        Horovod); call it on every rank at the epoch's end. Returns the new shares."""
        return super().rebalance(work_seconds, allgather or _allgather)

    def scale(self, step: Step) -> float:
        """The factor for a micro-batch's summed loss in ``step`` (:func:`hvdsync.torch.loss_scale`)."""
        return loss_scale(step.global_count, self.plan.world_size, self.op)


def _allgather(values: np.ndarray) -> np.ndarray:
    return hvd.allgather(torch.as_tensor(values).reshape(1, -1), name="hvdsync.shares").numpy()


class LoaderSteps:
    """A ``DataLoader`` over a :class:`PlanSampler`, as a step source for :func:`hvdsync.core.train.loop.fit_loop`."""

    def __init__(self, loader: torch.utils.data.DataLoader) -> None:
        sampler = loader.batch_sampler
        if not isinstance(sampler, PlanSampler):
            raise ValueError(f"train: a DataLoader with batch_sampler {type(sampler).__name__} is not allowed; "
                             "build it with DataLoader(dataset, batch_sampler=hvdsync.torch.PlanSampler(...))")
        self.loader, self.sampler, self.plan = loader, sampler, sampler.plan

    def set_shares(self, shares) -> None:
        self.sampler.set_shares(shares)
        self.plan = self.sampler.plan

    def epoch_steps(self, epoch: int, start: int = 0) -> Iterator[tuple[list, Step]]:
        self.sampler.load_state_dict({"epoch": epoch, "consumed": start})
        return self.sampler.steps(self.loader)


class ShardedLoader(PlanLoader):
    """Yields this rank's planned steps of in-memory arrays as tensors: ``(micro_batches, step)`` per step.

    ``micro_batches`` is a list of ``plan.accumulate`` ``(x, y)`` tensor pairs (zero-copy views of the numpy
    arrays); ``step.global_count`` is what :func:`hvdsync.torch.loss_scale` needs. Every rank gets the same
    number of steps and micro-batches, so collectives never wait on a rank that ran out of data. Call
    ``set_epoch(e)`` before each epoch (like ``DistributedSampler``). For a ``Dataset`` read by a ``DataLoader``
    use :class:`PlanSampler`.

    Example:
        >>> loader = ShardedLoader(x, y, ShardPlan(len(x), hvd.size(), 32), hvd.rank())  # doctest: +SKIP
        >>> for micro, step in loader: ...                                               # doctest: +SKIP
    """

    def __iter__(self) -> Iterator[tuple[list[tuple[torch.Tensor, torch.Tensor]], Step]]:
        for step in self.steps():
            yield [(torch.from_numpy(self.x[i]), torch.from_numpy(self.y[i])) for i in step.micro], step
