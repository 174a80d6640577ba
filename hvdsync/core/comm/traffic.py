"""Bytes on the wire of each communication pattern, and how a buffer is cut into per-rank chunks.

The formulas the sync modes (parameter server, local SGD, gossip) count their traffic with; :mod:`hvdlab.ring`
simulates the ring message by message and checks itself against them.
"""
from __future__ import annotations

from typing import NamedTuple


class ParameterServerTraffic(NamedTuple):
    """Bytes of one all-reduce through a central server (see :func:`parameter_server_bytes`)."""

    worker_sent: float
    worker_received: float
    server_sent: float
    server_received: float


def chunk_bounds(size: int, n: int) -> list[tuple[int, int]]:
    """``[start, stop)`` of each of the n chunks of a buffer of ``size`` elements (sizes differ by at most one).

    The same split as ``numpy.array_split``: when ``size`` is not a multiple of n the first ``size % n`` chunks get
    one element more (and with ``size < n`` some chunks are empty).
    """
    base, extra = divmod(size, n)
    bounds, start = [], 0
    for c in range(n):
        stop = start + base + (1 if c < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


def ring_bytes_per_rank(n: int, size_bytes: float) -> float:
    """Bytes each rank sends (and receives) in a ring all-reduce of a ``size_bytes`` buffer: ``2 (n-1)/n * S``.

    Example:
        >>> ring_bytes_per_rank(2, 4_000_000)   # 2 ranks: each sends half in each phase
        4000000.0
    """
    if n < 1:
        raise ValueError(f"n: {n!r} is not allowed; expected at least 1 rank")
    return 2.0 * (n - 1) / n * size_bytes


def ring_link_bytes(hosts_by_rank: list[str], size_bytes: float) -> dict[str, float]:
    """Bytes each host sends over its network link in one ring all-reduce of ``size_bytes``, the ring in rank order
    (Gloo's and NCCL's ring: rank r sends to rank r+1): every ring edge whose two ranks are on different hosts
    carries :func:`ring_bytes_per_rank`; edges inside a host stay off the link.

    Example:
        >>> ring_link_bytes(["a", "a", "b", "b"], 8_000_000)   # edges 1->2 and 3->0 cross: 1.5 S each way
        {'a': 12000000.0, 'b': 12000000.0}
    """
    n = len(hosts_by_rank)
    out = dict.fromkeys(hosts_by_rank, 0.0)
    for rank, host in enumerate(hosts_by_rank):
        if n > 1 and hosts_by_rank[(rank + 1) % n] != host:
            out[host] += ring_bytes_per_rank(n, size_bytes)
    return out


def ring_steps(n: int) -> int:
    """Sequential message steps of a ring all-reduce: n-1 to reduce-scatter plus n-1 to all-gather."""
    return 2 * (n - 1)


def parameter_server_bytes(n: int, size_bytes: float) -> ParameterServerTraffic:
    """Bytes of one all-reduce through a central server with n workers: each worker sends S and receives S, the
    server receives n*S and sends n*S (its link is the bottleneck, and it grows with n)."""
    if n < 1:
        raise ValueError(f"n: {n!r} is not allowed; expected at least 1 worker")
    s = float(size_bytes)
    return ParameterServerTraffic(worker_sent=s, worker_received=s, server_sent=n * s, server_received=n * s)


def bus_bandwidth(size_bytes: float, seconds: float, n: int) -> float:
    """Bus bandwidth of a measured all-reduce (bytes/s), the convention of nccl-tests and Horovod benchmarks:
    the bytes each rank really put on its link (``2 (n-1)/n * S``) divided by the time. Unlike ``S / seconds``
    ("algorithm bandwidth") it can be compared with the link's own speed whatever n is."""
    if seconds <= 0:
        raise ValueError(f"seconds: {seconds!r} is not allowed; expected a positive duration")
    return ring_bytes_per_rank(n, size_bytes) / seconds
