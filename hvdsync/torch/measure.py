"""Timing the communication patterns of :mod:`hvdsync.core.costmodel` through Horovod, inside the workers.

:func:`collective_times` runs in every worker of a Horovod job and times, per buffer size, one round of each
pattern built from Horovod's collectives exactly as the sync modes do it (:mod:`hvdsync.torch.schemes`):

* ``ring``: ``hvd.allreduce`` (Horovod's ring over Gloo);
* ``sharded_ps``: ``hvd.reducescatter`` then ``hvd.allgather`` (push to the shard owners, pull);
* ``ps``: ``hvd.alltoall`` of everything to rank 0, then ``hvd.broadcast`` from rank 0 (one server);
* ``gossip``: ``hvd.alltoall`` with the ring neighbours.

Each timing starts after a barrier and is the slowest rank's (a collective is done when every rank is done); the
caller gets every repeat, to take medians: the machine is shared and single runs scatter.
"""
from __future__ import annotations

import time

import horovod.torch as hvd
import torch

from hvdsync.core.schemes.gossip import exchange_splits
from hvdsync.core.schemes.ps import push_splits

PATTERNS = ("ring", "sharded_ps", "ps", "gossip")


def _round(pattern: str, x: torch.Tensor, rank: int, size: int) -> torch.Tensor:
    n = x.numel()
    if pattern == "ring":
        return hvd.allreduce(x, op=hvd.Sum, name="measure.ring")
    if pattern == "sharded_ps":
        mine = hvd.reducescatter(x, op=hvd.Sum, name="measure.push")
        return hvd.allgather(mine, name="measure.pull")
    if pattern == "ps":
        received, _ = hvd.alltoall(x, splits=torch.tensor(push_splits(n, size, 1), dtype=torch.int32),
                                   name="measure.push1")
        total = received.view(size, n).sum(dim=0) if rank == 0 else x
        return hvd.broadcast(total, root_rank=0, name="measure.pull1")
    if pattern == "gossip":
        d = sum(1 for s in exchange_splits(n, rank, size) if s)
        received, _ = hvd.alltoall(x.repeat(d), splits=torch.tensor(exchange_splits(n, rank, size),
                                                                    dtype=torch.int32), name="measure.gossip")
        return received
    raise ValueError(f"pattern: {pattern!r} is not allowed; choose one of: {', '.join(PATTERNS)}")


def collective_times(sizes_bytes: list[int], repeats: int = 10, patterns: tuple[str, ...] = PATTERNS,
                     threads: int = 1) -> dict:
    """Seconds of one round of each pattern per size (every repeat), measured in this worker; all ranks call it.

    Returns ``{"rank", "size", "times": {pattern: {nbytes: [seconds, ...]}}, "correct": {pattern: bool}}``; a
    pattern's result is checked once per size (rank r holds r+1 everywhere: the sum is W(W+1)/2).
    """
    hvd.init()
    torch.set_num_threads(threads)
    rank, size = hvd.rank(), hvd.size()
    times: dict[str, dict[int, list[float]]] = {p: {} for p in patterns}
    correct = {p: True for p in patterns}
    expected = size * (size + 1) / 2
    for nbytes in sizes_bytes:
        x = torch.full((nbytes // 4,), float(rank + 1))
        for pattern in patterns:
            out = _round(pattern, x, rank, size)                      # warm-up, and the check
            if pattern != "gossip":
                correct[pattern] &= bool(torch.all(out == expected))
            seconds = []
            for _ in range(repeats):
                hvd.barrier()
                t = time.perf_counter()
                _round(pattern, x, rank, size)
                seconds.append(time.perf_counter() - t)
            # The round ends for the job when the slowest rank is done.
            slowest = hvd.allreduce(torch.tensor(seconds, dtype=torch.float64), op=hvd.Max, name="measure.max")
            times[pattern][nbytes] = slowest.tolist()
    return {"rank": rank, "size": size, "times": times, "correct": correct}
