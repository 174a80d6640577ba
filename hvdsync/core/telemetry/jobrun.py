"""One job, one MLflow run: created by the process that launches the job, before any worker starts, and ended by it.

The launchers (``hvdsync train``, :func:`hvdsync.launch.train`, the elastic and host-list launchers, the Ray
launcher) call :func:`begin`: it makes the store ready (:func:`hvdsync.core.telemetry.store.prepare_store`), creates
the run and hands its id to the workers in ``HVDSYNC_RUN_ID`` (and the job's key in ``HVDSYNC_JOB``). Whichever worker
is rank 0, the first one or a new one after an elastic reset, writes into that run (:class:`~hvdsync.core.telemetry.
tracking.MLflowTracker` honours the variable, under a user's own ``horovodrun`` too), so the run survives any rank.
The launcher ends it with how the job ended (:meth:`JobRun.end`: ``FINISHED``, ``FAILED``, ``KILLED``).

A launcher killed whole cannot end its run, so :func:`begin` leaves a note (``<spool_dir>/jobs/<key>.json``: run,
store, pid and host of the launcher) that :meth:`JobRun.end` removes. The next command that looks (another job's
:func:`begin`, ``hvdsync runs list``, ``hvdsync runs push``) ends the run of every note whose launcher is gone as
``KILLED``, with a tag saying who noticed.

When the store cannot take the run now (a server down, a half-migrated file), :func:`begin` says so in one line and the
job goes on: rank 0 spools everything with the job's key as a tag, and ``hvdsync runs push`` creates the one run from
the spools of every rank 0 the job had (:func:`hvdsync.core.telemetry.spool.replay` finds it by that key).
"""
from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from hvdsync.core.telemetry.spool import default_spool_dir
from hvdsync.core.telemetry.store import HTTP_ENV, StoreError, prepare_store, resolve_uri

RUN_ID_ENV = "HVDSYNC_RUN_ID"
JOB_ENV = "HVDSYNC_JOB"


def _say(line: str) -> None:
    print(f"hvdsync: {line}", file=sys.stderr, flush=True)


def status_for(exc: BaseException | None) -> str:
    """The run status for a job that ended with ``exc`` (None: it finished)."""
    if exc is None:
        return "FINISHED"
    return "KILLED" if isinstance(exc, (KeyboardInterrupt, SystemExit)) else "FAILED"


def _client(uri: str):
    import mlflow

    for key, value in HTTP_ENV.items():  # a dead server costs seconds here, not MLflow's minutes of retries
        os.environ.setdefault(key, value)
    return mlflow.MlflowClient(tracking_uri=uri)


def _one_line(exc: BaseException) -> str:
    text = str(exc).splitlines()[0][:200] if str(exc) else ""
    return f"{type(exc).__name__}: {text}"


class JobRun:
    """The run of one job, as its launcher holds it.

    Attributes:
        uri: the store; run_id: the run (None when the store could not create it now); key: the job's key.
    """

    def __init__(self, uri: str, key: str, run_id: str | None, note: Path | None) -> None:
        self.uri, self.key, self.run_id, self._note = uri, key, run_id, note
        self.ended = False

    def env(self) -> dict[str, str]:
        """The variables that hand the run to the workers."""
        return {JOB_ENV: self.key, **({RUN_ID_ENV: self.run_id} if self.run_id else {})}

    def end(self, status: str, tags: dict[str, Any] | None = None) -> None:
        """Record ``tags`` and end the run with ``status``; a store that does not answer costs one line."""
        if self.ended:
            return
        self.ended = True
        if self.run_id is None:
            return
        try:
            from mlflow.entities import RunTag

            client = _client(self.uri)
            if tags:
                client.log_batch(self.run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])
            client.set_terminated(self.run_id, status=status)
        except Exception as exc:  # noqa: BLE001 - the job's result matters more than its record
            _say(f"warning: the MLflow run {self.run_id} could not be ended as {status} in {self.uri} "
                 f"({_one_line(exc)}); the next `hvdsync runs list` or `runs push` ends it")
            return
        if self._note is not None:
            self._note.unlink(missing_ok=True)


