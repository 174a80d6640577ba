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
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from hvdsync.core.telemetry import timeline

PHASES = ("data", "compute", "sync_wait", "update")


class PhaseSpan:
    """What :meth:`PhaseTimer.phase` yields: a block that runs more than its phase (a graph that also all-reduces and
    updates, timed by the graph's own clock) sets ``seconds`` to the phase's own share; None: the block's time."""

    __slots__ = ("seconds",)

    def __init__(self) -> None:
        self.seconds: float | None = None


class PhaseTimer:
    """Accumulates wall time per phase name.

    An adapter takes the timer to use (``build(..., timer=...)``, ``fit(..., timer=...)``): a subclass may act around
    every phase (a profiler's ranges, a device synchronisation, a simulated slow processor) by overriding
    :meth:`phase`, and say with :attr:`fuse_phases` whether a step may run several phases in one call.
    """

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.counts: dict[str, int] = defaultdict(int)

    @property
    def fuse_phases(self) -> bool:
        """Whether an adapter may run a step's phases in one call (TensorFlow's one-graph step): its ``compute``
        phase then wraps the whole call and learns its own seconds from the graph's clock (:class:`PhaseSpan`), so
        only what this timer does *before* a phase lands at the phase's start. A timer that acts at a phase's end
        says False, and each phase is then a call of its own."""
        return True

    @contextmanager
    def phase(self, name: str, samples: int | None = None) -> Iterator[PhaseSpan]:
        """Time the block as phase ``name``. ``samples``: how many samples a ``compute`` phase works on (for a
        subclass whose action scales with them)."""
        span = PhaseSpan()
        start = time.perf_counter()
        try:
            yield span
        finally:
            self.add(name, span.seconds if span.seconds is not None else time.perf_counter() - start)

    def add(self, name: str, seconds: float) -> None:
        """Count ``seconds`` of phase ``name`` measured elsewhere (e.g. inside a graph that runs several phases)."""
        self.seconds[name] += seconds
        self.counts[name] += 1

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
