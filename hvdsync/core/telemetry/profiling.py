"""Profiling: where a training step's time goes, per rank, and where each tensor's all-reduce time goes.

Phase timers. The adapters wrap each phase of a step in ``timer.phase("...")``:

* ``data``: waiting for the next batch (the user's DataLoader / tf.data, or hvdsync's shard plan),
* ``compute``: forward and backward passes,
* ``sync_wait``: waiting for the all-reduce to finish after this rank's own backward pass: the communication that
  did not overlap with compute, *plus* the time spent waiting for slower ranks to join the collective,
* ``update``: the optimizer step.

The share of a step spent in ``sync_wait`` (:func:`comm_share`) is what more workers, compression or a straggler
change; :mod:`hvdsync.core.telemetry.observe` records it per rank every ``monitor.every`` steps.

Horovod's timeline. With ``HOROVOD_TIMELINE=<file>`` Horovod's coordinator writes a Chrome trace of every
collective: per tensor, the negotiation (all ranks announcing the tensor is ready), the queue before the fused
operation starts, memory copies into and out of the fusion buffer and the all-reduce itself.
:func:`parse_timeline` sums it per tensor and part (read by :mod:`hvdsync.core.telemetry.timeline`, also unfinished) and
:func:`timeline_chart` draws the per-tensor breakdown.
"""
from __future__ import annotations

import time
from collections import defaultdict, deque
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import numpy as np

from hvdsync.core.telemetry import timeline

PHASES = ("data", "compute", "sync_wait", "update")


class PhaseTimer:
    """Accumulates wall time per phase name."""

    # The slowed rank's cost per sample is the median of its last this-many compute phases (seconds per sample).
    SLOW_WINDOW = 64

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.counts: dict[str, int] = defaultdict(int)
        self.slowdown = 1.0
        self._per_sample: deque[float] = deque(maxlen=self.SLOW_WINDOW)

    def slow_down(self, factor: float) -> None:
        """For tests and demonstrations only (``data.test_slowdown``): make every ``compute`` phase ``factor`` times
        slower, like a slower processor: the rank stays busy for ``factor - 1`` times the phase's usual cost of its
        ``samples`` (see :meth:`phase`)."""
        self.slowdown = float(factor)

    @contextmanager
    def phase(self, name: str, samples: int | None = None) -> Iterator[None]:
        """Time the block as phase ``name``. ``samples``: how many samples a ``compute`` phase works on (what a
        ``slow_down`` is proportional to)."""
        start = time.perf_counter()
        slow = name == "compute" and self.slowdown > 1.0
        extra = self.slow_before(samples) if slow else 0.0
        try:
            work_start = time.perf_counter()
            yield
            if slow:
                took = time.perf_counter() - work_start
                self._learn(took, samples)
                if not extra:  # nothing measured yet (the first phase): busy after it, in proportion to its time
                    self.slow_after(took)
        finally:
            self.add(name, time.perf_counter() - start)

    @property
    def slows_before(self) -> bool:
        """Whether a ``compute`` phase timed apart (:meth:`add_compute`) is slowed as :meth:`phase` slows it: not
        slowed at all, or with the per-sample cost already measured (the first slowed phase is busy *after* its
        work, which only :meth:`phase` can do)."""
        return self.slowdown <= 1.0 or bool(self._per_sample)

    def slow_before(self, samples: int | None) -> float:
        """Under :meth:`slow_down`, stay busy before a compute phase of ``samples`` for ``factor - 1`` times their
        measured cost; returns the seconds it took (0 when not slowed or nothing is measured yet)."""
        if not (self.slowdown > 1.0 and samples and self._per_sample):
            return 0.0
        # Busy *before* the work, in proportion to its samples: the slowed rank hands its gradients to Horovod
        # as late as a slower processor would. Busy after the work, a PyTorch rank's backward hooks had already
        # started its all-reduce, which then ran hidden behind the busy wait (a TensorFlow rank all-reduces
        # after its compute phase, so the two frameworks' slowdowns differed).
        start = time.perf_counter()
        _busy_until(start + (self.slowdown - 1.0) * float(np.median(self._per_sample)) * samples)
        return time.perf_counter() - start

    def slow_after(self, seconds: float) -> float:
        """Under :meth:`slow_down`, stay busy for ``factor - 1`` times ``seconds`` of work just done (work that is
        not a timed phase, such as the evaluation: a slower processor scores slower too); returns the seconds it
        took (0 when not slowed)."""
        if self.slowdown <= 1.0 or seconds <= 0:
            return 0.0
        start = time.perf_counter()
        _busy_until(start + (self.slowdown - 1.0) * seconds)
        return time.perf_counter() - start

    def _learn(self, took: float, samples: int | None) -> None:
        if self.slowdown > 1.0 and samples:
            self._per_sample.append(took / samples)

    def add(self, name: str, seconds: float) -> None:
        """Count ``seconds`` of phase ``name`` measured elsewhere (e.g. inside a graph that runs several phases)."""
        self.seconds[name] += seconds
        self.counts[name] += 1

    def add_compute(self, seconds: float, samples: int | None, slowed: float = 0.0) -> None:
        """A ``compute`` phase of ``samples`` whose work took ``seconds``, after :meth:`slow_before` kept the rank
        busy for ``slowed``: the same record :meth:`phase` makes (see :attr:`slows_before`)."""
        self._learn(seconds, samples)
        self.add("compute", slowed + seconds)

    def shares(self) -> dict[str, float]:
        """Each phase's share of the timed total (0..1)."""
        total = sum(self.seconds.values())
        return {k: (v / total if total else 0.0) for k, v in self.seconds.items()}

    def summary(self) -> dict[str, float]:
        return dict(self.seconds)

    def snapshot(self) -> list[float]:
        """The running totals of :data:`PHASES`, in that order (subtract two snapshots for an interval)."""
        return [self.seconds.get(p, 0.0) for p in PHASES]

    def reset(self) -> None:
        self.seconds.clear()
        self.counts.clear()


