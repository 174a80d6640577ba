"""Hierarchical all-reduce against Horovod's flat ring, on workers spread over several hosts: the bytes each host
sends over its link, and the time, measured side by side in one job.

Horovod's own ``HOROVOD_HIERARCHICAL_ALLREDUCE`` runs only in its NCCL and MPI paths (GPUs, or an MPI build's
``MPI_Allreduce``); on CPUs over Gloo it is not used. The same idea written with Horovod's process sets:

1. inside each host, the host's ranks all-reduce among themselves (over loopback or shared memory: no link);
2. one leader per host (local rank 0) all-reduces the hosts' sums across the link;
3. each leader broadcasts the result to its host's other ranks (no link again).

With ``m`` hosts of ``k`` ranks, a flat ring of ``m k`` ranks sends ``2 (mk - 1) / (mk)`` buffers per rank, and a
host boundary is crossed once per host in each direction, so each host's link carries ``2 (mk - 1) / (mk)`` buffers
each way; the leaders' ring carries ``2 (m - 1) / m``. At 2 hosts x 2 ranks: 1.5 against 1.0.
"""
from __future__ import annotations

import os
import time

from hvdlab.testhosts import own_link_bytes


def host_sets(hosts: list[str]) -> tuple[list[list[int]], list[int]]:
    """From each rank's host (by rank), the ranks of each host and the hosts' leaders (each host's lowest rank)."""
    by_host: dict[str, list[int]] = {}
    for rank, host in enumerate(hosts):
        by_host.setdefault(host, []).append(rank)
    groups = list(by_host.values())
    return groups, [g[0] for g in groups]


def flat_link_buffers(ranks: int) -> float:
    """Buffers each host's link carries each way in one flat ring all-reduce over ``ranks`` ranks (ranks placed host
    by host, so the ring crosses each host boundary once each way)."""
    return 2 * (ranks - 1) / ranks


def hierarchical_link_buffers(hosts: int) -> float:
    """Buffers each host's link carries each way in one hierarchical all-reduce: only the leaders' ring crosses."""
    return 2 * (hosts - 1) / hosts if hosts > 1 else 0.0


def traffic(hosts: list[str], megabytes: float = 8, rounds: int = 4, repeats: int = 1,
            interface: str = "hv0") -> dict:
    """On every worker of a job whose rank ``r`` runs on ``hosts[r]``: a float32 buffer of ``megabytes`` all-reduced
    (sum) ``rounds`` times flat, then ``rounds`` times hierarchically, the two alternating ``repeats`` times.
    Returns this rank's link bytes (sent and received on ``interface``, read by each host's leader) and seconds per
    all-reduce for each way, and whether the two sums agree and are right."""
    import horovod.torch as hvd
    import torch

    groups, leaders = host_sets(hosts)
    # Static process sets (given at init): one per host, and the leaders'. Gloo runs process sets as sub-contexts.
    sets = [hvd.ProcessSet(g) for g in groups] + ([hvd.ProcessSet(leaders)] if len(groups) > 1 else [])
    hvd.init(process_sets=sets)
    rank, size = hvd.rank(), hvd.size()
    if size != len(hosts):
        raise ValueError(f"hierarchical.traffic: {size} workers but {len(hosts)} hosts given, one per rank")
    mine = next(i for i, g in enumerate(groups) if rank in g)
    host_set, leader = sets[mine], groups[mine][0]
    leader_set = sets[-1] if len(groups) > 1 else None
    torch.manual_seed(rank)
    x = torch.randn(int(megabytes * 1_000_000) // 4)

    def flat(t, name):
        return hvd.allreduce(t, name=name, op=hvd.Sum)

    def hierarchical(t, name):
        local = hvd.allreduce(t, name=f"{name}.host", op=hvd.Sum, process_set=host_set)
        if leader_set is not None and rank == leader:
            local = hvd.allreduce(local, name=f"{name}.leaders", op=hvd.Sum, process_set=leader_set)
        return hvd.broadcast(local, root_rank=leader, name=f"{name}.back", process_set=host_set)

    ways = {"flat": flat, "hierarchical": hierarchical}
    for way, fn in ways.items():     # opens Gloo's connections of every set before anything is counted
        fn(x, f"warm-up.{way}")
    out = {way: {"tx_bytes": 0, "rx_bytes": 0, "seconds": []} for way in ways}
    results = {}
    for r in range(repeats):
        for way, fn in ways.items():
            hvd.barrier()
            before, start = own_link_bytes(interface), time.perf_counter()
            for i in range(rounds):
                results[way] = fn(x, f"{way}.{r}.{i}")
            hvd.barrier()
            seconds, after = (time.perf_counter() - start) / rounds, own_link_bytes(interface)
            out[way]["seconds"].append(seconds)
            for k in before:
                out[way][k] += after[k] - before[k]
    want = hvd.allreduce(x.double(), name="exact", op=hvd.Sum).float()
    return {"host": hosts[rank], "rank": rank, "local_rank": hvd.local_rank(), "size": size,
            "leader": rank == leader, "buffer_bytes": x.numel() * 4, "rounds": rounds * repeats,
            "max_diff": float((results["flat"] - results["hierarchical"]).abs().max()),
            "max_err": max(float((results[w] - want).abs().max()) for w in ways),
            "hostname": os.environ.get("HOROVOD_HOSTNAME"), **out}
