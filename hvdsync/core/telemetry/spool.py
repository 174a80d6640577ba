"""The local spool of a tracked run: every record is written here first, then sent to MLflow.

A spool is one append-only JSON-lines file per run (``<spool_dir>/<stamp>-<id>.jsonl``) plus an acknowledgement
file beside it (``.acks``) that lists the sequence numbers the store has accepted, and a folder (``.files``) with
copies of the artifacts. Records, in order::

    {"seq": 0, "op": "start", "uri": ..., "experiment": ..., "run_name": ..., "tags": {...}}
    {"seq": 1, "op": "params", "params": {...}, "only_new": true}    # only_new: into a run another process made
    {"seq": 2, "op": "metrics", "metrics": [[key, value, timestamp_ms, step], ...]}
    {"seq": 3, "op": "tags", "tags": {...}}
    {"seq": 4, "op": "artifact", "file": "<name in .files>", "artifact_path": "..."}
    {"seq": 5, "op": "end", "status": "FINISHED"}

:func:`replay` sends a record to MLflow (through ``MlflowClient``, explicit run id). Sending is idempotent where it
matters: a record is acknowledged only after the store accepted it, and a record sent twice (accepted but the
acknowledgement lost, e.g. the server died before answering) lands once, because MLflow's SQL store keys a metric
by (key, timestamp, step, value) and ignores an identical one; params and tags with equal values, and artifacts,
overwrite themselves. A spool whose every record is acknowledged is removed.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import time
import uuid
from pathlib import Path
from typing import Any, Iterator

from hvdsync.core.telemetry.store import prepare_store

# MLflow's log_batch limits (per request): 1000 metrics, 100 params, 100 tags.
_MAX_METRICS, _MAX_PARAMS = 1000, 100


def default_spool_dir() -> Path:
    """``$HVDSYNC_CACHE/spool`` (default ``~/.cache/hvdsync/spool``), where runs spool unless told otherwise."""
    return Path(os.environ.get("HVDSYNC_CACHE") or Path.home() / ".cache" / "hvdsync") / "spool"


class Spool:
    """One run's spool file, its acknowledgements and its artifact copies.

    Args:
        path: the ``.jsonl`` file (created by :meth:`create`, or an existing one to push).
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.acks_path = self.path.with_suffix(".acks")
        self.files_dir = self.path.with_suffix(".files")
        self._lock_file = None
        self._next_seq = 0
        self._out = None

    @classmethod
    def create(cls, spool_dir: str | Path) -> "Spool":
        """A new, empty spool in ``spool_dir`` (made if missing)."""
        spool_dir = Path(spool_dir)
        spool_dir.mkdir(parents=True, exist_ok=True)
        name = time.strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:8]
        spool = cls(spool_dir / f"{name}.jsonl")
        spool.path.touch()
        return spool

    # ---- writing (the training process) -------------------------------------------------------------------
    def append(self, op: str, **fields: Any) -> dict:
        """Write one record (flushed to the OS at once: a crash of this process loses nothing written)."""
        if self._out is None:
            self._next_seq = sum(1 for _ in self.records())
            self._out = open(self.path, "a", buffering=1)
        record = {"seq": self._next_seq, "op": op, **fields}
        self._out.write(json.dumps(record, allow_nan=True) + "\n")
        self._next_seq += 1
        return record

    def add_file(self, source: str | Path) -> str:
        """Copy ``source`` into the spool (so it survives a temporary folder); returns its name there."""
        name = f"{self._next_seq}/{Path(source).name}"  # a folder per record: same-named files stay apart
        (self.files_dir / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, self.files_dir / name)
        return name

    def close(self) -> None:
        if self._out is not None:
            self._out.close()
            self._out = None

    # ---- reading and acknowledging (the sender, `hvdsync runs push`) --------------------------------------
    def records(self) -> Iterator[dict]:
        """Every complete record, in order (a half-written last line, from a crash, is skipped)."""
        with contextlib.suppress(FileNotFoundError), open(self.path) as f:
            for line in f:
                if line.endswith("\n"):
                    yield json.loads(line)

    def acks(self) -> dict[int, dict]:
        """Acknowledged sequence numbers, each with what the store answered (the run id for ``start``)."""
        out: dict[int, dict] = {}
        with contextlib.suppress(FileNotFoundError), open(self.acks_path) as f:
            for line in f:
                if line.endswith("\n"):
                    ack = json.loads(line)
                    out[ack["seq"]] = ack
        return out

    def ack(self, seqs: list[int], **fields: Any) -> None:
        """Record that the store accepted the records ``seqs`` (one write, made durable before returning)."""
        with open(self.acks_path, "a") as f:
            f.write("".join(json.dumps({"seq": seq, **fields}) + "\n" for seq in seqs))
            f.flush()
            os.fsync(f.fileno())

    def pending(self) -> list[dict]:
        """Records the store has not acknowledged yet, in order."""
        done = self.acks()
        return [r for r in self.records() if r["seq"] not in done]

    def run_id(self) -> str | None:
        """The MLflow run id, once the store has created the run."""
        return self.acks().get(0, {}).get("run_id")

    def target(self) -> str | None:
        """The tracking URI this spool is for."""
        first = next(self.records(), None)
        return first.get("uri") if first else None

    def complete(self) -> bool:
        """Every record acknowledged and the run ended."""
        records = list(self.records())
        done = self.acks()
        return bool(records) and records[-1]["op"] == "end" and all(r["seq"] in done for r in records)

    def remove(self) -> None:
        for p in (self.path, self.acks_path, self.path.with_suffix(".lock")):
            p.unlink(missing_ok=True)
        shutil.rmtree(self.files_dir, ignore_errors=True)

    @contextlib.contextmanager
    def locked(self, wait: bool = False) -> Iterator[bool]:
        """Hold this spool's lock (one sender at a time); yields False when another process holds it."""
        f = open(self.path.with_suffix(".lock"), "a")
        try:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
            except BlockingIOError:
                yield False
                return
            yield True
        finally:
            f.close()

    def hold_lock(self) -> bool:
        """Take this spool's lock for the life of this object (the live run holds its own spool)."""
        self._lock_file = open(self.path.with_suffix(".lock"), "a")
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            return False

    def release_lock(self) -> None:
        if self._lock_file is not None:
            self._lock_file.close()
            self._lock_file = None


