"""The global data plan: which sample indices each rank reads, per epoch and per step.

The rule (also in the README):

* Every epoch has one global order: a permutation seeded by ``(seed, epoch)`` only, so it is the same on every
  rank and does not depend on the number of workers.
* The order is cut into global steps of ``world_size * batch_size`` samples. Each global step is split among the
  ranks as evenly as possible (``numpy.array_split``: sizes differ by at most one), and each rank's share is split
  again into ``accumulate`` micro-batches.
* So every index is read exactly once per epoch, none is skipped, and every rank runs the same number of steps and
  micro-steps. That last point is what prevents the classic deadlock: with per-rank shards of uneven length one
  rank would call allreduce once more than the others and wait forever. On the last, shorter step a rank may get a
  smaller (even empty) micro-batch; :func:`hvdsync.core.train._scaling.loss_scale` weights each rank's loss by its share of
  the global step, so the update still equals a single process's update on the same samples.
* Unequal shares (``shares``, :mod:`hvdsync.core.train.shares`): each global step is cut in rank order into pieces of
  ``shares[r]`` of its samples (largest remainders), so a slow rank reads fewer. The cut is the only thing that
  changes: the same global step, the same number of steps and micro-batches on every rank, every sample once, and
  the same loss scale (which already weighs each rank by its local count, ``Step.weight``).
* A growing batch (``growth``: ``((epoch, factor), ...)``): from ``epoch`` on the batch is ``factor`` times
  ``batch_size``, so the epoch has fewer, larger steps (fewer all-reduces).
"""
# Private home of ShardPlan, Step, PlanState: their public names are the adapters' (hvdsync.torch.X, hvdsync.tensorflow.X), and
# hvdsync.core.train.sharding (the path documented before 0.3.0) forwards them with a DeprecationWarning until 0.4.0. hvdsync
# imports them from here so that it never warns; a private name, not a new public module, so the core gets no
# second documented path for them.
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from hvdsync.core.train.shares import check_shares, parse_growth, split_counts


@dataclass(frozen=True)
class Step:
    """One optimizer step as seen by one rank.

    Attributes:
        micro: ``accumulate`` index arrays, the micro-batches this rank reads (some may be empty on the last step).
        global_count: samples in this step over all ranks and micro-batches (the denominator of the mean loss).
    """

    micro: tuple[np.ndarray, ...]
    global_count: int

    @property
    def local_count(self) -> int:
        return int(sum(len(m) for m in self.micro))

    @property
    def indices(self) -> np.ndarray:
        return np.concatenate(self.micro) if self.micro else np.empty(0, dtype=np.int64)

    @property
    def weight(self) -> float:
        """This rank's weight in the step's gradient (its samples over the step's): the weights of all ranks sum to
        one, which is what :func:`hvdsync.core.train._scaling.loss_scale` gives each rank's summed loss."""
        return self.local_count / self.global_count if self.global_count else 0.0


