"""Horovod's timeline, parsed: per tensor, when it was negotiated, when its collective ran, and what ran inside.

With ``HOROVOD_TIMELINE=<file>`` (or ``DYNAMIC`` plus ``hvd.start_timeline(file)``) the coordinator (rank 0)
writes a Chrome-trace JSON array. Horovod models every tensor *name* as a "process" (``pid``; the name is in a
``process_name`` metadata record) and writes, per collective on that tensor:

* ``B NEGOTIATE_ALLREDUCE`` ... ``X <rank>`` (that rank's request arrived) ... ``E``: the negotiation, which
  starts when the first rank asks (with the response cache warm, cached tensors may skip it);
* ``B ALLREDUCE`` (the response type) ... ``E`` with the output's dtype and shape: the collective, with nested
  ``B <activity>`` / ``E`` pairs inside (``QUEUE``, ``MEMCPY_IN_FUSION_BUFFER``, ``GLOO_ALLREDUCE``, ...).

Timestamps are microseconds since the timeline started; the first record carries that start as microseconds since
the Unix epoch, so :func:`read` returns times in epoch seconds that can be compared with ``time.time()`` taken
in the workers (e.g. when the backward pass ran, to measure how much communication it hid: :func:`overlap`).

Example:
    >>> tl = parse('[{"name": "process_name", "ph": "M", "pid": 0, "args": {"start_time_since_epoch_in_micros": 0}},'
    ...            '{"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "grad.w"}},'
    ...            '{"ph": "B", "name": "ALLREDUCE", "ts": 100, "pid": 1},'
    ...            '{"ph": "B", "name": "GLOO_ALLREDUCE", "ts": 120, "pid": 1}, {"ph": "E", "ts": 180, "pid": 1},'
    ...            '{"ph": "E", "ts": 200, "pid": 1, "args": {"dtype": "float32", "shape": "[10]"}}]')
    >>> span = tl.spans[0]
    >>> span.tensor, span.op, round(span.seconds * 1e6), [a.name for a in span.activities]
    ('grad.w', 'ALLREDUCE', 100, ['GLOO_ALLREDUCE'])
    >>> round(overlap(tl.spans, [(0.0, 150e-6)]), 2)       # half of the all-reduce ran inside the window
    0.5
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Sequence


@dataclass
class Activity:
    """A nested step of a collective (epoch seconds)."""

    name: str
    start: float
    end: float


@dataclass
class Span:
    """One collective on one tensor, in epoch seconds.

    Attributes:
        tensor: the tensor's name (Horovod's; hvdsync's optimizers name gradients after the parameters).
        op: the response type (``ALLREDUCE``, ``ALLGATHER``, ``BROADCAST``, ``REDUCESCATTER``, ``ALLTOALL``).
        start / end: the collective, from its response to its output.
        negotiate_start / negotiate_end: the negotiation, from the first rank's request reaching the coordinator to
            all ranks' (None if not negotiated, e.g. a response-cache hit).
        ready: rank -> when that rank's request reached the coordinator.
        activities: nested steps (queue, memcpy into the fusion buffer, the transport's own collective, ...).
        dtype / shape: of the output, as Horovod wrote them.
    """

    tensor: str
    op: str
    start: float
    end: float
    negotiate_start: float | None = None
    negotiate_end: float | None = None
    ready: dict[int, float] = field(default_factory=dict)
    activities: list[Activity] = field(default_factory=list)
    dtype: str = ""
    shape: str = ""

    @property
    def seconds(self) -> float:
        return self.end - self.start

    @property
    def name(self) -> str:
        """The name the caller gave: Horovod's Python API prefixes it with the op (``allreduce.fc.weight``)."""
        prefix = self.op.lower() + "."
        return self.tensor[len(prefix):] if self.tensor.startswith(prefix) else self.tensor


@dataclass
class Timeline:
    """A parsed timeline: the epoch time it started and its spans ordered by start."""

    epoch_start: float
    spans: list[Span]

    def select(self, op: str | None = None, name: Callable[[str], bool] | None = None,
               between: tuple[float, float] | None = None) -> list[Span]:
        """Spans of one op (e.g. ``"ALLREDUCE"``), whose :attr:`Span.name` passes ``name``, starting ``between``
        two epoch times."""
        return [s for s in self.spans if (op is None or s.op == op) and (name is None or name(s.name))
                and (between is None or between[0] <= s.start <= between[1])]


def _load_events(text: str) -> list[dict]:
    text = text.strip()
    if not text:
        return []
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    # Horovod ends the array after every record, but a file read while a record is half written (or a writer that
    # was killed) is not valid JSON: keep every complete record, one raw_decode at a time.
    decoder, events, i = json.JSONDecoder(), [], text.find("{")
    while 0 <= i < len(text):
        try:
            record, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            break
        events.append(record)
        i = text.find("{", i)
    return events


def parse(text: str) -> Timeline:
    """Parse a timeline's JSON text (see the module docstring for what Horovod writes)."""
    events = _load_events(text)
    names: dict[int, str] = {}
    epoch_us = 0.0
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "process_name":
            args = e.get("args", {})
            if "start_time_since_epoch_in_micros" in args:
                epoch_us = float(args["start_time_since_epoch_in_micros"])
            if "name" in args:
                names[e["pid"]] = args["name"]

    def t(us: float) -> float:
        return (epoch_us + float(us)) / 1e6

    spans: list[Span] = []
    # Per tensor a stack of open records: [kind, name, start, extra] with kind negotiate / op / activity.
    stacks: dict[int, list[list]] = {}
    pending: dict[int, tuple] = {}     # negotiation finished, collective not yet begun: (start, end, ready)
    for e in events:
        ph, pid = e.get("ph"), e.get("pid")
        if ph not in ("B", "E", "X") or pid not in names:
            continue
        stack = stacks.setdefault(pid, [])
        if ph == "B":
            name = e.get("name", "")
            if name.startswith("NEGOTIATE_"):
                stack.append(["negotiate", name, t(e["ts"]), {}])
            elif stack and stack[-1][0] == "op":
                stack.append(["activity", name, t(e["ts"]), None])
            else:
                stack.append(["op", name, t(e["ts"]), []])
        elif ph == "X":
            if stack and stack[-1][0] == "negotiate" and str(e.get("name", "")).isdigit():
                stack[-1][3][int(e["name"])] = t(e["ts"])
        elif stack:
            kind, name, start, extra = stack.pop()
            end = t(e["ts"])
            if kind == "negotiate":
                pending[pid] = (start, end, extra)
            elif kind == "activity":
                stack[-1][3].append(Activity(name, start, end))
            else:
                n_start, n_end, ready = pending.pop(pid, (None, None, {}))
                args = e.get("args", {})
                spans.append(Span(names[pid], name, start, end, n_start, n_end, ready, extra,
                                  args.get("dtype", ""), args.get("shape", "")))
    spans.sort(key=lambda s: s.start)
    return Timeline(epoch_us / 1e6, spans)


def read(path: str | Path) -> Timeline:
    """Parse the timeline file at ``path``."""
    return parse(Path(path).read_text())


def merge(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """The union of intervals as sorted, disjoint intervals."""
    out: list[list[float]] = []
    for lo, hi in sorted(intervals):
        if out and lo <= out[-1][1]:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return [(lo, hi) for lo, hi in out]


def _length(intervals: Sequence[tuple[float, float]]) -> float:
    return sum(hi - lo for lo, hi in intervals)


def _intersection(a: Sequence[tuple[float, float]], b: Sequence[tuple[float, float]]) -> float:
    total, i, j = 0.0, 0, 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        total += max(0.0, hi - lo)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def overlap(spans: Iterable[Span], windows: Iterable[tuple[float, float]]) -> float:
    """Share (0..1) of the time during which any of ``spans`` was in progress that fell inside ``windows``
    (e.g. the backward passes): the communication hidden behind that compute."""
    busy = merge((s.start, s.end) for s in spans)
    total = _length(busy)
    return _intersection(busy, merge(windows)) / total if total > 0 else 0.0


def busy_seconds(spans: Iterable[Span]) -> float:
    """Wall time during which at least one of ``spans`` was in progress."""
    return _length(merge((s.start, s.end) for s in spans))