def pending_spools(spool_dir: str | Path, uri: str, exclude: Path | None = None) -> list[Spool]:
    """Spools in ``spool_dir`` for tracking ``uri`` that still hold unsent records (oldest first)."""
    out = []
    for path in sorted(Path(spool_dir).glob("*.jsonl")):
        if exclude is not None and path == exclude:
            continue
        spool = Spool(path)
        if spool.target() == uri and spool.pending():
            out.append(spool)
    return out


def remove_delivered_continuations(spool_dir: str | Path, uri: str, exclude: Path | None = None) -> int:
    """Remove the spools in ``spool_dir`` of rank 0s that died while writing into a run another process made (an
    elastic job's rank 0 before a reset): every record delivered, and no end to come (the launcher ends that run),
    so nothing else would ever remove them. A spool some process still holds is left alone. Returns how many."""
    removed = 0
    for path in sorted(Path(spool_dir).glob("*.jsonl")):
        spool = Spool(path)
        first = next(spool.records(), None)
        if path == exclude or not first or not first.get("run_id") or first.get("uri") != uri or spool.pending():
            continue
        with spool.locked() as mine:
            if mine:
                spool.remove()
                for suffix in (".status", ".log"):
                    path.with_suffix(suffix).unlink(missing_ok=True)
                removed += 1
    return removed


# ---- sending to MLflow ------------------------------------------------------------------------------------------
def next_batch(records) -> list[dict]:
    """The records to send in one request from the head of ``records`` (a sequence): consecutive metrics records
    go together, up to MLflow's 1000 metrics per request; any other record goes alone."""
    batch: list[dict] = []
    count = 0
    for record in records:
        if batch and (record["op"] != "metrics" or batch[0]["op"] != "metrics"
                      or count + len(record["metrics"]) > _MAX_METRICS):
            break
        batch.append(record)
        count += len(record.get("metrics", ()))
    return batch


def send(client, spool: Spool, batch: list[dict]) -> None:
    """Apply ``batch`` (from :func:`next_batch`) to the store behind ``client`` and acknowledge it in the spool.

    Raises whatever MLflow raises (the caller retries, or leaves the records for later)."""
    if batch[0]["op"] == "metrics" and len(batch) > 1:
        merged = {"op": "metrics", "metrics": [m for r in batch for m in r["metrics"]]}
        replay(client, spool, merged)
        spool.ack([r["seq"] for r in batch])
    else:
        spool.ack([batch[0]["seq"]], **replay(client, spool, batch[0]))