@dataclass(frozen=True)
class ShardPlan:
    """Which samples each rank reads.

    Args:
        dataset_size: number of samples in the (training) set.
        world_size: number of ranks.
        batch_size: samples per rank per optimizer step.
        accumulate: micro-batches per optimizer step.
        seed: global seed; the epoch's order is ``permutation(seed, epoch)``.
        shuffle: if False the order is 0..N-1 every epoch.
        shares: each rank's fraction of every global step (non-negative, normalised to sum to one); None: equal
            (sizes differ by at most one). :func:`hvdsync.core.train.shares.balanced_shares` derives them from throughput.
        growth: ``((epoch, factor), ...)``: from ``epoch`` on the per-rank batch is ``factor * batch_size``
            (:func:`hvdsync.core.train.shares.parse_growth`); empty: a constant batch.

    Example:
        >>> plan = ShardPlan(dataset_size=10, world_size=2, batch_size=2)
        >>> [s.indices.tolist() for s in plan.epoch(0, rank=1)][:1]  # doctest: +SKIP
    """

    dataset_size: int
    world_size: int
    batch_size: int
    accumulate: int = 1
    seed: int = 0
    shuffle: bool = True
    shares: tuple[float, ...] | None = None
    growth: tuple[tuple[int, int], ...] = ()

    def __post_init__(self) -> None:
        for name, low in (("dataset_size", 1), ("world_size", 1), ("batch_size", 1), ("accumulate", 1)):
            value = getattr(self, name)
            if not isinstance(value, (int, np.integer)) or value < low:
                raise ValueError(f"ShardPlan.{name}: {value!r} is not allowed; expected an integer >= {low}")
        if self.shares is not None:
            object.__setattr__(self, "shares", check_shares("ShardPlan.shares", self.shares, self.world_size))
        object.__setattr__(self, "growth", parse_growth("ShardPlan.growth", self.growth))

    @property
    def global_batch(self) -> int:
        """Samples in a global step of epoch 0 (:meth:`global_batch_at` for a growing batch)."""
        return self.world_size * self.batch_size

    def batch_size_at(self, epoch: int) -> int:
        """The per-rank batch of ``epoch``: ``batch_size`` times the growth factor in force."""
        factor = 1
        for start, f in self.growth:
            if epoch >= start:
                factor = f
        return self.batch_size * factor

    def global_batch_at(self, epoch: int) -> int:
        return self.world_size * self.batch_size_at(epoch)

    def order(self, epoch: int) -> np.ndarray:
        """The epoch's global order of sample indices (identical on every rank, independent of world size)."""
        if not self.shuffle:
            return np.arange(self.dataset_size, dtype=np.int64)
        rng = np.random.default_rng([self.seed, epoch])
        return rng.permutation(self.dataset_size).astype(np.int64)

    def steps_per_epoch(self, start: int = 0, epoch: int = 0) -> int:
        """Optimizer steps in ``epoch``, from global sample offset ``start`` (0 unless resuming mid-epoch)."""
        remaining = self.dataset_size - start
        return -(-remaining // self.global_batch_at(epoch)) if remaining > 0 else 0

    def split(self, chunk: np.ndarray) -> list[np.ndarray]:
        """One global step's samples cut into the ranks' pieces, in rank order (equal or by ``shares``)."""
        if self.shares is None:
            return np.array_split(chunk, self.world_size)
        edges = np.concatenate([[0], np.cumsum(split_counts(len(chunk), self.shares))])
        return [chunk[edges[r]:edges[r + 1]] for r in range(self.world_size)]

    def epoch(self, epoch: int, rank: int, start: int = 0) -> list[Step]:
        """All steps of ``epoch`` for ``rank``.

        ``start`` is how many samples of this epoch's order were already consumed (by any world size): an elastic
        job that changes size mid-epoch re-plans the rest with ``start`` so that no sample is read twice.
        """
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank: {rank!r} is not allowed; expected 0 <= rank < {self.world_size}")
        if not 0 <= start <= self.dataset_size:
            raise ValueError(f"start: {start!r} is not allowed; expected 0 <= start <= {self.dataset_size}")
        order = self.order(epoch)
        steps, global_batch = [], self.global_batch_at(epoch)
        for s in range(self.steps_per_epoch(start, epoch)):
            lo = start + s * global_batch
            chunk = order[lo:lo + global_batch]
            mine = self.split(chunk)[rank]
            micro = tuple(np.array_split(mine, self.accumulate))
            steps.append(Step(micro=micro, global_count=len(chunk)))
        return steps

    def rank_indices(self, epoch: int, rank: int, start: int = 0) -> np.ndarray:
        """Every index ``rank`` reads in ``epoch``, in reading order."""
        steps = self.epoch(epoch, rank, start)
        return np.concatenate([s.indices for s in steps]) if steps else np.empty(0, dtype=np.int64)

    def resized(self, world_size: int) -> "ShardPlan":
        """The same plan for a new world size (elastic scale up/down); combine with ``start`` to resume. Shares
        belong to ranks, so the new world starts from equal ones."""
        return replace(self, world_size=world_size, shares=None)

    def with_shares(self, shares: "tuple[float, ...] | None") -> "ShardPlan":
        """The same plan with each rank's fraction of every global step (None: equal); the order, the step cuts and
        ``consumed`` positions stay valid, so it may change at any step boundary."""
        return replace(self, shares=None if shares is None else tuple(float(x) for x in shares))


@dataclass(frozen=True)
class PlanState:
    """Where a job is in the plan: ``epoch`` and the samples of that epoch's global order already ``consumed`` (by all
    ranks together). Framework-free and independent of the world size, so a job resumed with another number of
    workers continues the epoch with exactly the unread samples: ``plan.resized(n).epoch(epoch, rank, consumed)``.

    It is what ``hvdsync.torch.PlanSampler.state_dict()`` holds and what an elastic commit stores.
    """

    epoch: int = 0
    consumed: int = 0

    def __post_init__(self) -> None:
        for name in ("epoch", "consumed"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
                raise ValueError(f"PlanState.{name}: {value!r} is not allowed; expected an integer >= 0")

    def to_dict(self) -> dict[str, int]:
        return {"epoch": int(self.epoch), "consumed": int(self.consumed)}

    @classmethod
    def from_dict(cls, state: dict) -> "PlanState":
        unknown = sorted(set(state) - {"epoch", "consumed"})
        if unknown:
            raise ValueError(f"PlanState.{unknown[0]}: unknown field; known fields: consumed, epoch")
        return cls(int(state.get("epoch", 0)), int(state.get("consumed", 0)))

    def advanced(self, plan: ShardPlan, samples: int) -> "PlanState":
        """The state after ``samples`` more were consumed; rolls over to the next epoch at the end of one."""
        consumed = self.consumed + samples
        if consumed >= plan.dataset_size:
            return PlanState(self.epoch + 1, 0)
        return PlanState(self.epoch, consumed)
