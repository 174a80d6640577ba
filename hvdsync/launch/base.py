"""What every launcher shares (on this machine, elastic, across hosts, on Ray, under MPI or Slurm): the template they
subclass (:class:`Launcher`: preflight -> placement -> the job's run -> the subclass's start hook), what the installed
Horovod was built with, the workers' environment, the job's MLflow run, rank 0's progress in this terminal, the
elastic driver's log, the hosts it lost, and the worker errors it turns into one clear :class:`WorkerError`. Nothing
here starts a worker; the subclasses do, and none imports another (tests/repo/test_layering.py).
"""
from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
import logging
import os
import threading
import traceback
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hvdsync.config import Config, ConfigError
from hvdsync.core.telemetry import jobrun
from hvdsync.core.telemetry.jobrun import JobRun
from hvdsync.core.telemetry.progress import progress_display
from hvdsync.core.train._context import FitResult
from hvdsync.core.train.callbacks import Callback

# Horovod's compiled extension for each framework, relative to the horovod package.
_EXTENSIONS = {"torch": "torch/mpi_lib_v2*.so", "tensorflow": "tensorflow/mpi_lib*.so"}


# Environment every worker gets unless already set: no TensorFlow C++ INFO/WARNING screenfuls, unbuffered output.
QUIET_ENV = {"TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1"}


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
                n = record.pop("n", 1)
                if record:  # before the update, so the line it draws has them
                    bar.set_postfix({k: f"{v:.4g}" for k, v in record.items()}, refresh=False)
                bar.update(n)
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


class Stopped(KeyboardInterrupt):
    """The user stopped the job: SIGINT (Ctrl-C) or SIGTERM reached the launcher, which stopped the workers.

    A ``KeyboardInterrupt`` so that whatever ends on an interrupt ends on this too (the job's MLflow run as
    ``KILLED``: :func:`hvdsync.core.telemetry.jobrun.status_for`). ``signum`` gives the conventional exit status,
    128 + the signal's number (130 for SIGINT, 143 for SIGTERM)."""

    def __init__(self, signum: int) -> None:
        import signal

        self.signum = signum
        super().__init__(f"stopped by the user ({signal.Signals(signum).name})")


@contextlib.contextmanager
def signals_seen(interrupt: bool = False) -> Iterator[list[int]]:
    """The signals Horovod's launcher received while the block runs, in a list.

    Horovod's launcher (``horovod.runner.gloo_run.register_shutdown_event``) points SIGINT and SIGTERM at an event
    that stops its workers, then reports their exit codes as a failure ("exit code 143"): the signal itself is lost.
    Wrapping that registration keeps the signal, so the launcher can say the user stopped the job.

    ``interrupt``: also raise :class:`Stopped` at once in the main thread. Horovod's elastic driver takes workers
    that the event stopped for failed hosts and waits for new ones, so an elastic job would never end; the caller
    stops the workers itself."""
    import signal

    from horovod.runner import gloo_run

    seen: list[int] = []
    original = gloo_run.register_shutdown_event

    def register():
        event = original()
        for signum in (signal.SIGINT, signal.SIGTERM):
            horovod_handler = signal.getsignal(signum)

            def handler(number, frame, horovod_handler=horovod_handler):
                seen.append(number)
                horovod_handler(number, frame)
                if interrupt:
                    raise Stopped(number)

            signal.signal(signum, handler)
        return event

    gloo_run.register_shutdown_event = register
    try:
        yield seen
    finally:
        gloo_run.register_shutdown_event = original


def _probe_folder(folder: Path) -> str | None:
    """Why nothing can be created in the existing folder ``folder`` (None: a file was created and removed there).
    A real creation, not ``os.access``: that also answers for read-only mounts and immutable folders as root."""
    import tempfile

    try:
        fd, name = tempfile.mkstemp(prefix=".hvdsync-probe-", dir=folder)
    except OSError as exc:
        return exc.strerror or str(exc)
    import os

    os.close(fd)
    os.unlink(name)
    return None


