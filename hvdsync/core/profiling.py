"""Phase timers: where a training step's time goes (data, compute, sync wait, update).

The adapters wrap each phase of a step in ``timer.phase("...")``. ``sync_wait`` is the time a rank waits for the
all-reduce to finish after its own backward pass: it holds the pure communication time that did not overlap with
compute, plus the time spent waiting for slower ranks (stragglers) to join the collective.
"""
from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager
from typing import Iterator

PHASES = ("data", "compute", "sync_wait", "update")


class PhaseTimer:
    """Accumulates wall time per phase name."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.counts: dict[str, int] = defaultdict(int)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] += time.perf_counter() - start
            self.counts[name] += 1

    def shares(self) -> dict[str, float]:
        """Each phase's share of the timed total (0..1)."""
        total = sum(self.seconds.values())
        return {k: (v / total if total else 0.0) for k, v in self.seconds.items()}

    def summary(self) -> dict[str, float]:
        return dict(self.seconds)

    def reset(self) -> None:
        self.seconds.clear()
        self.counts.clear()
