"""Ring all-reduce, simulated step by step in numpy, and what it costs on the wire.

Horovod's all-reduce over Gloo is a *ring* (``gloo::allreduce``'s default algorithm; NCCL and most MPIs use rings
for large buffers too): the n ranks sit on a cycle, every rank sends only to its right neighbour and receives only
from its left one. Each rank's buffer is cut into n chunks and

1. **reduce-scatter** (n-1 steps): at step s rank r sends chunk ``(r - s) mod n`` to rank r+1, which adds it to its
   own copy. A chunk travels n-1 hops and picks up one contribution per hop, so afterwards rank r holds the full
   sum of chunk ``(r + 1) mod n``;
2. **all-gather** (n-1 steps): at step s rank r sends chunk ``(r + 1 - s) mod n`` to rank r+1, which *overwrites*
   its copy; after n-1 hops every rank holds every summed chunk.

Every rank sends 2(n-1) chunks of S/n bytes: ``2 (n-1)/n * S`` in total, which is below 2S whatever n is, and no
rank sends more than another (exactly when n divides the buffer; otherwise chunks differ by one element). A central
parameter server instead receives n*S and sends n*S: its link carries traffic that grows with n, which is why it
becomes the bottleneck. Notebook 05 walks through both and measures the real thing through Horovod.

Example:
    >>> import numpy as np


    >>> trace = ring_allreduce([np.arange(6), 10 * np.arange(6), 100 * np.arange(6)])
    >>> trace.results[0].tolist()
    [0, 111, 222, 333, 444, 555]
    >>> trace.bytes_sent.tolist() == [ring_bytes_per_rank(3, 6 * 8)] * 3
    True
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Sequence

import numpy as np

# The formulas live in the product (the sync modes count their bytes with them); the notebooks use them from here.
from hvdsync.core.comm.traffic import ParameterServerTraffic as ParameterServerTraffic
from hvdsync.core.comm.traffic import bus_bandwidth as bus_bandwidth
from hvdsync.core.comm.traffic import chunk_bounds as chunk_bounds
from hvdsync.core.comm.traffic import parameter_server_bytes as parameter_server_bytes
from hvdsync.core.comm.traffic import ring_bytes_per_rank as ring_bytes_per_rank
from hvdsync.core.comm.traffic import ring_steps as ring_steps

REDUCE_SCATTER = "reduce-scatter"
ALL_GATHER = "all-gather"


@dataclass(frozen=True)
class Transfer:
    """One message of the ring: ``src`` sends chunk ``chunk`` (``nbytes`` bytes) to ``dst``.

    Attributes:
        phase: ``"reduce-scatter"`` (the receiver adds) or ``"all-gather"`` (the receiver overwrites).
        step: the step within its phase, 0 .. n-2; all n transfers of a step happen at the same time.
    """

    phase: str
    step: int
    src: int
    dst: int
    chunk: int
    nbytes: int


class RingTrace(NamedTuple):
    """What :func:`ring_allreduce` returns.

    Attributes:
        results: each rank's buffer after the all-reduce (every one equals the element-wise sum).
        log: every :class:`Transfer`, in order (n per step, 2(n-1) steps).
        bytes_sent: bytes each rank sent, shape ``(n,)``.
        states: with ``keep_states=True``, every rank's buffer before the first step and after each step
            (``states[s][r]``; 2(n-1)+1 entries), else empty.
    """

    results: list[np.ndarray]
    log: list[Transfer]
    bytes_sent: np.ndarray
    states: list[list[np.ndarray]]


class ParameterServerTrace(NamedTuple):
    """What :func:`parameter_server_allreduce` returns.

    Attributes:
        results: each worker's buffer after pulling the sum from the server.
        worker_bytes_sent: bytes each worker pushed to the server, shape ``(n,)``.
        server_bytes_sent: bytes the server sent back (the sum, once to every worker).
        server_bytes_received: bytes the server received (every worker's buffer).
    """

    results: list[np.ndarray]
    worker_bytes_sent: np.ndarray
    server_bytes_sent: int
    server_bytes_received: int


def _check_buffers(rank_arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
    if len(rank_arrays) < 1:
        raise ValueError("rank_arrays: expected one array per rank (at least one rank)")
    buffers = [np.array(a, copy=True).ravel() for a in rank_arrays]
    shape, dtype = np.shape(rank_arrays[0]), buffers[0].dtype
    for r, (a, b) in enumerate(zip(rank_arrays, buffers)):
        if np.shape(a) != shape or b.dtype != dtype:
            raise ValueError(f"rank_arrays[{r}]: shape {np.shape(a)} dtype {b.dtype} is not allowed; every rank "
                             f"must hold the same shape and dtype as rank 0 ({shape}, {dtype})")
    return buffers


def ring_allreduce(rank_arrays: Sequence[np.ndarray], keep_states: bool = False) -> RingTrace:
    """Sum ``rank_arrays`` (one array per rank) with a ring all-reduce, keeping a log of every message.

    Args:
        rank_arrays: n arrays of the same shape and dtype, ``rank_arrays[r]`` being rank r's buffer.
        keep_states: also keep a copy of every rank's buffer after each step (for showing the steps).

    Returns:
        a :class:`RingTrace`: each rank's final buffer (reshaped like the input), the transfers, the bytes each
        rank sent.
    """
    buffers = _check_buffers(rank_arrays)
    n, shape = len(buffers), np.shape(rank_arrays[0])
    bounds = chunk_bounds(buffers[0].size, n)
    log: list[Transfer] = []
    sent = np.zeros(n, dtype=np.int64)
    states: list[list[np.ndarray]] = []

    def keep() -> None:
        if keep_states:
            states.append([b.reshape(shape).copy() for b in buffers])

    def run_step(phase: str, step: int, chunk_of: int) -> None:
        # All n ranks send at once: copy every outgoing chunk *before* any receiver touches its buffer, otherwise a
        # rank could forward a chunk it already updated in this same step.
        messages = []
        for src in range(n):
            chunk = (src + chunk_of - step) % n
            lo, hi = bounds[chunk]
            messages.append((src, (src + 1) % n, chunk, buffers[src][lo:hi].copy()))
        for src, dst, chunk, payload in messages:
            lo, hi = bounds[chunk]
            if phase == REDUCE_SCATTER:
                buffers[dst][lo:hi] += payload
            else:
                buffers[dst][lo:hi] = payload
            log.append(Transfer(phase, step, src, dst, chunk, payload.nbytes))
            sent[src] += payload.nbytes
        keep()

    keep()
    for step in range(n - 1):
        run_step(REDUCE_SCATTER, step, chunk_of=0)   # rank r sends chunk r - s
    for step in range(n - 1):
        run_step(ALL_GATHER, step, chunk_of=1)       # rank r sends chunk r + 1 - s (the one it finished last)
    return RingTrace([b.reshape(shape) for b in buffers], log, sent, states)


def parameter_server_allreduce(rank_arrays: Sequence[np.ndarray]) -> ParameterServerTrace:
    """Sum ``rank_arrays`` through one central server: every worker pushes its buffer, the server adds them and
    sends the sum back to every worker (the design a ring replaces)."""
    buffers = _check_buffers(rank_arrays)
    n, shape = len(buffers), np.shape(rank_arrays[0])
    total = buffers[0].copy()
    for b in buffers[1:]:
        total += b
    nbytes = buffers[0].nbytes
    return ParameterServerTrace([total.copy().reshape(shape) for _ in range(n)],
                                np.full(n, nbytes, dtype=np.int64), n * nbytes, n * nbytes)


