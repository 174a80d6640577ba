"""A parameter server, planned and simulated in numpy: who owns which shard, what each rank sends, one round.

A parameter server (Li et al., "Scaling distributed machine learning with the parameter server", OSDI 2014) keeps
the parameters on *servers*. Each step every worker **pushes** its gradient to the servers, each server adds the
pushes for its shard and **updates** that shard with the optimizer (whose state lives only there), and every
worker **pulls** the new parameters back. With k servers the flat parameter vector is cut into k contiguous
shards (:func:`hvdsync.core.comm.traffic.chunk_bounds`: sizes differ by at most one); rank j < k owns shard j.

* ``servers = 1``: every gradient goes to rank 0, rank 0 updates, broadcasts. Rank 0's link carries (W-1) S in
  each direction: the bottleneck, and it grows with the world size W.
* ``servers = W`` (``sync.ps_servers: 0``): one shard per rank. The push is exactly a reduce-scatter and the pull
  an all-gather, which together are what a ring all-reduce does: the same bytes per rank, 2 (W-1)/W S, and no
  bottleneck. The optimizer state is sharded too (each rank holds 1/W of it).

The adapters run these rounds through Horovod (``alltoall`` and a local sum to push, ``allgather`` /
``broadcast`` to pull); :func:`ps_round` is the same round in numpy, for any W, and :func:`traffic` counts what
it sends.

Example:
    >>> push_splits(10, world=4, servers=2)     # rank r sends elements 0..4 to rank 0 and 5..9 to rank 1
    [5, 5, 0, 0]
    >>> t = traffic(10, 4, world=4, servers=1)  # bytes per rank for one round, 10 float32 on 4 ranks, one server
    >>> t.sent.tolist(), t.received.tolist()
    ([120, 40, 40, 40], [120, 40, 40, 40])
"""
from __future__ import annotations

from typing import Callable, NamedTuple, Sequence

import numpy as np

from hvdsync.core.comm.traffic import chunk_bounds


class Traffic(NamedTuple):
    """Bytes each rank sends and receives (shape ``(W,)``), counted per destination (a message to oneself is free)."""

    sent: np.ndarray
    received: np.ndarray

    def __add__(self, other: "Traffic") -> "Traffic":  # type: ignore[override]
        return Traffic(self.sent + other.sent, self.received + other.received)


def server_count(world: int, servers: int) -> int:
    """``sync.ps_servers`` as a number of servers: 0 means one per rank."""
    if not 0 <= servers <= world:
        raise ValueError(f"sync.ps_servers: {servers!r} is not allowed; expected 0 (one per rank) or 1 to {world}")
    return servers or world


def push_splits(size: int, world: int, servers: int) -> list[int]:
    """Elements every rank sends to each destination rank in the push (an ``alltoall`` with these splits)."""
    k = server_count(world, servers)
    return [hi - lo for lo, hi in chunk_bounds(size, k)] + [0] * (world - k)


def push_bytes(size: int, mine: int, world: int, itemsize: int) -> tuple[int, int]:
    """``(sent, received)`` bytes of one rank in a push of a flat vector of ``size`` elements, this rank owning a
    shard of ``mine``: its piece of every other server's shard out, the others' pieces of its shard in. The pull
    is the mirror: ``received, sent = push_bytes(...)`` (its updated shard to every other rank, every other
    server's shard in). The adapters count their rounds with it, as :func:`traffic` predicts them."""
    return (size - mine) * itemsize, (world - 1) * mine * itemsize


def traffic(size: int, itemsize: int, world: int, servers: int) -> Traffic:
    """Bytes per rank of one push + pull round for a flat vector of ``size`` elements of ``itemsize`` bytes."""
    sent = np.zeros(world, dtype=np.int64)
    received = np.zeros(world, dtype=np.int64)
    for r, mine in enumerate(push_splits(size, world, servers)):
        out, into = push_bytes(size, mine, world, itemsize)
        sent[r] += out + into          # the push's, then the pull's (the mirror)
        received[r] += into + out
    return Traffic(sent, received)


def ps_round(rank_grads: Sequence[np.ndarray], params: np.ndarray, servers: int,
             update: Callable[[int, np.ndarray, np.ndarray], np.ndarray], average: bool = True
             ) -> tuple[list[np.ndarray], Traffic]:
    """One parameter-server round in numpy.

    Args:
        rank_grads: each rank's flat gradient.
        params: the flat parameters (identical on every rank before the round).
        servers: ``sync.ps_servers`` (0: one shard per rank).
        update: ``update(server, shard_params, shard_grad) -> new shard_params`` (the optimizer at the owner).
        average: divide the pushed sum by W (``sync.op: average``).

    Returns:
        each rank's parameters after the pull (all equal), and the bytes counted.
    """
    world = len(rank_grads)
    k = server_count(world, servers)
    new = np.array(params, copy=True)
    for server, (lo, hi) in enumerate(chunk_bounds(params.size, k)):
        pushed = [np.asarray(g)[lo:hi] for g in rank_grads]    # what every rank sends to this server
        total = np.sum(pushed, axis=0)
        new[lo:hi] = update(server, params[lo:hi], total / world if average else total)
    return [new.copy() for _ in range(world)], traffic(params.size, params.itemsize, world, servers)