def _busy_until(deadline: float) -> None:
    # Busy, not asleep: on a machine whose cores are shared, a sleeping rank hands its core to the others and is
    # hardly slower at all; a busy one competes for the core like real work.
    while time.perf_counter() < deadline:
        pass


def comm_share(phase_seconds: dict[str, float]) -> float:
    """The share (0..1) of the timed step spent waiting on communication (``sync_wait`` over all phases)."""
    total = sum(phase_seconds.get(p, 0.0) for p in PHASES)
    return phase_seconds.get("sync_wait", 0.0) / total if total > 0 else 0.0


# ---- Horovod timeline -------------------------------------------------------------------------------------------
# The activities of a tensor's life in the timeline, grouped into the parts the chart shows.
TIMELINE_PARTS = ("negotiate", "queue", "memcpy", "allreduce", "other")


def _part(activity: str) -> str:
    name = activity.upper()
    if name.startswith("NEGOTIATE"):
        return "negotiate"
    if name in ("QUEUE", "WAIT_FOR_DATA", "WAIT_FOR_OTHER_TENSOR_DATA"):
        return "queue"
    if "MEMCPY" in name:
        return "memcpy"
    if name.endswith("ALLREDUCE") or name.endswith("ALLGATHER") or name.endswith("BCAST") or "REDUCE" in name:
        return "allreduce"
    return "other"


def parse_timeline(path: str | Path) -> dict[str, dict[str, float]]:
    """Seconds per tensor per part (:data:`TIMELINE_PARTS`) from a Horovod timeline file.

    The file is read by :mod:`hvdsync.core.telemetry.timeline` (the one timeline parser: per tensor and collective, the
    negotiation, the operation and its nested activities; an unfinished file keeps its complete records). Nested
    activities are not counted twice: the operation's own time is what its activities do not cover.

    Example::

        parts = parse_timeline("timeline.json")   # {"fc1.weight": {"negotiate": 0.01, "allreduce": 0.2, ...}}
    """
    totals: dict[str, dict[str, float]] = defaultdict(lambda: dict.fromkeys(TIMELINE_PARTS, 0.0))
    for span in timeline.read(path).spans:
        parts = totals[span.tensor]
        if span.negotiate_start is not None and span.negotiate_end is not None:
            parts["negotiate"] += span.negotiate_end - span.negotiate_start
        inner = 0.0
        for activity in span.activities:
            parts[_part(activity.name)] += activity.end - activity.start
            inner += activity.end - activity.start
        parts[_part(span.op)] += max(0.0, span.seconds - inner)
    return {k: v for k, v in totals.items() if any(v.values())}


def timeline_chart(parts: dict[str, dict[str, float]], path: str | Path, top: int = 20) -> Path:
    """A horizontal stacked bar per tensor (the ``top`` slowest) of :func:`parse_timeline`'s parts, as a PNG."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    rows = sorted(parts.items(), key=lambda kv: -sum(kv[1].values()))[:top][::-1]
    fig, ax = plt.subplots(figsize=(8, 1 + 0.35 * max(1, len(rows))))
    left = [0.0] * len(rows)
    for part in TIMELINE_PARTS:
        widths = [1e3 * r[1][part] for r in rows]
        if any(widths):
            ax.barh([r[0] for r in rows], widths, left=left, label=part)
            left = [a + b for a, b in zip(left, widths)]
    ax.set_xlabel("milliseconds over the run")
    ax.set_title("Horovod timeline: time per tensor")
    ax.legend(loc="lower right", fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return Path(path)
