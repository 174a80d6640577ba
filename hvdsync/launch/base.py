"""What every launcher shares (on this machine, elastic, across hosts, on Ray, under MPI or Slurm): what the installed
Horovod was built with, rank 0's progress in this terminal, the elastic driver's log, the hosts it lost, and the
worker errors it turns into one clear :class:`WorkerError`. Nothing here starts a worker.
"""
from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
import logging
import threading
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hvdsync.core.telemetry.progress import progress_display

# Horovod's compiled extension for each framework, relative to the horovod package.
_EXTENSIONS = {"torch": "torch/mpi_lib_v2*.so", "tensorflow": "tensorflow/mpi_lib*.so"}


class WorkerError(RuntimeError):
    """A Horovod worker failed; the message carries the tail of the workers' log."""


def _horovod_root() -> Path | None:
    """The installed horovod package's folder (found without importing it), or None."""
    spec = importlib.util.find_spec("horovod")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def horovod_frameworks() -> list[str]:
    """Frameworks the installed Horovod was built for (by its compiled extensions; imports no framework)."""
    root = _horovod_root()
    return [name for name, pattern in _EXTENSIONS.items() if any(root.glob(pattern))] if root else []


@functools.cache
def _linked(symbol: bytes) -> bool:
    """Whether any of Horovod's compiled extensions names ``symbol``: read from the binaries, no framework import."""
    root = _horovod_root()
    return root is not None and any(symbol in lib.read_bytes() for pattern in _EXTENSIONS.values()
                                    for lib in root.glob(pattern))


def mpi_built() -> bool:
    """Whether Horovod's extensions were linked with MPI (Adasum on CPU needs it): an MPI build references
    ``MPI_Init_thread``; a Gloo-only build has no MPI symbol at all."""
    return _linked(b"MPI_Init_thread")


def gloo_built() -> bool:
    """Whether Horovod was built with Gloo (its controller class is in every extension built with it)."""
    return _linked(b"GlooController")


def follow_progress(path: Path, stop: threading.Event, stream: Any) -> None:
    """Turn rank 0's JSON progress lines into a tqdm bar in this process (plain lines where ``stream`` is not a
    terminal: :func:`hvdsync.core.telemetry.progress.progress_display`)."""
    bar = None
    with contextlib.suppress(FileNotFoundError):
        path.touch()
    with open(path) as f:
        while True:
            line = f.readline()
            if not line:
                if stop.is_set():
                    break
                stop.wait(0.1)
                continue
            record = json.loads(line)
            if "total" in record:
                if bar is not None:
                    bar.close()
                bar = progress_display(record["total"], record.get("desc", "train"), stream)
            elif bar is not None:
                bar.update(record.pop("n", 1))
                if record:
                    bar.set_postfix({k: f"{v:.4g}" for k, v in record.items()}, refresh=False)
    if bar is not None:
        bar.close()


class DriverLog(logging.Handler):
    """Keeps the elastic driver's messages (it logs to the root logger in this process)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if record.exc_info:
            text += " " + "".join(traceback.format_exception_only(record.exc_info[1]))
        self.messages.append(text)


@contextlib.contextmanager
def lost_hosts(lost: list[dict] | None) -> Iterator[None]:
    """Append ``{"host", "time"}`` to ``lost`` each time Horovod's driver excludes a host whose workers failed (for
    the job's MLflow run: which host was lost, and when). Horovod says so only in an INFO log line, below the root
    logger's level here, so its host manager's ``blacklist`` is wrapped while the job runs."""
    if lost is None:
        yield
        return
    import time

    from horovod.runner.elastic.discovery import HostManager

    original = HostManager.blacklist

    def blacklist(manager, host):
        if not manager.is_blacklisted(host):
            lost.append({"host": host, "time": time.time()})
        return original(manager, host)

    HostManager.blacklist = blacklist
    try:
        yield
    finally:
        HostManager.blacklist = original


def raise_clear(run_dir: Path, driver_log: list[str], elastic, exc: Exception | None) -> None:
    """Raise what ended an elastic job as one clear :class:`WorkerError`: the first worker's traceback (the workers
    write it to ``run_dir/errors`` and exit 0), or too few workers for ``elastic.timeout_s`` (from the driver's
    log). Returns where neither applies."""
    errors = sorted((run_dir / "errors").glob("*.txt"))
    if errors:
        first = errors[0]
        raise WorkerError(f"worker on {first.stem.rsplit('-', 1)[0]} failed; the job was stopped. Its traceback:\n"
                          f"{first.read_text()}") from None
    if exc is not None and any("Timed out waiting for" in m or "minimum number of slots" in m for m in driver_log):
        raise WorkerError(f"elastic job ended: fewer than elastic.min_np={elastic.min_np} workers were available for "
                          f"elastic.timeout_s={elastic.timeout_s}s after a reset (log: {run_dir})") from None
