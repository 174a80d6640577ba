"""A simulated straggler for tests, notebooks and benchmarks: rank ``rank`` computes ``factor`` times slower.

hvdsync has no switch for this; :class:`SlowRank` plugs into two hooks any user has: the adapters' phase timer
(``timer=``) and the loop's callbacks (``callbacks=``). Pass the same object as both::

    slow = SlowRank(rank=1, factor=2.0)
    hvdsync.torch.fit(cfg, model=model, loss=loss, train=loader, timer=slow, callbacks=[slow])

Like a slower processor, the slowed rank stays busy before each ``compute`` phase for ``factor - 1`` times that
phase's usual cost of its samples, and after each evaluation for ``factor - 1`` times the evaluation's duration; the
same in both frameworks. The other ranks' timers time as a plain :class:`~hvdsync.core.telemetry.profiling.PhaseTimer`.
"""
from __future__ import annotations

import time
from collections import deque
from contextlib import contextmanager
from typing import Iterator

import numpy as np

from hvdsync.core.telemetry.profiling import PhaseSpan, PhaseTimer
from hvdsync.core.train.callbacks import Callback


class SlowRank(PhaseTimer, Callback):
    """A phase timer and a callback that make rank ``rank`` compute ``factor`` times slower (``factor`` 1: not at
    all). Which rank this process is, it learns when training begins (``on_train_begin``).

    Args:
        rank: the rank to slow.
        factor: how many times slower it computes (>= 1).

    Example:
        >>> slow = SlowRank(rank=1, factor=4.0)
        >>> result = hvdsync.tensorflow.fit(cfg, timer=slow, callbacks=[slow])  # doctest: +SKIP
    """

    # The slowed rank's cost per sample is the median of its last this-many compute phases (seconds per sample).
    WINDOW = 64

    def __init__(self, rank: int, factor: float) -> None:
        if not isinstance(rank, int) or rank < 0:
            raise ValueError(f"rank: {rank!r} is not allowed; expected an integer >= 0")
        if not isinstance(factor, (int, float)) or not factor >= 1.0:
            raise ValueError(f"factor: {factor!r} is not allowed; expected a number >= 1.0")
        super().__init__()
        self.rank, self.factor = rank, float(factor)
        self.slowed = False  # set in on_train_begin, on the rank this slows
        self._per_sample: deque[float] = deque(maxlen=self.WINDOW)
        self._eval_start = 0.0

    # ---- the callback -----------------------------------------------------------------------------------------
    def on_train_begin(self, ctx) -> None:
        if self.rank >= ctx.size:  # or nothing would be slowed, and a test of a straggler would pass without one
            raise ValueError(f"rank: {self.rank} is not allowed in a world of {ctx.size} ranks; expected a rank "
                             f"below {ctx.size}")
        self.slowed = ctx.rank == self.rank and self.factor > 1.0

    def on_evaluate_begin(self, ctx) -> None:
        self._eval_start = time.perf_counter()

    def on_evaluate_end(self, ctx) -> None:
        # A slower processor scores slower too, whichever evaluator runs.
        self.slow_after(time.perf_counter() - self._eval_start)

    # ---- the timer --------------------------------------------------------------------------------------------
    @property
    def fuse_phases(self) -> bool:
        # Until a cost per sample is measured the slowed rank is busy *after* a compute phase, which in a one-graph
        # step (TensorFlow) would come after that step's all-reduce: each phase is its own call until then.
        return not self.slowed or bool(self._per_sample)

    @contextmanager
    def phase(self, name: str, samples: int | None = None) -> Iterator[PhaseSpan]:
        if not (self.slowed and name == "compute"):
            with super().phase(name, samples) as span:
                yield span
            return
        span, start = PhaseSpan(), time.perf_counter()
        measured = bool(samples and self._per_sample)
        before = self.slow_before(samples)
        after, work_start = 0.0, time.perf_counter()
        try:
            yield span
            took = span.seconds if span.seconds is not None else time.perf_counter() - work_start
            if samples:
                self._per_sample.append(took / samples)
            if not measured:  # nothing measured yet (the first phase): busy after it, in proportion to its time
                after = self.slow_after(took)
        finally:  # the busy time is part of the phase, as a slower processor's would be
            self.add(name, before + span.seconds + after if span.seconds is not None else time.perf_counter() - start)

    def slow_before(self, samples: int | None) -> float:
        """When slowed, stay busy before a compute phase of ``samples`` for ``factor - 1`` times their measured
        cost; returns the seconds it took (0 when not slowed or nothing is measured yet)."""
        if not (self.slowed and samples and self._per_sample):
            return 0.0
        # Busy *before* the work, in proportion to its samples: the slowed rank hands its gradients to Horovod
        # as late as a slower processor would. Busy after the work, a PyTorch rank's backward hooks had already
        # started its all-reduce, which then ran hidden behind the busy wait (a TensorFlow rank all-reduces
        # after its compute phase, so the two frameworks' slowdowns differed).
        return self.busy((self.factor - 1.0) * float(np.median(self._per_sample)) * samples)

    def slow_after(self, seconds: float) -> float:
        """When slowed, stay busy for ``factor - 1`` times ``seconds`` of work just done; returns the seconds it
        took (0 when not slowed)."""
        if not self.slowed or seconds <= 0:
            return 0.0
        return self.busy((self.factor - 1.0) * seconds)

    def busy(self, seconds: float) -> float:
        """Keep this process's core busy for ``seconds``; returns the seconds it took (a measurement may override
        it to record each busy interval)."""
        # Busy, not asleep: on a machine whose cores are shared, a sleeping rank hands its core to the others and is
        # hardly slower at all; a busy one competes for the core like real work.
        start = time.perf_counter()
        deadline = start + seconds
        while time.perf_counter() < deadline:
            pass
        return time.perf_counter() - start
