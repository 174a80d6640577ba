"""The SQLite store is made ready one process at a time and never migrated in place, so no kill can break it.

* Several senders opening one fresh store at once (an elastic job's old and new rank 0) all get a working client.
  Without a lock, two of three such processes failed here with ``duplicate column name``.
* A process killed during MLflow's own first migration of a new store (reproduced for real: SIGKILL once MLflow logs
  "Updating database tables") leaves a file every later open fails on. hvdsync reports such a store in one line
  naming the file and what to do when it holds runs (and leaves it untouched), and creates it again when it holds
  none (a creation that was killed: nothing to lose). A tracked run meanwhile keeps every record in its spool, and
  ``hvdsync runs push`` delivers them once the store is restored.
* A process killed during hvdsync's own creation of a store leaves no store at all (the migration runs in a
  temporary file linked into place at the end): the next call creates it, and its temporary file is cleaned up.
"""
import shutil
import signal
import subprocess
import sys
import time
import warnings

import mlflow
import pytest

from hvdsync.core.telemetry.store import StoreError, prepare_store
from hvdsync.core.telemetry.tracking import MLflowTracker, TrackingWarning
from hvdsync.launch import cli

CODE = "import sys; from hvdsync.core.telemetry.sender import open_client; open_client(sys.argv[1]).search_experiments()"
MLFLOW_OPEN = "import sys, mlflow; mlflow.MlflowClient(sys.argv[1]).search_experiments()"
HVDSYNC_PREPARE = "import sys; from hvdsync.core.telemetry.store import prepare_store; prepare_store(sys.argv[1])"


