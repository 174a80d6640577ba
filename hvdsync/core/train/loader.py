"""The framework-free half of a sharded loader: which planned steps this rank reads in which epoch.

:class:`PlanLoader` reads in-memory arrays as the plan says and is a *step source* for the shared loop
(:func:`hvdsync.core.train.loop.fit_loop`): ``epoch_steps(epoch, start)`` yields ``(micro_batches, step)`` per optimizer
step. An adapter's ``ShardedLoader`` subclasses it and only turns the index arrays into its framework's tensors
(``hvdsync/tensorflow/data.py``: a ``tf.data`` pipeline); ``hvdsync.torch.PlanSampler`` is the step source for a
user's own ``torch.utils.data.Dataset`` read by a ``DataLoader``.
"""
from __future__ import annotations

from typing import Iterable, Iterator

import numpy as np

from hvdsync.core.train.shares import rebalanced
from hvdsync.core.train._plan import PlanState, ShardPlan, Step


class PlanLoader:
    """Arrays ``x``, ``y`` read by ``rank`` as ``plan`` says; ``set_epoch(e)`` before each epoch (like
    ``DistributedSampler``) picks that epoch's order."""

    def __init__(self, x: np.ndarray, y: np.ndarray, plan: ShardPlan, rank: int) -> None:
        if len(x) != plan.dataset_size or len(y) != plan.dataset_size:
            raise ValueError(f"x, y: {len(x)} and {len(y)} samples are not allowed with a plan over "
                             f"{plan.dataset_size}; expected both to hold plan.dataset_size samples")
        if not 0 <= rank < plan.world_size:
            raise ValueError(f"rank: {rank!r} is not allowed; expected 0 <= rank < {plan.world_size}")
        self.x, self.y, self.plan, self.rank, self.epoch = x, y, plan, rank, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.plan.steps_per_epoch(0, self.epoch)

    def set_shares(self, shares) -> None:
        """Each rank's fraction of every global step from now on (``None``: equal); :mod:`hvdsync.core.train.shares`."""
        self.plan = self.plan.with_shares(shares)

    def steps(self, epoch: int | None = None, start: int = 0) -> list[Step]:
        """This rank's steps in ``epoch`` (default: the one ``set_epoch`` chose), from global offset ``start``."""
        return self.plan.epoch(self.epoch if epoch is None else epoch, self.rank, start)

    def epoch_steps(self, epoch: int, start: int = 0) -> Iterator[tuple[list[tuple[np.ndarray, np.ndarray]], Step]]:
        """What the shared loop consumes: ``(micro_batches, step)`` per step, micro-batches as numpy ``(x, y)``."""
        for step in self.steps(epoch, start):
            yield [(self.x[m], self.y[m]) for m in step.micro], step


class PlanCursor:
    """A position in the plan that survives restarts and resizes: the framework-free core of a sampler.

    It holds ``(epoch, consumed)`` (a :class:`~hvdsync.core.train._plan.PlanState`); :meth:`micro_batches` lists the
    non-empty micro-batches this rank still has to read in the epoch (what a ``DataLoader``'s batch sampler yields;
    a loader cannot collate an empty batch) and :meth:`group` turns the loader's batches back into optimizer steps,
    advancing ``consumed`` as each step comes out. ``hvdsync.torch.PlanSampler`` is this plus ``torch``'s ``Sampler``
    base; the TensorFlow adapter shards ``tf.data`` with the same cursor.

    Args:
        plan: the shard plan (its ``world_size`` is this job's).
        rank: this worker's rank, ``0 <= rank < plan.world_size``.
    """

    def __init__(self, plan: ShardPlan, rank: int) -> None:
        if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or not 0 <= rank < plan.world_size:
            raise ValueError(f"rank: {rank!r} is not allowed; expected 0 <= rank < {plan.world_size} "
                             f"(the world has {plan.world_size} ranks)")
        self.plan, self.rank = plan, int(rank)
        self.epoch, self.consumed = 0, 0

    # ---- position --------------------------------------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` from its beginning, except when a state loaded mid-epoch points into that same epoch
        (then ``for epoch in range(start, E): set_epoch(epoch)`` resumes where the state says)."""
        mid_epoch = 0 < self.consumed < self.plan.dataset_size
        if not (epoch == self.epoch and mid_epoch):
            self.consumed = 0
        self.epoch = int(epoch)

    def state(self) -> PlanState:
        return PlanState(self.epoch, 0).advanced(self.plan, self.consumed)

    def state_dict(self) -> dict[str, int]:
        """``{"epoch", "consumed"}``: samples of the epoch's global order read by all ranks together. It does not
        depend on the world size: load it into a cursor of any size to continue with exactly the unread samples.
        Inside a loop over :meth:`group` the step just handed out counts as consumed (save after its update)."""
        return self.state().to_dict()

    def load_state_dict(self, state: dict) -> None:
        s = PlanState.from_dict(state)
        if s.consumed > self.plan.dataset_size:
            raise ValueError(f"consumed: {s.consumed} is not allowed; the plan has {self.plan.dataset_size} samples")
        self.epoch, self.consumed = s.epoch, s.consumed

    # ---- unequal shares (stragglers) ---------------------------------------------------------------------------
    def set_shares(self, shares) -> None:
        """Each rank's fraction of every global step from the next planned step on (``None``: equal). Every rank
        must set the same shares (:mod:`hvdsync.core.train.shares`); the position (``consumed``) stays valid."""
        self.plan = self.plan.with_shares(shares)

    def rebalance(self, work_seconds: float, allgather) -> tuple[float, ...]:
        """At the end of an epoch, on every rank: re-divide the next epochs' steps by each rank's throughput in this
        one (samples read over ``work_seconds``: its step time minus the all-reduce wait). Returns the new shares.
        The adapters' samplers pass their framework's ``allgather``."""
        shares = rebalanced(self.plan, self.epoch, self.rank, work_seconds, allgather)
        self.set_shares(shares)
        return shares

    # ---- what to read ------------------------------------------------------------------------------------------
    def planned_steps(self) -> list[Step]:
        """This rank's steps still to run in the current epoch."""
        return self.plan.epoch(self.epoch, self.rank, self.consumed)

    def micro_batches(self) -> Iterator[list[int]]:
        """The non-empty micro-batches of :meth:`planned_steps`, in order, as index lists. Planned now, at the
        call (a ``DataLoader`` calls it when its iterator is made), not lazily while :meth:`group` moves on."""
        return iter([m.tolist() for step in self.planned_steps() for m in step.micro if len(m)])

    def count_micro_batches(self) -> int:
        return sum(1 for s in self.planned_steps() for m in s.micro if len(m))

    def group(self, batches: Iterable) -> Iterator[tuple[list, Step]]:
        """``(micro_batches, step)`` per optimizer step, taking each step's non-empty micro-batches from ``batches``
        (the loaded batches of :meth:`micro_batches`, in order). A step may hold no batch on this rank (the short
        last step); it still comes out, so every rank takes part in every step's all-reduce."""
        steps = self.planned_steps()
        it = iter(batches)
        for step in steps:
            try:
                micro = [next(it) for m in step.micro if len(m)]
            except StopIteration:
                raise ValueError("batches: the loader ran out before the plan did; it must read this sampler's "
                                 "micro-batches (DataLoader(dataset, batch_sampler=sampler))") from None
            self.consumed += step.global_count
            yield micro, step
