"""Progress on rank 0 only.

Under ``hvdsync train`` the launcher owns the terminal: worker output is kept in per-rank log files (so
Horovod's ``[rank]<stdout>:`` prefixes and TensorFlow's start-up lines don't bury anything) and rank 0 appends
one JSON line per step to the file named by ``HVDSYNC_PROGRESS_FILE``; the launcher turns those into a tqdm bar.
Under a plain ``horovodrun`` script there is no launcher: rank 0 draws the tqdm bar itself on stderr.
"""
from __future__ import annotations

import json
import os
import sys

PROGRESS_ENV = "HVDSYNC_PROGRESS_FILE"


class Progress:
    """Step progress for one training run; does nothing on ranks other than 0."""

    def __init__(self, total: int, rank: int, desc: str = "train") -> None:
        self.total, self.rank, self.done = total, rank, 0
        self._file = None
        self._bar = None
        if rank != 0:
            return
        path = os.environ.get(PROGRESS_ENV)
        if path:
            self._file = open(path, "a", buffering=1)
            self._emit({"total": total, "desc": desc})
        else:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total, desc=desc, file=sys.stderr, dynamic_ncols=True, leave=True)

    def _emit(self, record: dict) -> None:
        self._file.write(json.dumps(record) + "\n")

    def update(self, n: int = 1, **postfix: float) -> None:
        if self.rank != 0:
            return
        self.done += n
        if self._file is not None:
            self._emit({"n": n, **{k: round(float(v), 5) for k, v in postfix.items()}})
        elif self._bar is not None:
            self._bar.update(n)
            if postfix:
                self._bar.set_postfix({k: f"{v:.4g}" for k, v in postfix.items()}, refresh=False)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._bar is not None:
            self._bar.close()
            self._bar = None