def unwritable(path: str | Path, kind: str = "folder") -> str | None:
    """Why the job could not write ``path`` (a ``kind``: ``"folder"`` it creates if missing, or ``"file"``), else
    None. Nothing is created but a probe file, removed at once."""
    path = Path(path).expanduser().absolute()
    if path.exists():
        if kind == "folder" and not path.is_dir():
            return f"{path} is a file, not a folder"
        if kind == "file" and path.is_dir():
            return f"{path} is a folder, not a file"
        if kind == "file":
            try:
                with open(path, "ab"):
                    pass
            except OSError as exc:
                return f"{path} cannot be written ({exc.strerror or exc})"
    # Missing parts are created by the job: the nearest existing one must be a folder that takes new entries (a
    # file's folder too: SQLite writes its journal beside the database).
    start = path if kind == "folder" else path.parent
    existing = next(p for p in (start, *start.parents) if p.exists())
    if not existing.is_dir():
        return f"{existing} is a file, where {path} needs a folder"
    why = _probe_folder(existing)
    return None if why is None else f"{existing} cannot be written ({why})"


def check_outputs(cfg, log_dir: str | Path | None = None, local: bool = True) -> None:
    """Raise one :class:`ConfigError` line for the first path the job would write and cannot: ``--log-dir``, the
    checkpoint folder, a local tracking store (SQLite file or file store) and the spool. Before any worker starts,
    instead of a traceback after minutes of training. ``local``: every worker runs on this machine; otherwise the
    checkpoint folder is rank 0's, on a host whose file systems this machine may not see, and is not checked."""
    from hvdsync.config import ConfigError

    wanted: list[tuple[str, Path, str]] = []
    if log_dir:
        wanted.append(("--log-dir", Path(log_dir), "folder"))
    if cfg.elastic.checkpoint_dir and local:
        wanted.append(("elastic.checkpoint_dir (--checkpoint-dir)", Path(cfg.elastic.checkpoint_dir), "folder"))
    if cfg.tracking.enabled:
        from hvdsync.core.telemetry.spool import default_spool_dir
        from hvdsync.core.telemetry.store import resolve_uri, sqlite_path

        uri = resolve_uri(cfg.tracking.tracking_uri)
        db = sqlite_path(uri)
        if db is not None:
            wanted.append(("tracking.tracking_uri (--tracking-uri)", db, "file"))
        elif uri.startswith("file://") or "://" not in uri:
            wanted.append(("tracking.tracking_uri (--tracking-uri)", Path(uri.removeprefix("file://")), "folder"))
        spool = Path(cfg.tracking.spool_dir) if cfg.tracking.spool_dir else default_spool_dir()
        wanted.append(("tracking.spool_dir", spool, "folder"))
    for name, path, kind in wanted:
        why = unwritable(path, kind)
        if why:
            raise ConfigError(f"{name}: {why}; give a {kind} this user can write")


def preflight(cfg: Config) -> None:
    """Checks that need no worker: Horovod present, built for the framework, op supported by this build."""
    built = horovod_frameworks()
    if not built:
        raise ConfigError("horovod: not installed in this environment; run `make install` (scripts/install.sh)")
    if cfg.train.framework not in built:
        raise ConfigError(f"train.framework: {cfg.train.framework!r} is not allowed with this Horovod build; "
                          f"it was built for: {', '.join(built)} (rebuild with scripts/build_horovod.sh)")
    if cfg.sync.op == "adasum" and not mpi_built():
        raise ConfigError("sync.op: 'adasum' is not allowed with this Horovod build (Adasum needs MPI; this build "
                          "has Gloo only); choose one of: average, sum")


