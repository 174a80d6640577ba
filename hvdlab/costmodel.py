"""The alpha-beta-gamma cost model of collectives, fitted from measurements.

A message of m bytes over one link costs ``alpha + m * beta``: alpha is the fixed cost of a message (latency,
software overhead), beta the inverse bandwidth (seconds per byte). Adding a received buffer into one's own costs
``m * gamma`` (memory bandwidth bound on a CPU). A collective is a schedule of such messages; its time is the sum
over its *sequential* steps of the slowest message in each step. For a buffer of S bytes on n ranks
(Thakur, Rabenseifner & Gropp, "Optimization of collective communication operations in MPICH", IJHPCA 2005;
Chan et al., "Collective communication: theory, practice, and experience", CCPE 2007):

=====================  ==============================================================  ==========================
pattern                time                                                            bytes through busiest rank
=====================  ==============================================================  ==========================
ring all-reduce        2(n-1) alpha + 2(n-1)/n S beta + (n-1)/n S gamma                2(n-1)/n S sent
recursive doubling     log2(n) (alpha + S beta + S gamma)                              log2(n) S sent
binomial tree          2 log2(n) (alpha + S beta) + log2(n) S gamma  (reduce + bcast)  log2(n) S (the root)
parameter server, k    2(n-1) alpha + 2(n-1) S/k beta + (n-1) S/k gamma                 2(n-1) S/k (a server)
  servers (k=1: one;    (push: each server receives n-1 pieces of S/k over its one link;
  k=n: sharded)         pull: it sends its updated S/k back to n-1 ranks)
gossip (ring)          d (alpha + S beta) + d S gamma,  d = min(2, n-1) neighbours      d S sent, whatever n is
=====================  ==============================================================  ==========================

The sharded parameter server with one shard per rank (k = n) has *exactly* the ring's cost: it is a
reduce-scatter followed by an all-gather, which is what the ring does. One server (k = 1) makes rank 0's link
carry (n-1) S in each direction: the bottleneck grows with n. Gossip moves a constant amount per rank, but only
mixes with the neighbours, so the ranks agree only approximately (:mod:`hvdsync.core.comm.schemes.gossip`).

What hvdsync actually runs through Horovod differs from these schedules in ways a measurement sees
(:func:`horovod_time`): every Horovod call costs a fixed ``call`` (its negotiation) before Gloo moves a byte, the
sharded parameter server is two calls (alltoall push + allgather pull) to the ring's one, and Gloo broadcasts
through a binomial tree. ``benchmarks/costmodel.py`` fits the link to the ring and compares both.

Example:
    >>> link = Link(alpha=50e-6, beta=1 / 5e9)
    >>> round(predict("ring", 64 * 2**20, 2, link) * 1e3, 2)    # ms for 64 MiB on 2 ranks
    13.52
    >>> fit = fit_link([2**20, 2**24, 2**26], [predict("ring", s, 2, link) for s in (2**20, 2**24, 2**26)], 2)
    >>> round(fit.alpha * 1e6, 3), round(1 / fit.beta / 1e9, 3)
    (50.0, 5.0)
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable, Sequence

import numpy as np

from hvdlab.ring import ring_bytes_per_rank

MiB = 1024 * 1024


@dataclass(frozen=True)
class Link:
    """Figures of one link and of the reduction.

    Attributes:
        alpha: seconds per message (latency plus software cost of one send/receive).
        beta: seconds per byte on the link (1 / bandwidth).
        gamma: seconds per byte to add a received buffer into one's own (0 where the reduction is free, e.g.
            done by the network or hidden under the transfer).
        name: what the figures describe.
        call: seconds per *library call* before any byte moves (:func:`horovod_time`): Horovod queues the request
            for its background thread's next cycle and rank 0 negotiates it with every rank. 0 in the textbook
            patterns (:func:`predict`).
        mu: seconds per byte written into freshly allocated memory (the output tensors and scratch buffers a call
            allocates: page faults and first writes; :data:`FRESH_BYTES`). 0 in the textbook patterns.
    """

    alpha: float
    beta: float
    gamma: float = 0.0
    name: str = ""
    call: float = 0.0
    mu: float = 0.0

    @property
    def bandwidth(self) -> float:
        """Bytes per second (1 / beta)."""
        return 1.0 / self.beta if self.beta > 0 else math.inf


def _log2(n: int) -> int:
    return max(0, math.ceil(math.log2(n))) if n > 1 else 0


def _check(size_bytes: float, n: int) -> None:
    if not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"n: {n!r} is not allowed; expected an integer >= 1")
    if size_bytes < 0:
        raise ValueError(f"size_bytes: {size_bytes!r} is not allowed; expected >= 0")


def ring_time(size_bytes: float, n: int, link: Link) -> float:
    """Ring all-reduce: n-1 reduce-scatter steps and n-1 all-gather steps of S/n bytes each."""
    _check(size_bytes, n)
    return 2 * (n - 1) * link.alpha + ring_bytes_per_rank(n, size_bytes) * link.beta + (n - 1) / n * size_bytes * link.gamma


def recursive_doubling_time(size_bytes: float, n: int, link: Link) -> float:
    """Recursive doubling: log2(n) steps; in each, pairs swap their whole buffer and add (few, large messages)."""
    _check(size_bytes, n)
    return _log2(n) * (link.alpha + size_bytes * (link.beta + link.gamma))


def tree_time(size_bytes: float, n: int, link: Link) -> float:
    """Binomial-tree reduce to the root, then a binomial-tree broadcast: 2 log2(n) steps of the whole buffer.
    Few steps (latency log n instead of n) but whole buffers on every step: trees win for small messages."""
    _check(size_bytes, n)
    levels = _log2(n)
    return 2 * levels * (link.alpha + size_bytes * link.beta) + levels * size_bytes * link.gamma


def parameter_server_time(size_bytes: float, n: int, link: Link, servers: int = 1) -> float:
    """A parameter server with ``servers`` shards (1: a single server; n: one shard per rank).

    Each server's link receives n-1 pieces of S/k (push), it adds them, and sends S/k back to n-1 ranks (pull);
    the servers work in parallel, so the busiest link sets the time.
    """
    _check(size_bytes, n)
    if not 1 <= servers <= n:
        raise ValueError(f"servers: {servers!r} is not allowed; expected 1 to n ({n})")
    piece = size_bytes / servers
    return 2 * (n - 1) * (link.alpha + piece * link.beta) + (n - 1) * piece * link.gamma


def gossip_time(size_bytes: float, n: int, link: Link) -> float:
    """Neighbour exchange on a ring: each rank sends its buffer to its d = min(2, n-1) neighbours and adds theirs.
    Independent of n beyond 3 ranks."""
    _check(size_bytes, n)
    d = min(2, n - 1)
    return d * (link.alpha + size_bytes * link.beta) + d * size_bytes * link.gamma


PATTERNS: dict[str, Callable[..., float]] = {
    "ring": ring_time,
    "recursive_doubling": recursive_doubling_time,
    "tree": tree_time,
    "ps": parameter_server_time,
    "sharded_ps": lambda s, n, link: parameter_server_time(s, n, link, servers=n),
    "gossip": gossip_time,
}


def predict(pattern: str, size_bytes: float, n: int, link: Link, **kwargs) -> float:
    """Seconds the model predicts for ``pattern`` (a key of :data:`PATTERNS`) on ``size_bytes`` and n ranks.

    Example:
        >>> math.isclose(predict("sharded_ps", 2**20, 4, Link(1e-5, 1e-9)), predict("ring", 2**20, 4, Link(1e-5, 1e-9)))
        True
    """
    try:
        fn = PATTERNS[pattern]
    except KeyError:
        raise ValueError(f"pattern: {pattern!r} is not allowed; choose one of: {', '.join(PATTERNS)}") from None
    return fn(size_bytes, n, link, **kwargs)


def busiest_rank_bytes(pattern: str, size_bytes: float, n: int, servers: int = 1) -> float:
    """Bytes the busiest rank *sends* in one synchronisation of ``size_bytes`` (receives are the same by symmetry).

    Example:
        >>> busiest_rank_bytes("ps", 100, 8) / busiest_rank_bytes("ring", 100, 8)   # one server vs a ring rank
        4.0
    """
    _check(size_bytes, n)
    s = float(size_bytes)
    table = {
        "ring": lambda: ring_bytes_per_rank(n, s),
        "sharded_ps": lambda: ring_bytes_per_rank(n, s),
        "ps": lambda: (n - 1) * s / servers,
        "recursive_doubling": lambda: _log2(n) * s,
        "tree": lambda: _log2(n) * s,
        "gossip": lambda: min(2, n - 1) * s,
    }
    if pattern not in table:
        raise ValueError(f"pattern: {pattern!r} is not allowed; choose one of: {', '.join(table)}")
    return table[pattern]()


def step_time(compute_s: float, wire_bytes: float, n: int, link: Link, encode_s: float = 0.0,
              pattern: str = "ring", calls: float = 0.0) -> float:
    """Seconds of one training step that synchronises ``wire_bytes`` per rank with nothing hidden under compute:
    the step's compute, plus the codec's encode and decode (``encode_s``), plus the collective over ``link``, plus
    ``calls`` Horovod calls at ``link.call`` each (a negotiation and a cycle before any byte moves: one per round of
    collectives; PowerSGD makes two rounds a step, local SGD one every H steps).

    The encoding term matters where the link is slow enough that a codec is chosen: a top-k over millions of values
    or PowerSGD's products run on the same cores as the rest of the step, and once the bytes have shrunk 50-170x
    they can cost more than the transfer they save (:mod:`hvdlab.bench.link_encode` measures it per codec).

    Example:
        >>> link = Link(alpha=100e-6, beta=8 / 1e9)                   # 1 Gbit/s
        >>> round(step_time(0.05, 17e6, 2, link) * 1e3, 1)             # fp32: the transfer dominates
        186.2
        >>> round(step_time(0.05, 0.35e6, 2, link, encode_s=0.1) * 1e3, 1)   # top-k 1 %: the encoding does
        153.0
    """
    if compute_s < 0 or encode_s < 0 or calls < 0:
        raise ValueError(f"compute_s, encode_s, calls: {compute_s!r}, {encode_s!r}, {calls!r} are not allowed; "
                         "expected seconds >= 0 and calls >= 0")
    return compute_s + encode_s + predict(pattern, wire_bytes, n, link) + calls * link.call


# ---- fitting ---------------------------------------------------------------------------------------------------
def fit_link(sizes_bytes: Sequence[float], seconds: Sequence[float], n: int, gamma: float = 0.0,
             name: str = "fitted", call: float = 0.0, mu: float | Sequence[float] = 0.0) -> Link:
    """Fit alpha and beta of the ring model to measured all-reduce times (``gamma`` given, e.g. measured apart).

    Least squares on the *relative* error (each row divided by its measurement), so a 1 MiB point counts as much
    as a 64 MiB one; alpha and beta are kept non-negative (a negative one is pinned at 0 and the other refitted).

    Args:
        sizes_bytes: buffer sizes.
        seconds: the measured time of one all-reduce of each size (take a median of repeats).
        n: ranks in the measurement.
        gamma: seconds per byte of the reduction, subtracted before fitting.
        call: seconds per Horovod call (measured apart: a 4-byte all-reduce), subtracted before fitting; the fitted
            link then predicts :func:`horovod_time`, and alpha is what each Gloo message costs on top.
        mu: seconds per byte of fresh memory (measured apart; one figure, or one per size: allocations above
            glibc's mmap threshold fault in every page, smaller ones reuse the heap), times the all-reduce's fresh
            bytes, subtracted too. The link returned carries the first one.
    """
    s = np.asarray(sizes_bytes, dtype=np.float64)
    t = np.asarray(seconds, dtype=np.float64)
    if s.shape != t.shape or s.size < 2 or np.any(t <= 0):
        raise ValueError("seconds: expected one positive time per size, at least two sizes")
    if n < 2:
        raise ValueError(f"n: {n!r} is not allowed; a fit needs at least 2 ranks (1 rank sends nothing)")
    base = replace(Link(0.0, 0.0, gamma), name=name)
    mus = np.broadcast_to(np.asarray(mu, dtype=np.float64), s.shape)
    rhs = t - call - mus * s * FRESH_BYTES["ring"](n) - np.array([ring_time(x, n, base) for x in s])  # alpha, beta
    a_col = np.full_like(s, 2.0 * (n - 1))
    b_col = np.array([ring_bytes_per_rank(n, x) for x in s])
    w = 1.0 / t
    design = np.stack([a_col * w, b_col * w], axis=1)
    alpha, beta = np.linalg.lstsq(design, rhs * w, rcond=None)[0]
    if alpha < 0:
        alpha, beta = 0.0, float(np.linalg.lstsq(design[:, 1:], rhs * w, rcond=None)[0][0])
    elif beta < 0:
        alpha, beta = float(np.linalg.lstsq(design[:, :1], rhs * w, rcond=None)[0][0]), 0.0
    return Link(float(max(alpha, 0.0)), float(max(beta, 0.0)), gamma, name, call, float(mus[0]))


def prediction_ratios(link: Link, sizes_bytes: Sequence[float], seconds: Sequence[float], n: int,
                      pattern: str = "ring") -> np.ndarray:
    """``predicted / measured`` per size (1.0 is a perfect prediction; the target is within 1/1.5 .. 1.5)."""
    return np.array([predict(pattern, s, n, link) / t for s, t in zip(sizes_bytes, seconds)])


# ---- what Horovod 0.28.1 runs on Gloo ----------------------------------------------------------------------------
def _alltoall(sent: float, n: int, link: Link) -> float:
    # gloo::alltoallv posts its n-1 sends and receives at once; the rank's one link carries them one after another.
    return (n - 1) * link.alpha + sent * link.beta


def _push(s: float, n: int, link: Link) -> float:
    """hvdsync's push (:func:`hvdsync.torch.schemes.ps.push`): alltoall of (n-1)/n S, then the owner adds the n
    pieces of its shard (n-1 additions of S/n)."""
    return link.call + _alltoall((n - 1) / n * s, n, link) + (n - 1) / n * s * link.gamma


def _pull(s: float, n: int, link: Link) -> float:
    """hvd.allgather: gloo::allgatherv, a ring of n-1 steps that forward one shard (S/n) each."""
    return link.call + (n - 1) * (link.alpha + s / n * link.beta)


def _halving_doubling(s: float, n: int, link: Link) -> float:
    """hvd.reducescatter: gloo::ReduceScatterHalvingDoubling, log2(n) steps exchanging S/2, S/4, ... and adding
    them (no overlap of the additions with the transfers); its per-call scratch buffers (two of the whole size,
    zeroed) and Horovod's copy into a third are in :data:`FRESH_BYTES`."""
    return link.call + _log2(n) * link.alpha + (n - 1) / n * s * (link.beta + link.gamma)


EXECUTED: dict[str, Callable[[float, int, Link], float]] = {
    # hvd.allreduce: one call, then gloo::allreduce's ring (segmented: additions overlap the transfers, which the
    # gamma term does not credit).
    "ring": lambda s, n, link: link.call + ring_time(s, n, link),
    "push": _push,
    "pull": _pull,
    "sharded_ps": lambda s, n, link: _push(s, n, link) + _pull(s, n, link),
    # One server: every rank's whole buffer to rank 0 in one alltoall (rank 0 receives (n-1) S and adds it), then
    # hvd.broadcast, which gloo runs as a binomial tree (log2(n) steps of S).
    "ps": lambda s, n, link: (2 * link.call + _alltoall((n - 1) * s, n, link) + (n - 1) * s * link.gamma
                              + _log2(n) * (link.alpha + s * link.beta)),
    # alltoall of the whole buffer to d = min(2, n-1) neighbours (no reduction inside the collective).
    "gossip": lambda s, n, link: link.call + min(2, n - 1) * (link.alpha + s * link.beta),
    "reducescatter": _halving_doubling,
}


# Bytes of freshly allocated memory each pattern writes per call, in multiples of S (the busiest rank: rank 0 for
# the one server). Horovod allocates every output tensor anew; hvd.allreduce copies the input into it first; the
# alltoall receives into its output; hvd.reducescatter copies the input into a temporary of S, and gloo's
# halving-doubling allocates and zeroes two scratch vectors of S more.
FRESH_BYTES: dict[str, Callable[[int], float]] = {
    "ring": lambda n: 1.0,
    "push": lambda n: 1.0 + 1.0 / n,                  # the alltoall's output, the owner's sum
    "pull": lambda n: 1.0,
    "sharded_ps": lambda n: 2.0 + 1.0 / n,
    "ps": lambda n: n + 2.0,                          # rank 0: n buffers received, their sum, the broadcast's output
    "gossip": lambda n: 2.0 * min(2, n - 1),          # the repeated send buffer, the received one
    "reducescatter": lambda n: 3.0 + 1.0 / n,
}


def horovod_time(pattern: str, size_bytes: float, n: int, link: Link) -> float:
    """Seconds for ``pattern`` as hvdsync runs it through Horovod 0.28.1 on Gloo (a key of :data:`EXECUTED`).

    Unlike :func:`predict` (the textbook schedules), this counts each Horovod call (``link.call``) and follows the
    algorithm Gloo runs for it: the sharded parameter server is *two* calls (an alltoall push plus local sum, then
    an allgather ring) where the ring all-reduce is one, so at equal bytes it costs one ``call`` more; the one
    server's pull is a binomial-tree broadcast.

    Example:
        >>> link = Link(alpha=50e-6, beta=1 / 1e9, call=1e-3)
        >>> round((horovod_time("sharded_ps", 2**26, 2, link) - horovod_time("ring", 2**26, 2, link)) * 1e3, 3)
        1.0
    """
    _check(size_bytes, n)
    try:
        fn = EXECUTED[pattern]
    except KeyError:
        raise ValueError(f"pattern: {pattern!r} is not allowed; choose one of: {', '.join(EXECUTED)}") from None
    return fn(size_bytes, n, link) + link.mu * size_bytes * FRESH_BYTES[pattern](n)


def horovod_rank0_bytes(pattern: str, size_bytes: float, n: int) -> tuple[float, float]:
    """(sent, received) bytes of rank 0 for ``pattern`` as Horovod runs it on Gloo (rank 0 is the server of
    ``ps``; every rank moves the same in the others).

    Example:
        >>> horovod_rank0_bytes("ps", 100, 4)     # receives 3 whole buffers; the tree broadcast sends 2
        (200.0, 300.0)
    """
    _check(size_bytes, n)
    s, shard = float(size_bytes), (n - 1) / n * float(size_bytes)
    table = {
        "ring": (2 * shard, 2 * shard),
        "sharded_ps": (2 * shard, 2 * shard),             # push (n-1)/n S each way, allgather the same
        "ps": (_log2(n) * s, (n - 1) * s),                 # the root's sends in a binomial broadcast: log2(n) S
        "gossip": (min(2, n - 1) * s, min(2, n - 1) * s),
    }
    if pattern not in table:
        raise ValueError(f"pattern: {pattern!r} is not allowed; choose one of: {', '.join(table)}")
    return table[pattern]


# ---- fabrics ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Fabric:
    """A link as vendors state it: per-direction bandwidth (bytes/s), an order-of-magnitude latency, a source."""

    name: str
    bandwidth: float
    alpha: float
    source: str

    def link(self, gamma: float = 0.0) -> Link:
        return Link(self.alpha, 1.0 / self.bandwidth, gamma, self.name)


GB = 1e9
# Bandwidths are the vendors' nominal per-direction figures; alphas are typical small-message latencies of the
# collective library on that fabric (order of magnitude, assumed: kernel launch and protocol dominate on GPUs).
FABRICS: tuple[Fabric, ...] = (
    Fabric("NVLink 4 (H100/H200 SXM, NVSwitch)", 450 * GB, 5e-6,
           "NVIDIA H200 / H100 Tensor Core GPU datasheets: 900 GB/s bidirectional NVLink per GPU"),
    Fabric("PCIe 5.0 x16", 64 * GB, 5e-6,
           "PCI-SIG PCIe 5.0: 32 GT/s per lane, x16 = ~64 GB/s per direction (H200 datasheet: 128 GB/s both ways)"),
    Fabric("PCIe 4.0 x16", 32 * GB, 5e-6, "PCI-SIG PCIe 4.0: 16 GT/s per lane, x16 = ~32 GB/s per direction"),
    Fabric("InfiniBand NDR 400 Gb/s", 50 * GB, 2e-6,
           "NVIDIA ConnectX-7 user manual: single-port NDR 400 Gb/s (per node NIC; ~1-2 us MPI latency)"),
    Fabric("InfiniBand HDR 200 Gb/s", 25 * GB, 2e-6, "NVIDIA ConnectX-6 / ConnectX-7 NDR200/HDR 200 Gb/s"),
    Fabric("RoCE / Ethernet 100 GbE", 12.5 * GB, 10e-6, "IEEE 802.3 100GbE line rate; RoCE adds RDMA latency ~5-10 us"),
    Fabric("Ethernet 25 GbE (TCP)", 3.125 * GB, 30e-6, "IEEE 802.3by 25GbE line rate; TCP software latency tens of us"),
)


def fabric_table(size_bytes: float, n: int, fabrics: Sequence[Fabric] = FABRICS,
                 patterns: Sequence[str] = ("ring", "tree", "ps", "gossip")) -> list[dict]:
    """Predicted seconds per pattern for ``size_bytes`` on n ranks over each fabric (reduction cost 0: on GPUs
    the add runs at HBM speed, far above any link)."""
    return [{"fabric": f.name, **{p: predict(p, size_bytes, n, f.link()) for p in patterns}} for f in fabrics]
