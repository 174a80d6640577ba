"""The codec reducer, written once for both frameworks: a reducing codec (top-k, rand-k, int8, PowerSGD) over all
of a model's gradients, round by round, with what each round hands to the collectives counted.

What differs between the frameworks is handed in: the kernels (:class:`~hvdsync.core.comm.codecs.base.Ops`) and the
collectives (:class:`Collectives`: how one round's all-reduces and allgathers become Horovod calls, and how a count
reaches the :class:`~hvdsync.core.comm.codecs.base.WireCounter` — directly in eager PyTorch; in TensorFlow as an op
of the graph, so that it runs at every run of a traced step and not once at tracing). The rest is here:

* the codec's state (:class:`~hvdsync.core.comm.codecs.state.CodecState`) and its context (world size, average or
  sum, error feedback, seed, rank);
* one reduction: the rounds of :func:`~hvdsync.core.comm.codecs.driver.reduce_all`, numbered from 0 in every
  reduction (so every rank names the same round alike), each round's requests split into the all-reduces and the
  allgathers, counted on the wire, handed over in one call, and the results put back in the requests' order;
* the counts: every tensor handed over, the gradients reduced, and (where the adapter's clock measures the work,
  :attr:`Collectives.timed`) the codec's own time, the reduction's less its rounds of collectives.
"""
from __future__ import annotations

import time
from typing import Any, Sequence

from hvdsync.core.comm.codecs import Allreduce, reduce_all, ReduceContext, WireCounter
from hvdsync.core.comm.codecs.base import Codec
from hvdsync.core.comm.codecs.registry import get_codec
from hvdsync.core.comm.codecs.state import CodecState


class Collectives:
    """What an adapter hands the reducer: its Horovod calls for one round, and how counts reach the counter.

    Attributes:
        size, rank: the job's world size and this rank.
        timed: whether Python's clock around :meth:`round` measures the work (eager execution); False where the
            reduction is traced into a graph and runs later.
    """

    size: int = 1
    rank: int = 0
    timed: bool = False

    def round(self, index: int, reduce: list, gather: list, average: bool) -> tuple[list, list]:
        """Run round ``index`` of a reduction: all-reduce ``reduce`` (averaged or summed) and allgather ``gather``
        (along the first dimension); returns both results, each in its input's order."""
        raise NotImplementedError

    def record(self, counter: WireCounter, tensors: list) -> None:
        """Count each of ``tensors`` in ``counter`` as handed over (no gradients: a round's pieces)."""
        raise NotImplementedError

    def count_gradients(self, counter: WireCounter, n: int) -> None:
        """Count ``n`` gradients reduced in ``counter``."""
        raise NotImplementedError


class CodecReducer:
    """Combines gradients across ranks with a reducing codec; holds the codec's per-parameter state.

    Args:
        codec: a reducing codec or its config name (``"topk:0.01"``).
        shapes: the shapes of the gradients :meth:`reduce` will get, in order (the same on every rank).
        sync: a :class:`~hvdsync.config.SyncConfig` (op, error feedback).
        ops: the framework's kernels; collectives: the framework's rounds of collectives (:class:`Collectives`).
        counter: records every tensor handed over (values and indices, scales, factors).
        seed: the global seed (rand-k positions and PowerSGD's first Q are drawn from it, alike on every rank).

    ``state.state_dict()`` / ``state.load_state_dict()`` save and restore residuals, step counters and Q.
    """

    def __init__(self, codec: Codec | str, shapes: Sequence[tuple[int, ...]], sync, ops, collectives: Collectives,
                 counter: WireCounter | None = None, seed: int = 0) -> None:
        self.codec = get_codec(codec) if isinstance(codec, str) else codec
        self.ops, self.collectives = ops, collectives
        self.counter = counter if counter is not None else WireCounter()
        self.state = CodecState(self.codec, shapes, ops, seed)
        self.average = sync.op == "average"
        self.ctx = ReduceContext(collectives.size, self.average, sync.error_feedback, seed, collectives.rank)
        self._round, self._collective_s = 0, 0.0

    def reduce(self, grads: Sequence[Any]) -> list[Any]:
        """The combined gradients, identical on every rank. Every rank must call it, with the same shapes."""
        self._round, self._collective_s = 0, 0.0
        start = time.perf_counter()
        out = reduce_all(self.codec, self.ops, list(grads), self.state, self.ctx, self._execute)
        if self.collectives.timed:
            # The codec's own work: all of it but the rounds of collectives (handing over, waiting, collecting).
            self.counter.add_codec_time(time.perf_counter() - start - self._collective_s)
        self.collectives.count_gradients(self.counter, len(grads))
        return out

    def _execute(self, requests: list) -> list[Any]:
        start = time.perf_counter()
        index, self._round = self._round, self._round + 1
        self.collectives.record(self.counter, [r.tensor for r in requests])
        reduce_at = [i for i, r in enumerate(requests) if isinstance(r, Allreduce)]
        gather_at = [i for i, r in enumerate(requests) if not isinstance(r, Allreduce)]
        reduced, gathered = self.collectives.round(index, [requests[i].tensor for i in reduce_at],
                                                   [requests[i].tensor for i in gather_at], self.average)
        results: list = [None] * len(requests)
        for at, done in ((reduce_at, reduced), (gather_at, gathered)):
            for i, t in zip(at, done):
                results[i] = t
        self._collective_s += time.perf_counter() - start
        return results
