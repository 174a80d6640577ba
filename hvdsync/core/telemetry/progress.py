"""Progress on rank 0 only.

Under ``hvdsync train`` the launcher owns the terminal: worker output is kept in per-rank log files (so
Horovod's ``[rank]<stdout>:`` prefixes and TensorFlow's start-up lines don't bury anything) and rank 0 appends
one JSON line per step to the file named by ``HVDSYNC_PROGRESS_FILE``; the launcher turns those into a tqdm bar.
Under a plain ``horovodrun`` script there is no launcher: rank 0 draws the tqdm bar itself on stderr.

A bar redraws one line with carriage returns, which only a terminal (or a notebook cell) shows as one line. Where the
output is not a terminal (a log file, a CI log, and ``horovodrun``, which pipes every worker's output and prefixes
each piece with ``[0]<stderr>:``) the redraws pile up into one endless line; there :func:`progress_display` gives
plain progress lines instead, one every ``interval`` seconds and one at the end.
"""
from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, Callable, TextIO

PROGRESS_ENV = "HVDSYNC_PROGRESS_FILE"


# Seconds between two plain progress lines: often enough to see a job move, rare enough to keep a log readable.
PLAIN_INTERVAL_S = 10.0


def draws_in_place(stream: Any) -> bool:
    """Whether ``stream`` shows a carriage-return redraw as one line: a terminal, or a Jupyter cell's output."""
    isatty = getattr(stream, "isatty", None)
    try:
        if isatty is not None and isatty():
            return True
    except ValueError:  # a closed stream
        return False
    # ipykernel's OutStream is no tty but renders "\r" in place (and tqdm.auto draws a widget there).
    return type(stream).__module__.startswith("ipykernel")


class PlainProgress:
    """Progress as whole lines, for output that is not a terminal: ``train: 110/220 (50%) 12.3 s, 8.9/s, loss=0.123``
    every ``interval`` seconds and when the work is done. The same calls as a tqdm bar (``update``,
    ``set_postfix``, ``close``), so callers need not know which one they hold."""

    def __init__(self, total: int, desc: str, stream: TextIO, interval: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.total, self.desc, self.stream, self.clock = total, desc, stream, clock
        self.interval = PLAIN_INTERVAL_S if interval is None else interval
        self.n, self.postfix = 0, {}
        self.start = self._last = clock()
        self._printed_at: int | None = None

    def update(self, n: int = 1) -> None:
        self.n += n
        now = self.clock()
        # The last line waits for close: the epoch's figures (its logged train_loss) come after its last step.
        if now - self._last >= self.interval and not (self.total and self.n >= self.total):
            self._line(now)

    def set_postfix(self, values: dict, refresh: bool = False) -> None:
        self.postfix = dict(values)

    def close(self) -> None:
        if self._printed_at != self.n:  # the last state once, not twice
            self._line(self.clock())

    def _line(self, now: float) -> None:
        self._last, self._printed_at = now, self.n
        seconds = now - self.start
        share = f" ({100 * self.n / self.total:.0f}%)" if self.total else ""
        rate = f", {self.n / seconds:.3g}/s" if seconds > 0 else ""
        extra = "".join(f", {k}={v}" for k, v in self.postfix.items())
        print(f"{self.desc}: {self.n}/{self.total}{share} {seconds:.1f} s{rate}{extra}", file=self.stream, flush=True)


def progress_display(total: int, desc: str, stream: TextIO, auto: bool = False):
    """A tqdm bar where ``stream`` redraws in place, else :class:`PlainProgress` lines. ``auto``: tqdm.auto's
    notebook widget where one can be shown (a worker's own bar); the launcher's bar is plain tqdm."""
    if not draws_in_place(stream):
        return PlainProgress(total, desc, stream)
    if auto:
        from tqdm.auto import tqdm
    else:
        from tqdm import tqdm
    return tqdm(total=total, desc=desc, file=stream, dynamic_ncols=True, leave=True)


class Progress:
    """Step progress for one training run; does nothing on ranks other than 0."""

    def __init__(self, total: int, rank: int, desc: str = "train") -> None:
        self.total, self.rank, self.done = total, rank, 0
        self._file = None
        self._bar = None
        if rank != 0:
            return
        path = os.environ.get(PROGRESS_ENV)
        # The launcher's file is on the launcher's machine: where rank 0 runs on another host without a shared file
        # system, its folder is not here, and rank 0 prints plain progress lines instead (into the workers' log).
        if path and os.path.isdir(os.path.dirname(path) or "."):
            self._file = open(path, "a", buffering=1)
            self._emit({"total": total, "desc": desc})
        else:
            self._bar = progress_display(total, desc, sys.stderr, auto=True)

    def _emit(self, record: dict) -> None:
        self._file.write(json.dumps(record) + "\n")

    def update(self, n: int = 1, **postfix: float) -> None:
        if self.rank != 0:
            return
        self.done += n
        if self._file is not None:
            self._emit({"n": n, **{k: round(float(v), 5) for k, v in postfix.items()}})
        elif self._bar is not None:
            if postfix:  # before the update, so the line it draws has them
                self._bar.set_postfix({k: f"{v:.4g}" for k, v in postfix.items()}, refresh=False)
            self._bar.update(n)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._bar is not None:
            self._bar.close()
            self._bar = None