@contextlib.contextmanager
def environ(values: dict[str, str]) -> Iterator[None]:
    """Set environment variables for the workers (Horovod copies ``os.environ`` into each one), then restore."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def job_run(cfg: Config, launcher: str, continue_run: str | None = None) -> Iterator[JobRun | None]:
    """The job's MLflow run, created here before any worker starts and handed to them in the environment
    (:mod:`hvdsync.core.telemetry.jobrun`); ended with how the block ended (``FINISHED``, ``FAILED``, ``KILLED``),
    unless the block ended it itself with more to say (the elastic launchers' resets)."""
    tags = {"framework": cfg.train.framework, "hvdsync.launcher": launcher}
    if cfg.elastic.enabled:
        tags["elastic"] = "true"
    # Named and tagged from the config now, not when rank 0 starts: a job whose workers fail before then still says
    # in MLflow's table what it was (rank 0 adds the hosts once it knows them).
    job = jobrun.begin(cfg.tracking, tags, continue_run, params=cfg.flat())
    try:
        with environ(job.env() if job is not None else {}):
            yield job
    except BaseException as exc:
        if job is not None:
            job.end(jobrun.status_for(exc))
        raise
    if job is not None:
        job.end("FINISHED")


@dataclass(frozen=True)
class Start:
    """How :meth:`Launcher.train` was asked to start the workers, handed to the hooks. ``run_dir`` and ``env`` are
    filled in by an elastic launcher (the job's folder, the workers' checkpoint-job variables)."""

    quiet: bool = True
    progress: bool = True
    log_dir: str | Path | None = None
    callbacks: tuple[Callback, ...] = ()
    run_dir: Path | None = None
    env: dict[str, str] | None = None


class Launcher:
    """The one way a training job is launched: :meth:`train` runs preflight -> placement -> the job's run -> the
    subclass's :meth:`start` hook, in that order, so every launcher refuses a bad config, Horovod build or host list
    in one line before the job's MLflow run is made (a bad host list is not a FAILED run).

    A subclass says where the workers run (its constructor's keyword arguments, kept in ``where``) and overrides the
    hooks, never :meth:`train`: one signature for every launcher (tests/unit/test_launcher_template.py holds it).

    Example:
        >>> LocalLauncher(hosts="a:2,b:2").train(cfg)   # doctest: +SKIP
    """

    name = ""  # the job run's ``hvdsync.launcher`` tag

    def __init__(self, **where: Any) -> None:
        self.where = where

    def train(self, cfg: Config, quiet: bool = True, progress: bool = True, log_dir: str | Path | None = None,
              callbacks: Sequence[Callback] = ()):
        """Train as ``cfg`` says; returns rank 0's :class:`FitResult` (an elastic job's: its ``ElasticResult``).

        Args:
            quiet: keep the workers' output in their log, not this terminal.
            progress: show rank 0's progress as a bar here.
            log_dir: the workers' log folder (default: a temporary one, removed after a success).
            callbacks: :class:`~hvdsync.core.train.callbacks.Callback` instances for every worker's loop (each
                worker its own pickled copy); elastic jobs only, a fixed job runs those named in ``train.callbacks``.
        """
        self.check_callbacks(cfg, callbacks)
        self.preflight(cfg)
        how = Start(quiet, progress, log_dir, tuple(callbacks))
        with self.connection(cfg, how):
            placed = self.placement(cfg)
            return self.job(cfg, placed, how)

    # -- hooks ---------------------------------------------------------------------------------------------------
    def takes_callbacks(self, cfg: Config) -> bool:
        """Whether ``callbacks=`` reach the workers: an elastic job's do (a fixed job runs ``train.callbacks``)."""
        return cfg.elastic.enabled

    def check_callbacks(self, cfg: Config, callbacks: Sequence[Callback]) -> None:
        """Refuse ``callbacks=`` in one line where they would not reach the workers."""
        if callbacks and not self.takes_callbacks(cfg):
            raise ConfigError("callbacks=: taken by elastic jobs (elastic.enabled); name a job's callbacks in "
                              "train.callbacks (hvdsync.registry.register_callback)")

    def preflight(self, cfg: Config) -> None:
        """What needs no worker and no cluster: Horovod's build (:func:`preflight`)."""
        preflight(cfg)

    def connection(self, cfg: Config, how: Start) -> contextlib.AbstractContextManager:
        """Held around placement and the job (a Ray cluster's connection); none by default."""
        return contextlib.nullcontext()

    def placement(self, cfg: Config) -> Any:
        """Where the workers go, checked before the job's run is made; handed to :meth:`start`."""
        return None

    def job_run(self, cfg: Config, continue_run: str | None = None) -> contextlib.AbstractContextManager:
        """The job's MLflow run (:func:`job_run`), tagged with :attr:`name`."""
        return job_run(cfg, self.name, continue_run)

    def job(self, cfg: Config, placed: Any, how: Start):
        """The job run around the start; an elastic launcher adds its reset bookkeeping here."""
        with self.job_run(cfg):
            results = self.start(cfg, placed, how)
        return self.result(results)

    def start(self, cfg: Config, placed: Any, how: Start) -> list:
        """Start the workers and return their results by rank (what each subclass does its own way)."""
        raise NotImplementedError(f"{type(self).__name__}.start")

    def result(self, results: list):
        """Rank 0's result as the caller gets it."""
        return FitResult(**results[0])
