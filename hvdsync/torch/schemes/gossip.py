"""``sync.mode: gossip`` for PyTorch: mix the parameters with the ring neighbours', then a local step."""
from __future__ import annotations

import horovod.torch as hvd
import torch

from hvdsync.core.comm.schemes import gossip
from hvdsync.torch.schemes.base import SchemeOptimizer


class GossipOptimizer(SchemeOptimizer):
    """``sync.mode: gossip``: every ``sync.period`` steps, mix the parameters with the ring neighbours' (Metropolis
    weights, :func:`hvdsync.core.comm.schemes.gossip.mixing_matrix`), then take the local step on the local gradient.

    With ``track_consensus = True`` it also all-reduces the parameters before and after each mixing to record the
    consensus distance (extra traffic, for measurements only; not counted in :attr:`traffic`).
    """

    def __init__(self, optimizer, model, sync, counter=None) -> None:
        super().__init__(optimizer, model, sync, counter)
        self.neighbours = gossip.neighbours(self.rank, self.size)
        self.weights = gossip.mixing_matrix(self.size)[self.rank]
        self.splits = gossip.exchange_splits(self.numel, self.rank, self.size)
        self.steps = 0
        self.track_consensus = False
        self.consensus: list[tuple[int, float, float]] = []

    def consensus_distance(self) -> float:
        """sqrt(mean over ranks of ||x_r - mean x||^2), through two all-reduces (every rank must call it)."""
        x = self._flat_params().double()
        mean = hvd.allreduce(x, op=hvd.Average, name="hvdsync.gossip.mean")
        sq = hvd.allreduce(((x - mean) ** 2).sum().reshape(1), op=hvd.Average, name="hvdsync.gossip.distance")
        return float(sq.sqrt())

    def _synchronize(self) -> None:
        if self.steps % self.sync.period or not self.neighbours:
            return
        before = self.consensus_distance() if self.track_consensus else None
        x = self._flat_params()
        for p in self.params:
            self.counter.record(p.numel() * len(self.neighbours), p.element_size(), str(p.dtype).replace("torch.", ""))
        outgoing = x.repeat(len(self.neighbours))          # one copy per neighbour, in destination-rank order
        received, _ = hvd.alltoall(outgoing, splits=torch.tensor(self.splits, dtype=torch.int32),
                                   name="hvdsync.gossip.exchange")
        mixed = float(self.weights[self.rank]) * x
        for i, j in enumerate(self.neighbours):             # received chunks come in source-rank order
            mixed = mixed + float(self.weights[j]) * received[i * self.numel:(i + 1) * self.numel]
        self._set_params(mixed)
        nbytes = len(self.neighbours) * self.numel * x.element_size()
        self.sent += nbytes
        self.received += nbytes
        self.rounds += 1
        if before is not None:
            self.consensus.append((self.steps, before, self.consensus_distance()))

    def _step(self) -> None:
        self.optimizer.step()
        self.steps += 1
