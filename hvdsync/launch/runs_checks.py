"""What ``hvdsync runs`` checks before it asks MLflow anything, and how it says what went wrong in one line: a local
store that is missing, no database or written by a newer MLflow; a server that does not answer; an unknown run id; a
file that is no spool; a UI port out of range or taken. And how ``runs ui`` waits for its server and stops its whole
process group.
"""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
from pathlib import Path

from hvdsync.config import ConfigError
from hvdsync.core.telemetry.tracking import resolve_uri


def store_client(uri: str, must_exist: bool = False):
    """An ``mlflow.MlflowClient`` on the store ``uri`` (resolved as jobs resolve it), once :func:`check_store` found
    nothing wrong with it."""
    import mlflow

    uri = resolve_uri(uri)
    check_store(uri, must_exist)
    return mlflow.MlflowClient(tracking_uri=uri)


def check_store(uri: str, must_exist: bool = False) -> None:
    """One :class:`ConfigError` line for a local SQLite store MLflow cannot read: missing (where ``must_exist``:
    reading a store that is not there would create an empty one), not a database, or written by a newer MLflow."""
    import sqlite3

    from hvdsync.core.telemetry.store import _inspect, newer_schema, sqlite_path

    db = sqlite_path(uri)
    if db is None:
        return
    if not db.exists() or db.stat().st_size == 0:
        if must_exist:
            raise ConfigError(f"--tracking-uri: no store at {db} (the file does not exist or is empty); give the "
                              "store a job wrote, e.g. sqlite:///mlflow.db in the folder it ran in")
        return
    if db.is_dir():
        raise ConfigError(f"--tracking-uri: {db} is a folder; a sqlite:/// store is a file (a folder is a file "
                          "store: give it without sqlite:///)")
    try:
        _tables, revision, _rows = _inspect(db)
    except sqlite3.DatabaseError as exc:
        raise ConfigError(f"--tracking-uri: {db} is not an MLflow store ({exc}); give the store's database "
                          "file") from None
    newer = newer_schema(db, revision)
    if newer:
        raise ConfigError(newer)


def store_error(exc: BaseException, uri: str) -> ConfigError | None:
    """The one line for what the store answered (or did not), or None for an error that is not the store's."""
    import requests
    from mlflow.exceptions import MlflowException

    where = resolve_uri(uri)
    text = str(exc).strip().splitlines()
    first = text[0][:300] if text else type(exc).__name__
    if isinstance(exc, MlflowException) and exc.error_code == "RESOURCE_DOES_NOT_EXIST":
        return ConfigError(f"{first.rstrip('.')} in the store {where}; `hvdsync runs list` shows its run ids")
    if isinstance(exc, (requests.exceptions.RequestException, MlflowException)) and where.startswith("http"):
        timeout = os.environ.get("MLFLOW_HTTP_REQUEST_TIMEOUT")
        why = ("no answer within MLFLOW_HTTP_REQUEST_TIMEOUT=" + f"{timeout} s" if "timed out" in str(exc).lower()
               else "connection refused" if "refused" in str(exc).lower() else first)
        return ConfigError(f"--tracking-uri: the MLflow server {where} did not answer ({why}); start it, or give "
                           "another store")
    if isinstance(exc, MlflowException):
        return ConfigError(f"tracking store {where}: {first}")
    import sqlalchemy.exc

    if isinstance(exc, sqlalchemy.exc.SQLAlchemyError):
        return ConfigError(f"tracking store {where} cannot be read ({first})")
    return None


def spool_target(path: Path) -> str | None:
    """The store a spool file is for, None where the file is no spool (empty, not JSON lines, no store named)."""
    from hvdsync.core.telemetry.spool import Spool

    try:
        return Spool(path).target()
    except (ValueError, OSError, AttributeError, TypeError):
        return None


def check_port(port: int, host: str = "127.0.0.1") -> None:
    """One :class:`ConfigError` line when the UI could not listen on ``port``: out of range, or taken."""
    if not 1 <= port <= 65535:
        raise ConfigError(f"--port: {port} is not allowed; expected a TCP port from 1 to 65535 (default 5000)")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        # As the server itself binds (uvicorn and gunicorn set SO_REUSEADDR): a port whose last server just died
        # keeps connections in TIME_WAIT for a minute, and is free for a new server all the same.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise ConfigError(f"--port: {host}:{port} cannot be used ({exc.strerror or exc}); choose a free port, "
                              f"e.g. --port {port + 1 if port < 65535 else 5000}") from None


def wait_until_up(server: subprocess.Popen, port: int, timeout: float = 300.0) -> bool:
    """Wait until the MLflow server on ``port`` answers ``/health`` (True), or has exited (False). MLflow takes ~20 s
    to start on a small machine: a link printed before then opens on an error page."""
    import time
    import urllib.request

    deadline = time.monotonic() + timeout
    while server.poll() is None and time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as answer:
                if answer.status == 200:
                    return True
        time.sleep(0.3)
    return server.poll() is None


def stop_group(server: subprocess.Popen, grace: float = 10.0) -> None:
    """SIGTERM to the server's process group, SIGKILL to what is left after ``grace`` seconds."""
    import psutil

    try:
        members = [p for p in psutil.process_iter() if _group_of(p) == server.pid]
        os.killpg(server.pid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        return
    _gone, alive = psutil.wait_procs(members, timeout=grace)
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    server.wait()


def _group_of(proc) -> int | None:
    try:
        return os.getpgid(proc.pid)
    except OSError:
        return None
