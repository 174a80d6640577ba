"""Timing the communication patterns of :mod:`hvdlab.costmodel` through Horovod, inside the workers.

:func:`collective_times` runs in every worker of a Horovod job and times, per buffer size, one round of each
pattern built from Horovod's collectives exactly as the sync modes do it (:mod:`hvdsync.torch.schemes`):

* ``ring``: ``hvd.allreduce`` (Horovod's ring over Gloo);
* ``sharded_ps``: the push of :func:`hvdsync.torch.schemes.ps.push` (``hvd.alltoall`` to the shard owners, each
  adds the W pieces of its shard), then ``hvd.allgather`` (pull);
* ``ps``: the same push with one owner (rank 0), then ``hvd.broadcast`` from rank 0 (one server);
* ``gossip``: ``hvd.alltoall`` with the ring neighbours.

and, to take the sharded PS apart (:data:`PIECES`): ``call`` (a 4-byte ``hvd.allreduce``: the fixed cost of one
Horovod call, whatever the size), ``fresh`` (allocating and filling a buffer of the size: what a call pays per
byte of each new output tensor), ``push`` and ``pull`` alone, and ``reducescatter`` (Horovod's own
``hvd.reducescatter``, which the push replaced: slower here, and racy; see :mod:`hvdsync.torch.schemes.ps`).

Honest timing on a shared machine: one untimed warm-up round of every size and pattern first, then ``repeats``
rounds, each round visiting every size and pattern once (interleaved: a slow minute of the machine hits every
pattern alike instead of one size); sizes under 4 MiB are timed several times per round (their medians scatter
most). Each timing starts after a barrier and is the slowest rank's (a collective is done when every rank is done).
Every result is checked, not only the first.
"""
from __future__ import annotations

import time

import horovod.torch as hvd
import torch

from hvdsync.core.comm.schemes.gossip import exchange_splits, neighbours
from hvdsync.core.comm.schemes.ps import push_splits
from hvdsync.torch.schemes.ps import push

PATTERNS = ("ring", "sharded_ps", "ps", "gossip")
PIECES = ("call", "fresh", "push", "pull", "reducescatter")
SMALL = 4 * 2**20  # sizes below this are timed ceil(SMALL / size) times per round (at most 4)


def _round(pattern: str, x: torch.Tensor, shard: torch.Tensor, rank: int, size: int) -> torch.Tensor:
    n = x.numel()
    if pattern == "ring":
        return hvd.allreduce(x, op=hvd.Sum, name="measure.ring")
    if pattern == "sharded_ps":
        return hvd.allgather(push(x, push_splits(n, size, 0), rank, "measure.push"), name="measure.pull")
    if pattern == "ps":
        total = push(x, push_splits(n, size, 1), rank, "measure.push1")
        return hvd.broadcast(total if rank == 0 else x, root_rank=0, name="measure.pull1")
    if pattern == "gossip":
        splits = exchange_splits(n, rank, size)
        received, _ = hvd.alltoall(x.repeat(sum(1 for s in splits if s)),
                                   splits=torch.tensor(splits, dtype=torch.int32), name="measure.gossip")
        return received
    if pattern == "call":
        return hvd.allreduce(x[:1], op=hvd.Sum, name="measure.call")
    if pattern == "fresh":
        return torch.empty(n).fill_(1.0)
    if pattern == "push":
        return push(x, push_splits(n, size, 0), rank, "measure.push")
    if pattern == "pull":
        return hvd.allgather(shard, name="measure.pull")
    if pattern == "reducescatter":
        return hvd.reducescatter(x, op=hvd.Sum, name="measure.reducescatter")
    raise ValueError(f"pattern: {pattern!r} is not allowed; choose one of: {', '.join(PATTERNS + PIECES)}")


def _expected(pattern: str, n: int, rank: int, size: int) -> torch.Tensor:
    """What ``pattern`` must return when rank r holds r+1 everywhere (the sum of all is W(W+1)/2)."""
    total = size * (size + 1) / 2
    mine = push_splits(n, size, 0)[rank]
    if pattern == "gossip":
        return torch.cat([torch.full((n,), float(j + 1)) for j in neighbours(rank, size)])
    if pattern == "fresh":
        return torch.full((n,), 1.0)
    if pattern == "pull":
        return torch.cat([torch.full((k,), float(j + 1)) for j, k in enumerate(push_splits(n, size, 0))])
    length = {"push": mine, "reducescatter": mine, "call": 1}.get(pattern, n)
    return torch.full((length,), total)


def collective_times(sizes_bytes: list[int], repeats: int = 10, patterns: tuple[str, ...] = PATTERNS,
                     threads: int = 1) -> dict:
    """Seconds of one round of each pattern per size (every timing), measured in this worker; all ranks call it.

    Args:
        sizes_bytes: buffer sizes (float32 elements: size // 4).
        repeats: timed rounds after the warm-up (sizes under 4 MiB get up to 4 timings per round).
        patterns: names from :data:`PATTERNS` and :data:`PIECES`.

    Returns ``{"rank", "size", "times": {pattern: {nbytes: [seconds, ...]}}, "wrong": {pattern: count},
    "correct": {pattern: bool}}``; every result, warm-up included, is compared with the exact sum (rank r holds
    r+1 everywhere) and ``wrong`` counts the results that differed, on this rank.
    """
    hvd.init()
    torch.set_num_threads(threads)
    rank, size = hvd.rank(), hvd.size()
    times: dict[str, dict[int, list[float]]] = {p: {s: [] for s in sizes_bytes} for p in patterns}
    wrong = {p: 0 for p in patterns}
    buffers = {}
    for nbytes in sizes_bytes:
        x = torch.full((nbytes // 4,), float(rank + 1))
        shard = torch.full((push_splits(x.numel(), size, 0)[rank],), float(rank + 1))
        buffers[nbytes] = (x, shard, {p: _expected(p, x.numel(), rank, size) for p in patterns})
    for round_ in range(repeats + 1):
        for nbytes, (x, shard, expected) in buffers.items():
            inner = 1 if round_ == 0 else min(4, max(1, -(-SMALL // nbytes)))
            for pattern in patterns:
                for _ in range(inner):
                    hvd.barrier()
                    t = time.perf_counter()
                    out = _round(pattern, x, shard, rank, size)
                    seconds = time.perf_counter() - t
                    # The check is outside the timing; a broadcast's root keeps its own (already exact) values.
                    wrong[pattern] += int(not torch.equal(out, expected[pattern]))
                    # Freed here, not when the next result replaces it: returning 64 MiB to the system takes
                    # milliseconds, which would land in the next pattern's timing.
                    del out
                    if round_:
                        times[pattern][nbytes].append(seconds)
    for pattern in patterns:
        for nbytes in sizes_bytes:
            # A round ends for the job when the slowest rank is done.
            slowest = hvd.allreduce(torch.tensor(times[pattern][nbytes], dtype=torch.float64), op=hvd.Max,
                                    name=f"measure.max.{pattern}.{nbytes}")
            times[pattern][nbytes] = slowest.tolist()
    return {"rank": rank, "size": size, "times": times, "wrong": wrong,
            "correct": {p: wrong[p] == 0 for p in patterns}}