def test_concurrent_senders_open_a_fresh_sqlite_store(tmp_path):
    uri = f"sqlite:///{tmp_path / 'fresh.db'}"
    procs = [subprocess.Popen([sys.executable, "-c", CODE, uri], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(3)]
    results = [(p.wait(timeout=300), p.stderr.read()) for p in procs]
    assert [rc for rc, _ in results] == [0, 0, 0], "\n".join(err[-800:] for _, err in results)
    client = mlflow.MlflowClient(tracking_uri=uri)
    assert client.get_experiment_by_name("Default") is not None


def _kill_during_migration(code: str, uri: str, after: float = 1.0, started=None) -> bool:
    """Run ``code`` (which opens ``uri``, a new store) and SIGKILL it ``after`` seconds into MLflow's migrations
    (from its "Updating database tables" line; they take a second or a few here), or, given ``started``, from when
    ``started()`` first holds (hvdsync's own creation keeps MLflow's INFO lines quiet); False where it had ended
    first."""
    proc = subprocess.Popen([sys.executable, "-c", code, uri], text=True,
                            stderr=subprocess.PIPE if started is None else subprocess.DEVNULL)
    if started is None:
        for line in proc.stderr:
            if "Updating database tables" in line:
                break
    else:
        while proc.poll() is None and not started():
            time.sleep(0.005)
    time.sleep(after)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    return proc.returncode == -signal.SIGKILL


def _copy(db, target) -> None:
    """The store file with its hot journal (what a reader rolls back first: without it a copy is another state)."""
    shutil.copy(db, target)
    journal = db.with_name(db.name + "-journal")
    if journal.exists():
        shutil.copy(journal, target.with_name(target.name + "-journal"))


def _opens(uri: str) -> bool:
    try:
        mlflow.MlflowClient(tracking_uri=uri).search_experiments()
        return True
    except Exception:  # noqa: BLE001 - what MLflow raises on a broken store varies with where the kill came
        return False


def _migration_seconds(tmp) -> float:
    """How long MLflow's migrations of a new store take on this machine now: from its "Updating database tables"
    line to the end of the process that opened it."""
    proc = subprocess.Popen([sys.executable, "-c", MLFLOW_OPEN, f"sqlite:///{tmp / 'timed.db'}"],
                            stderr=subprocess.PIPE, text=True)
    for line in proc.stderr:
        if "Updating database tables" in line:
            break
    start = time.monotonic()
    proc.stderr.read()
    proc.wait(timeout=120)
    return time.monotonic() - start


@pytest.fixture(scope="module")
def half_migrated(tmp_path_factory):
    """A store left half-migrated by a process killed during MLflow's first migration (and a copy to check it)."""
    # Where the kill lands decides: on SQLite each migration commits on its own, and a kill in one that rebuilds a
    # table breaks the store for good, one in the first tenth or so of them did not. How long they take depends on
    # the machine and its load at that moment (about a second idle, several under load; fixed kill times missed
    # both ways), so the kills come at fractions of a migration timed just before; each try is checked on a copy.
    span = _migration_seconds(tmp_path_factory.mktemp("timed"))
    for fraction in (0.5, 0.3, 0.7, 0.4, 0.6, 0.2, 0.8, 0.35, 0.55, 0.25):
        tmp = tmp_path_factory.mktemp("half")
        if not _kill_during_migration(MLFLOW_OPEN, f"sqlite:///{tmp / 'broken.db'}", fraction * span):
            continue
        _copy(tmp / "broken.db", tmp / "check.db")
        if not _opens(f"sqlite:///{tmp / 'check.db'}"):   # the state: no open of it succeeds
            return tmp / "broken.db"
    raise AssertionError(f"ten kills during MLflow's migrations ({span:.2f} s when timed) came too late or left "
                         "stores that open")


def test_a_half_migrated_store_with_runs_is_one_line_and_left_as_it_was(half_migrated, tmp_path):
    import sqlite3

    db = tmp_path / "with-runs.db"
    _copy(half_migrated, db)
    with sqlite3.connect(db) as con:  # what an older store would hold: an experiment of the user's
        con.execute("INSERT INTO experiments (experiment_id, name, lifecycle_stage) VALUES (1, 'mine', 'active')")
    before = db.read_bytes()
    with pytest.raises(StoreError) as err:
        prepare_store(f"sqlite:///{db}")
    message = str(err.value)
    assert "\n" not in message and str(db) in message and "half-migrated" in message
    assert "point tracking.tracking_uri" in message and "hvdsync runs push" in message
    assert db.read_bytes() == before
    # No copy and no migration attempt left behind (only the lock file beside it).
    assert sorted(p.name for p in tmp_path.iterdir()) == [".with-runs.db.hvdsync-lock", "with-runs.db"]


def test_a_half_created_store_without_runs_is_created_again(half_migrated, tmp_path):
    db = tmp_path / "empty.db"
    _copy(half_migrated, db)
    line = prepare_store(f"sqlite:///{db}")
    assert f"tracking store {db} was half-created and held no runs" in line
    assert _opens(f"sqlite:///{db}")
    assert len(list(tmp_path.glob("empty.db.hvdsync-broken-*"))) == 1   # kept, should anyone want to look


def test_a_kill_during_hvdsyncs_creation_leaves_no_store_and_the_next_call_makes_it(tmp_path):
    uri = f"sqlite:///{tmp_path / 'new.db'}"
    # The migration takes about a second here, less on a faster or idler machine: a kill that comes after hvdsync
    # has moved the finished store into place tests nothing, so the kill comes sooner until it lands inside the
    # creation (a temporary store is left).
    for after in (0.8, 0.4, 0.1, 0.0):
        # From the moment hvdsync's temporary store appears (its migrations start in it).
        killed = _kill_during_migration(HVDSYNC_PREPARE, uri, after,
                                        started=lambda: any(tmp_path.glob(".new.db.hvdsync-new-*")))
        if killed and list(tmp_path.glob(".new.db.hvdsync-new-*")):
            break
        (tmp_path / "new.db").unlink(missing_ok=True)     # finished before the kill: try again, sooner
    assert not (tmp_path / "new.db").exists()            # only the temporary file, never a half-made store
    # The temporary store, and its hot journal where the kill came inside one of MLflow's transactions.
    left = sorted(p.name for p in tmp_path.glob(".new.db.hvdsync-new-*"))
    assert len(left) in (1, 2) and left[1:] in ([], [left[0] + "-journal"]), left
    assert prepare_store(uri) is None
    assert _opens(uri)
    assert not list(tmp_path.glob(".new.db.hvdsync-new-*"))


def test_a_run_on_a_half_migrated_store_keeps_every_record_until_runs_push(half_migrated, tmp_path):
    import sqlite3

    db = tmp_path / "store.db"
    _copy(half_migrated, db)
    with sqlite3.connect(db) as con:
        con.execute("INSERT INTO experiments (experiment_id, name, lifecycle_stage) VALUES (1, 'mine', 'active')")
    uri = f"sqlite:///{db}"
    tracker = MLflowTracker(uri, experiment="kept", spool_dir=str(tmp_path / "spool"), flush_seconds=60)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        tracker.start({"train.lr": 0.1}, tags={"framework": "torch"})
        for step in range(5):
            tracker.log_metrics({"loss": 1.0 / (step + 1)}, step=step)
        tracker.finish()
    lines = [str(w.message) for w in caught if issubclass(w.category, TrackingWarning)]
    assert len(lines) == 1 and f"tracking store {db} is half-migrated" in lines[0], lines
    assert tracker.run_id is None and len(tracker.spool.pending()) == 8   # start, params, 5 metrics, end
    # The user restores the store (here: a healthy one put in its place), then pushes the spool.
    healthy = tmp_path / "healthy.db"
    prepare_store(f"sqlite:///{healthy}")
    shutil.move(healthy, db)
    assert cli.main(["runs", "push", str(tmp_path / "spool")]) == 0
    client = mlflow.MlflowClient(tracking_uri=uri)
    run = client.search_runs([client.get_experiment_by_name("kept").experiment_id])[0]
    assert run.info.status == "FINISHED" and run.data.params["train.lr"] == "0.1"
    assert [m.step for m in client.get_metric_history(run.info.run_id, "loss")] == [0, 1, 2, 3, 4]
