"""The MLflow store a job tracks to, made ready once, before any worker starts, in a way no kill can break.

Opening a new SQLite store runs MLflow's schema migrations (seconds; 14 s measured on 2 busy cores). A process killed
during them leaves a half-migrated file with a hot journal, and every later open fails (``sqlite3.OperationalError:
duplicate column name ...`` or ``index ... already exists``): nothing can read the store again, earlier runs
included. So :func:`prepare_store`, called by the process that launches a job (and by a sender that finds no store,
under a user's own ``horovodrun``), never migrates the store in place:

* a new store is created and migrated in a temporary file beside it, then linked into place in one step (a kill
  leaves at most that temporary file, removed by the next call);
* an existing store at an older schema is copied, the copy migrated, and the copy put in place of the original,
  which is kept beside it as ``<name>.hvdsync-before-migration-<time>`` (the copy the user can restore);
* a store found half-migrated (by an earlier kill, an older hvdsync or another tool) is one :class:`StoreError` line
  naming the file and what to do. One that holds no experiment and no run (a creation that was killed: nothing in it
  to lose) is moved aside and created again.

All of it under a lock file beside the store, so two launchers (or a launcher and a sender) never migrate the same file
at once. File stores and servers need none of this: a server migrates its own store, a file store has no schema.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import sqlite3
import time
from pathlib import Path
from typing import Iterator


# MLflow's REST client retries 7 times with backoff and waits up to 120 s per attempt: minutes per call on a dead
# server. The sender asks for one short attempt per call and does its own (bounded) retrying; set by the tracking
# process only, and only where the user has not chosen values.
HTTP_ENV = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "15",
            # and no "View run at ..." line on the user's terminal when the run ends
            "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true"}


def resolve_uri(uri: str) -> str:
    """The tracking URI ``uri`` stands for, made absolute (so a later ``runs push`` from another folder finds the
    same store): empty means MLflow's own default (``MLFLOW_TRACKING_URI`` or its local database)."""
    import mlflow

    uri = uri or mlflow.get_tracking_uri()
    for prefix in ("sqlite:///", "file://"):
        path = uri[len(prefix):]
        if uri.startswith(prefix) and path and not path.startswith("/"):
            return prefix + str(Path(path).resolve())
    if "://" not in uri:  # a bare folder: MLflow's file store
        return str(Path(uri).resolve())
    return uri


class StoreError(RuntimeError):
    """The store cannot be used as it is; the message is one line naming the file and what to do."""


def sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI (None for any other store)."""
    return Path(os.path.abspath(uri[len("sqlite:///"):])) if uri.startswith("sqlite:///") else None


@contextlib.contextmanager
def store_lock(db: Path) -> Iterator[None]:
    """Hold the lock of the SQLite store ``db`` (a file beside it, so processes on every host that sees the file
    share it)."""
    db.parent.mkdir(parents=True, exist_ok=True)
    with open(db.parent / f".{db.name}.hvdsync-lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _head_revision() -> str:
    from mlflow.store.db.utils import _get_latest_schema_revision

    return _get_latest_schema_revision()


def _inspect(db: Path) -> tuple[set[str], str | None, int]:
    """(tables, alembic revision, experiments + runs) of ``db``, read with plain sqlite3 (MLflow's own open would
    try to migrate). Opening it rolls back a hot journal left by a killed writer, as any reader would."""
    con = sqlite3.connect(db, timeout=60)
    try:
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        revision = None
        if "alembic_version" in tables:
            row = con.execute("SELECT version_num FROM alembic_version").fetchone()
            revision = row[0] if row else None
        rows = sum(con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in ("experiments", "runs")
                   if t in tables)
        return tables, revision, rows
    finally:
        con.close()


def newer_schema(db: Path, revision: str | None) -> str | None:
    """One line when the store's schema revision is one the installed MLflow does not know: a newer MLflow wrote
    it (no migration of ours can help, and the store is not damaged), else None."""
    if revision is None:
        return None
    from importlib import metadata

    from alembic.script import ScriptDirectory
    from mlflow.store.db.utils import _get_alembic_config

    try:
        ScriptDirectory.from_config(_get_alembic_config(db_url="")).get_revision(revision)
        return None
    except Exception:  # noqa: BLE001 - alembic says "Can't locate revision" in several exception types
        pass
    return (f"tracking store {db} was written by a newer MLflow (schema revision {revision}); the installed mlflow "
            f"{metadata.version('mlflow')} knows up to {_head_revision()}: upgrade it (pip install -U mlflow) or "
            f"point tracking.tracking_uri (--tracking-uri) at another store")


def _healthy(tables: set[str], revision: str | None) -> bool:
    from mlflow.store.db.base_sql_model import Base

    return revision == _head_revision() and set(Base.metadata.tables) <= tables


def _migrate(db: Path) -> None:
    """Create MLflow's tables in ``db`` (a new or copied file) and bring them to the current schema, as MLflow's own
    first open and ``mlflow db upgrade`` do."""
    import logging

    from mlflow.store.db import utils

    # MLflow and Alembic say at INFO that they create and migrate tables: not news for a user who started a job
    # (a failure still shows at WARNING and above).
    quiet = [logging.getLogger(name) for name in ("mlflow.store.db.utils", "alembic", "alembic.runtime.migration")]
    levels = [log.level for log in quiet]
    for log in quiet:
        log.setLevel(logging.WARNING)
    engine = utils.create_sqlalchemy_engine(f"sqlite:///{db}")
    try:
        if not utils._all_tables_exist(engine):
            utils._initialize_tables(engine)
        else:
            utils._upgrade_db(engine)
        utils._verify_schema(engine)
    finally:
        engine.dispose()
        for log, level in zip(quiet, levels):
            log.setLevel(level)


def _copy(source: Path, target: Path) -> None:
    """A consistent copy of the SQLite file ``source`` (SQLite's backup API: never half a transaction)."""
    src, dst = sqlite3.connect(source, timeout=60), sqlite3.connect(target)
    try:
        src.backup(dst)
    finally:
        dst.close()
        src.close()


def _remove_stale(db: Path) -> None:
    """Temporary files of earlier calls that were killed (their pid is gone)."""
    for tmp in db.parent.glob(f".{db.name}.hvdsync-new-*"):
        pid = tmp.name.rsplit("-", 1)[-1].split(".")[0]
        if pid.isdigit() and not _alive(int(pid)):
            for p in (tmp, Path(f"{tmp}-journal")):
                p.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def prepare_store(uri: str) -> str | None:
    """Make the store ``uri`` ready for a job (see the module docstring). Returns a line for the user when
    something was done that they should know of (an old schema migrated, a broken empty store replaced), else None.

    Raises :class:`StoreError` (one line) when the store is half-migrated and holds runs."""
    db = sqlite_path(uri)
    if db is None:
        return None
    stamp = time.strftime("%Y%m%d-%H%M%S")
    with store_lock(db):
        _remove_stale(db)
        if db.exists() and db.stat().st_size > 0:
            try:
                tables, revision, rows = _inspect(db)
            except sqlite3.DatabaseError as exc:
                raise StoreError(f"tracking store {db} is not a readable SQLite file ({exc}); point "
                                 f"tracking.tracking_uri at a new store") from None
            if _healthy(tables, revision):
                return None
            newer = newer_schema(db, revision)
            if newer:
                raise StoreError(newer)
            if tables:
                return _upgrade(db, revision, rows, stamp)
        tmp = db.parent / f".{db.name}.hvdsync-new-{os.getpid()}"
        tmp.unlink(missing_ok=True)
        try:
            _migrate(tmp)
            # Linked into place in one step, only where no store is (an empty file left by sqlite counts as none).
            if db.exists():
                db.unlink()
            os.link(tmp, db)
        finally:
            tmp.unlink(missing_ok=True)
    return None


def _upgrade(db: Path, revision: str | None, rows: int, stamp: str) -> str:
    """Migrate a copy of the existing store ``db`` and put it in place, the original kept beside it."""
    kept = db.parent / f"{db.name}.hvdsync-before-migration-{stamp}"
    tmp = db.parent / f".{db.name}.hvdsync-new-{os.getpid()}"
    tmp.unlink(missing_ok=True)
    try:
        _copy(db, tmp)
        _migrate(tmp)
    except Exception as exc:  # noqa: BLE001 - MLflow's migrations raise whatever the database says
        tmp.unlink(missing_ok=True)
        reason = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}" if str(exc) else type(exc).__name__
        if rows == 0:  # a creation that was killed: nothing in it to lose; move it aside and start again
            os.replace(db, db.parent / f"{db.name}.hvdsync-broken-{stamp}")
            Path(f"{db}-journal").unlink(missing_ok=True)
            _migrate(tmp)
            os.link(tmp, db)
            tmp.unlink()
            return (f"tracking store {db} was half-created and held no runs ({reason}); it was moved to "
                    f"{db.name}.hvdsync-broken-{stamp} and created again")
        copies = sorted(db.parent.glob(f"{db.name}.hvdsync-before-migration-*"))
        restore = f"restore the copy {copies[-1]}" if copies else "restore it from a backup"
        raise StoreError(f"tracking store {db} is half-migrated and cannot be opened ({reason}): {restore}, or "
                         f"point tracking.tracking_uri (--tracking-uri) at a new store; this job's records stay in "
                         f"the spool until `hvdsync runs push` delivers them") from None
    os.link(db, kept)
    os.replace(tmp, db)
    return f"tracking store {db} migrated from schema {revision} to {_head_revision()}; the old file is kept as {kept}"