def replay(client, spool: Spool, record: dict) -> dict:
    """Apply one spool ``record`` to the store behind ``client``; returns what to acknowledge it with.

    Raises whatever MLflow raises (the caller retries, or leaves the record for later)."""
    from mlflow.entities import Metric, Param, RunTag

    op = record["op"]
    if op == "start":
        if record.get("run_id"):  # continuing an existing run (the launcher's, an elastic job's new rank 0, ...)
            # Its tags too (the framework, the caller's own); not the spool's name, which would only name the last.
            tags = {k: v for k, v in (record.get("tags") or {}).items() if k != "hvdsync.spool"}
            if tags:
                client.log_batch(record["run_id"], tags=[RunTag(k, str(v)) for k, v in tags.items()])
            return {"run_id": record["run_id"]}
        exp_id = experiment_id(client, record["experiment"])
        tags = record.get("tags") or {}
        # Created before, its answer lost (see MLflowTracker.start)? Or, for a job whose launcher could not create
        # its run, by another rank 0 of the same job (the job's key): one run either way.
        key = "hvdsync.job" if tags.get("hvdsync.job") else "hvdsync.spool"
        if tags.get(key):
            found = client.search_runs([exp_id], f"tags.`{key}` = '{tags[key]}'", max_results=1)
            if found:
                return {"run_id": found[0].info.run_id}
        run = client.create_run(exp_id, run_name=record.get("run_name") or None, tags=record.get("tags") or {},
                                start_time=record.get("time"))
        return {"run_id": run.info.run_id}
    run_id = spool.run_id()
    if run_id is None:
        raise RuntimeError("the run was not created yet")
    if op == "params":
        params = [Param(k, str(v)) for k, v in sorted(record["params"].items())]
        if record.get("only_new"):  # into a run another process created: what it has stays (MLflow refuses changes)
            have = client.get_run(run_id).data.params
            params = [p for p in params if p.key not in have]
        for i in range(0, len(params), _MAX_PARAMS):
            client.log_batch(run_id, params=params[i:i + _MAX_PARAMS])
    elif op == "metrics":
        metrics = [Metric(k, float(v), int(ts), int(step)) for k, v, ts, step in record["metrics"]]
        for i in range(0, len(metrics), _MAX_METRICS):
            _log_metrics(client, run_id, metrics[i:i + _MAX_METRICS])
    elif op == "tags":
        client.log_batch(run_id, tags=[RunTag(k, str(v)) for k, v in record["tags"].items()])
    elif op == "dataset":  # the run's data set as an MLflow dataset input (the UI's "Datasets" column and filter)
        from mlflow.entities import Dataset, DatasetInput, InputTag

        d = record["dataset"]
        client.log_inputs(run_id, datasets=[DatasetInput(
            Dataset(d["name"], d["digest"], "hvdsync", d["source"], profile=d.get("profile")),
            tags=[InputTag("mlflow.data.context", d.get("context", "training"))])])
    elif op == "artifact":
        client.log_artifact(run_id, str(spool.files_dir / record["file"]), record.get("artifact_path") or None)
    elif op == "end":
        client.set_terminated(run_id, status=record["status"], end_time=record.get("time"))
    else:
        raise ValueError(f"unknown spool record {op!r}")
    return {}


def experiment_id(client, name: str) -> str:
    """The id of experiment ``name``, created when missing (or found when another process, or a lost answer, created
    it first) as a model-training experiment: MLflow's UI then opens it on its runs, not on the GenAI overview. An
    experiment without a kind gets it; a kind someone chose stays."""
    from hvdsync.core.telemetry.runlabel import EXPERIMENT_KIND, EXPERIMENT_KIND_TAG

    exp = client.get_experiment_by_name(name)
    if exp is None:
        try:
            return client.create_experiment(name, tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND})
        except Exception:
            exp = client.get_experiment_by_name(name)
            if exp is None:
                raise
    if EXPERIMENT_KIND_TAG not in exp.tags:
        client.set_experiment_tag(exp.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
    return exp.experiment_id


def _log_metrics(client, run_id: str, metrics: list) -> None:
    """MLflow refuses metrics for a terminated run. That happens only when a record is sent again after the run's
    end was already accepted (its acknowledgement lost): reopen the run for the resend, then end it as it was."""
    try:
        client.log_batch(run_id, metrics=metrics)
        return
    except Exception:
        run = client.get_run(run_id)
        if run.info.status == "RUNNING":
            raise
    client.update_run(run_id, status="RUNNING")
    try:
        client.log_batch(run_id, metrics=metrics)
    finally:
        client.set_terminated(run_id, status=run.info.status, end_time=run.info.end_time)


def push(spool: Spool, client=None) -> dict:
    """Send every unacknowledged record of ``spool`` to its store (``hvdsync runs push``); removes the spool when
    all is sent. Returns ``{"sent": n, "left": m, "run_id": ...}``; stops at the first record the store refuses."""
    import mlflow

    if client is None:
        # Made ready first (never migrated in place; a half-migrated store is one StoreError line, untouched).
        prepare_store(spool.target())
        client = mlflow.MlflowClient(tracking_uri=spool.target())
    sent = 0
    with spool.locked() as mine:
        if not mine:
            raise RuntimeError(f"{spool.path} is being sent by another process (a run still training?)")
        pending = spool.pending()
        while sent < len(pending):
            batch = next_batch(pending[sent:])
            send(client, spool, batch)
            sent += len(batch)
        run_id = spool.run_id()
        if spool.complete():
            spool.remove()
    return {"sent": sent, "left": len(pending) - sent, "run_id": run_id}