def begin(tracking, tags: dict[str, Any], continue_run: str | None = None,
          params: dict[str, Any] | None = None) -> JobRun | None:
    """Create the job's run (or reopen ``continue_run``: a resumed job) before any worker starts.

    Args:
        tracking: the config's :class:`~hvdsync.config.TrackingConfig` (None or disabled: no run, returns None).
        tags: the run's first tags (framework, launcher, elastic).
        continue_run: the run a resumed job goes on with (from its checkpoint); reopened as ``RUNNING``.
        params: the job's config, flat: what names and tags the run (:mod:`hvdsync.core.telemetry.runlabel`).
    """
    if tracking is None or not tracking.enabled:
        return None
    key = uuid.uuid4().hex
    try:
        uri = resolve_uri(tracking.tracking_uri)
    except Exception as exc:  # noqa: BLE001 - tracking never stops a job: rank 0 reports it again
        _say(f"warning: MLflow tracking: {_one_line(exc)}")
        return JobRun("", key, None, None)
    spool_dir = Path(tracking.spool_dir) if tracking.spool_dir else default_spool_dir()
    try:
        line = prepare_store(uri)
        if line:
            _say(line)
        client = _client(uri)
        end_abandoned(spool_dir, client=client, uri=uri)
        run_id = _reopen(client, continue_run) if continue_run else None
        if run_id is None:
            run_id = _create(client, tracking, {**tags, "hvdsync.job": key}, params)
    except StoreError as exc:
        _say(f"warning: {exc}")
        return JobRun(uri, key, None, None)
    except Exception as exc:  # noqa: BLE001 - a store down: the workers spool, `runs push` sends it later
        _say(f"warning: the MLflow store {uri} did not take this job's run ({_one_line(exc)}); training goes on "
             f"and rank 0 keeps every record in its spool under {spool_dir} for `hvdsync runs push`")
        return JobRun(uri, key, None, None)
    return JobRun(uri, key, run_id, _write_note(spool_dir, key, run_id, uri))


def _create(client, tracking, tags: dict[str, Any], params: dict[str, Any] | None) -> str:
    from hvdsync.core.telemetry import runlabel
    from hvdsync.core.telemetry.spool import experiment_id

    exp_id = experiment_id(client, tracking.experiment)
    if tracking.parent_run_id:
        tags = {**tags, "mlflow.parentRunId": tracking.parent_run_id}
    facts = runlabel.facts(params or {})
    tags = {**facts, **tags}
    # Named for what runs (rank 0 adds the hosts once it knows them), unless the config names it.
    name = tracking.run_name or (runlabel.run_name(facts) if facts else None)
    run = client.create_run(exp_id, run_name=name, tags={k: str(v) for k, v in tags.items()})
    return run.info.run_id


def _reopen(client, run_id: str) -> str | None:
    """Reopen a resumed job's run, counting the resume in its tags; None when the store no longer has it."""
    try:
        run = client.get_run(run_id)
    except Exception:  # noqa: BLE001 - deleted, or from another store: the resumed job gets a new run
        return None
    resumes = int(run.data.tags.get("hvdsync.resumes", "0")) + 1
    client.update_run(run_id, status="RUNNING")
    client.set_tag(run_id, "hvdsync.resumes", str(resumes))
    client.set_tag(run_id, f"hvdsync.resume.{resumes}",
                   f"{time.strftime('%Y-%m-%d %H:%M:%S')}: resumed from its checkpoint after ending "
                   f"{run.info.status}")
    return run_id


def _process_start(pid: int) -> float | None:
    import psutil

    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def _write_note(spool_dir: Path, key: str, run_id: str, uri: str) -> Path | None:
    note = spool_dir / "jobs" / f"{key}.json"
    try:
        note.parent.mkdir(parents=True, exist_ok=True)
        note.write_text(json.dumps({"run_id": run_id, "uri": uri, "pid": os.getpid(), "host": socket.gethostname(),
                                    "started": _process_start(os.getpid())}))
    except OSError:
        return None
    return note


def end_abandoned(spool_dir: str | Path | None = None, client=None, uri: str | None = None) -> list[str]:
    """End as ``KILLED`` the run of every job whose launcher (on this host) is gone without ending it; returns
    their run ids. ``uri``/``client``: only notes for that store (default: each note's own store)."""
    folder = Path(spool_dir) if spool_dir else default_spool_dir()
    ended = []
    for note in sorted((folder / "jobs").glob("*.json")):
        with contextlib.suppress(OSError, ValueError, KeyError):
            info = json.loads(note.read_text())
            if info["host"] != socket.gethostname() or (uri is not None and info["uri"] != uri):
                continue
            started = _process_start(info["pid"])
            if started is not None and (info["started"] is None or abs(started - info["started"]) < 1.0):
                continue  # its launcher is still running
            try:
                store = client if client is not None and info["uri"] == uri else _client(info["uri"])
                run = store.get_run(info["run_id"])
                if run.info.status == "RUNNING":
                    store.set_tag(info["run_id"], "hvdsync.ended_by",
                                  f"its launcher (pid {info['pid']} on {info['host']}) ended without ending the run; "
                                  f"noticed {time.strftime('%Y-%m-%d %H:%M:%S')}")
                    store.set_terminated(info["run_id"], status="KILLED")
                    ended.append(info["run_id"])
            except Exception:  # noqa: BLE001 - the store is down: the next command tries again
                continue
            note.unlink(missing_ok=True)
    return ended
