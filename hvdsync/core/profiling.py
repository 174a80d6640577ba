"""Profiling: where a training step's time goes, per rank, and where each tensor's all-reduce time goes.

Phase timers. The adapters wrap each phase of a step in ``timer.phase("...")``:

* ``data``: waiting for the next batch (the user's DataLoader / tf.data, or hvdsync's shard plan),
* ``compute``: forward and backward passes,
* ``sync_wait``: waiting for the all-reduce to finish after this rank's own backward pass: the communication that
  did not overlap with compute, *plus* the time spent waiting for slower ranks to join the collective,
* ``update``: the optimizer step.

The share of a step spent in ``sync_wait`` (:func:`comm_share`) is what more workers, compression or a straggler
change; :mod:`hvdsync.core.observe` records it per rank every ``monitor.every`` steps.

Horovod's timeline. With ``HOROVOD_TIMELINE=<file>`` Horovod's coordinator writes a Chrome trace of every
collective: per tensor, the negotiation (all ranks announcing the tensor is ready), the queue before the fused
operation starts, memory copies into and out of the fusion buffer and the all-reduce itself.
:func:`parse_timeline` reads it (also unfinished: Horovod writes it as it goes and closes the JSON list only at
shutdown) and :func:`timeline_chart` draws the per-tensor breakdown.
"""
from __future__ import annotations

import json
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path
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


def _events(text: str) -> list[dict]:
    """The trace events of a timeline file, finished or not (Horovod ends the list only when it shuts down)."""
    text = text.strip()
    try:
        data = json.loads(text)
        return data["traceEvents"] if isinstance(data, dict) else data
    except json.JSONDecodeError:
        pass
    events = []
    for line in text.lstrip("[").splitlines():
        line = line.strip().rstrip(",")
        if line.startswith("{"):
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                break  # the line Horovod was writing when the file was read
    return events


def parse_timeline(path: str | Path) -> dict[str, dict[str, float]]:
    """Seconds per tensor per part (:data:`TIMELINE_PARTS`) from a Horovod timeline file.

    Horovod gives each tensor its own trace "process" (``pid``, named by a ``process_name`` metadata event) and
    nests activities as begin/end pairs (``ph`` B/E) inside the operation. Time is counted in the innermost open
    activity, so nested activities are not counted twice; the outer operation's own time goes to its part.

    Example::

        parts = parse_timeline("timeline.json")   # {"fc1.weight": {"negotiate": 0.01, "allreduce": 0.2, ...}}
    """
    events = _events(Path(path).read_text(errors="replace"))
    names: dict[int, str] = {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "process_name":
            names[e.get("pid")] = str(e.get("args", {}).get("name", e.get("pid")))
    totals: dict[str, dict[str, float]] = defaultdict(lambda: dict.fromkeys(TIMELINE_PARTS, 0.0))
    stacks: dict[int, list[tuple[str, float]]] = defaultdict(list)
    for e in sorted((e for e in events if e.get("ph") in ("B", "E", "X")), key=lambda e: (e.get("ts", 0))):
        pid, ts = e.get("pid"), float(e.get("ts", 0)) / 1e6  # microseconds in the trace
        tensor = names.get(pid, str(pid))
        stack = stacks[pid]
        if e["ph"] == "X":
            totals[tensor][_part(e.get("name", ""))] += float(e.get("dur", 0)) / 1e6
            continue
        if stack:  # the activity open so far gets the time up to this event
            name, since = stack[-1]
            totals[tensor][_part(name)] += ts - since
            stack[-1] = (name, ts)
        if e["ph"] == "B":
            stack.append((e.get("name", ""), ts))
        elif stack:
            stack.pop()
            if stack:
                stack[-1] = (stack[-1][0], ts)
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
