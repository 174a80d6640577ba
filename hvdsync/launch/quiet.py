"""Keep a framework's C++ start-up log lines out of the terminal, without changing what the framework does.

TensorFlow 2.21 logs through absl. Its first lines (``oneDNN custom operations are on ...`` on CPUs where oneDNN is
enabled, preceded by absl's ``WARNING: All log messages before absl::InitializeLog() is called are written to
STDERR``) are written by static initialisers while its shared libraries load, *before* TensorFlow reads
``TF_CPP_MIN_LOG_LEVEL``; no environment variable stops them. They go straight to file descriptor 2, past
``sys.stderr``. So the only place to catch them is that descriptor, while the libraries load: :func:`filtered_stderr`
points fd 2 at a pipe, drops the log records below the level ``TF_CPP_MIN_LOG_LEVEL`` asks for (default 2: INFO and
WARNING) and forwards every other byte, live, to the real stderr. Numerics are untouched: oneDNN stays as it was.

:func:`quiet_imports` applies that filter to the first import of ``tensorflow`` in this process, whoever triggers
it (``import keras``, ``import horovod.tensorflow``, a user's ``import tensorflow``), by a meta-path finder.
``hvdsync.tensorflow`` installs it before it imports TensorFlow; the launcher installs it in every worker.

Framework-free: this module names the module it watches, it never imports it.
"""
from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import os
import re
import sys
import threading
from typing import Iterator

# absl's record prefix: severity letter, MMDD, time, thread id, file:line].  e.g.
#   I0000 00:00:1796047963.214361    6211 port.cc:153] oneDNN custom operations are on. ...
# (absl's pre-initialisation records print the seconds since the epoch where the time of day would be)
_RECORD = re.compile(rb"^([IWEF])\d{4} [\d:.]+ +\d+ [^\]\s]+:\d+\] ")
_SEVERITY = {b"I": 0, b"W": 1, b"E": 2, b"F": 3}
# Lines that are not records but belong to dropped ones: absl's notice before its first record, and the second
# line of TensorFlow's cpu_feature_guard record.
_NOISE = re.compile(rb"^(WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR"
                    rb"|To enable the following instructions: .*rebuild TensorFlow with the appropriate compiler flags"
                    rb"\.)\s*$")
LEVEL_ENV = "TF_CPP_MIN_LOG_LEVEL"
DEFAULT_LEVEL = 2  # INFO and WARNING dropped, errors kept (TensorFlow's own meaning of the variable)


def min_level() -> int:
    """The least severity that is kept: ``TF_CPP_MIN_LOG_LEVEL`` (0 INFO .. 3 FATAL), default 2."""
    try:
        return int(os.environ.get(LEVEL_ENV, DEFAULT_LEVEL))
    except ValueError:
        return DEFAULT_LEVEL


def keep(line: bytes, level: int) -> bool:
    """Whether ``line`` (one line of C-level stderr) reaches the terminal when records below ``level`` are dropped."""
    if level <= 0:
        return True
    record = _RECORD.match(line)
    if record:
        return _SEVERITY[record.group(1)] >= level
    return not _NOISE.match(line)


def _forward(read_fd: int, out_fd: int, level: int) -> None:
    """Copy lines from ``read_fd`` to ``out_fd``, leaving out dropped records, until the write end closes."""
    with os.fdopen(read_fd, "rb", buffering=0) as pipe:
        pending = b""
        while chunk := pipe.read(65536):
            pending += chunk
            *lines, pending = pending.split(b"\n")
            kept = b"".join(line + b"\n" for line in lines if keep(line, level))
            if kept:
                os.write(out_fd, kept)
        if pending and keep(pending, level):
            os.write(out_fd, pending)


@contextlib.contextmanager
def filtered_stderr(level: int | None = None) -> Iterator[None]:
    """Filter file descriptor 2 (what C++ code and ``sys.stderr`` write to) while the block runs.

    Everything except absl records below ``level`` (default :func:`min_level`) is forwarded as it comes, so a crash
    inside the block loses nothing that was written before it.
    """
    level = min_level() if level is None else level
    if level <= 0:
        yield
        return
    with contextlib.suppress(AttributeError, ValueError):
        sys.stderr.flush()
    saved = os.dup(2)
    read_fd, write_fd = os.pipe()
    forwarder = threading.Thread(target=_forward, args=(read_fd, saved, level), daemon=True,
                                 name="hvdsync-stderr-filter")
    forwarder.start()
    os.dup2(write_fd, 2)
    os.close(write_fd)
    try:
        yield
    finally:
        with contextlib.suppress(AttributeError, ValueError):
            sys.stderr.flush()
        os.dup2(saved, 2)  # closes the pipe's last write end: the forwarder drains it and stops
        forwarder.join()
        os.close(saved)


class _QuietLoader(importlib.abc.Loader):
    """Runs the real loader of a watched module with fd 2 filtered (the libraries load during its ``exec_module``)."""

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        # Point the module back at its own loader: importlib.reload and pickling by reference see the real one.
        module.__loader__ = module.__spec__.loader = self.loader
        with filtered_stderr():
            self.loader.exec_module(module)


class _QuietFinder(importlib.abc.MetaPathFinder):
    """Finds the watched top-level modules through the rest of ``sys.meta_path`` and wraps their loader."""

    def __init__(self, names: tuple[str, ...]) -> None:
        self.names = names

    def find_spec(self, fullname, path, target=None):
        if fullname not in self.names:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _QuietLoader(spec.loader)
                return spec
        return None


WATCHED = ("tensorflow",)


def quiet_imports(names: tuple[str, ...] = WATCHED) -> None:
    """Filter C-level stderr (:func:`filtered_stderr`) during the first import of each module in ``names``.

    Idempotent; does nothing for a module already imported. Call it before the module is imported, e.g. first thing
    in a ``horovodrun`` script that imports TensorFlow itself (``hvdsync.tensorflow`` calls it for you).
    """
    if any(isinstance(f, _QuietFinder) for f in sys.meta_path):
        return
    waiting = tuple(n for n in names if n not in sys.modules)
    if waiting:
        sys.meta_path.insert(0, _QuietFinder(waiting))
