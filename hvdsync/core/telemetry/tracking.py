"""Run tracking in MLflow: one run per job, written by rank 0; a metric is never lost and never slows training.

Rank 0 writes the run (the other ranks' figures reach it through Horovod collectives, see
:mod:`hvdsync.core.telemetry.observe`); it writes through ``mlflow.MlflowClient`` with an explicit run id, never MLflow's
global "active run", whose ``atexit`` hook would end the run when any process holding it exits. Under hvdsync's
launchers the run is the job's, made by the launcher before any worker starts and named in ``HVDSYNC_RUN_ID``
(:mod:`hvdsync.core.telemetry.jobrun`): whichever process is rank 0, after any elastic reset, writes into it.

Every call goes to a local spool first (:mod:`hvdsync.core.telemetry.spool`, a file under ``tracking.spool_dir``) and returns
at once; a separate low-priority process (:mod:`hvdsync.core.telemetry.sender`) sends the spool to the store, with a short
timeout per request and a few retries. When the store does not answer (down at start, or dying mid-run) training
goes on at full speed, one warning says so and names the spool, and the sender keeps probing: what it could not
send is sent when the store answers again, by the next run that tracks to the same store (automatically), or by
``hvdsync runs push SPOOL``; each record lands once.

Both adapters (and the Keras callback) log through the same :class:`Tracker`, from the shared loop
(:mod:`hvdsync.core.train.loop`), so a PyTorch run and a TensorFlow run of the same config record the same names.
"""
from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

from hvdsync.core.telemetry.jobrun import JOB_ENV, RUN_ID_ENV
from hvdsync.core.telemetry.monitor import warn_line
from hvdsync.core.telemetry.record import mask_url_passwords
from hvdsync.core.telemetry.runsummary import SummaryKeeper
from hvdsync.core.telemetry import runlabel, sender
from hvdsync.core.telemetry.spool import Spool, default_spool_dir
# Defined with the store (the launcher's side uses them too); this module's names for them stay.
from hvdsync.core.telemetry.store import HTTP_ENV, resolve_uri  # noqa: F401 - re-exported

# The metric names every run records per epoch and at the end (the cross-framework test checks both frameworks log
# these); per-step, per-rank, monitor and system metrics come on top (see hvdsync.core.telemetry.observe).
EPOCH_METRICS = ("train_loss", "test_accuracy", "epoch_seconds", "samples_per_second", "step_seconds_max_rank",
                 "step_seconds_min_rank")
FINAL_METRICS = ("final_test_accuracy", "wire_bytes", "allreduce_rounds", "total_seconds")
# Each epoch's figures are logged under this prefix too (step = the epoch), MLflow's UI's own section for them.
EPOCH_PREFIX = "epoch/"

class TrackingWarning(UserWarning):
    """The MLflow store did not answer; the run's records are kept in the spool."""


class Tracker:
    """The no-op tracker (ranks other than 0, or tracking switched off). The MLflow one has the same methods."""

    active = False
    run_id: str | None = None
    spool_path: Path | None = None
    messages: tuple[str, ...] = ()

    def start(self, params: dict[str, Any], tags: dict[str, str] | None = None, run_id: str | None = None) -> None: ...

    def log_params(self, params: dict[str, Any]) -> None: ...

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None: ...

    def set_tags(self, tags: dict[str, Any]) -> None: ...

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None: ...

    def finish(self, status: str = "FINISHED") -> None: ...


class MLflowTracker(Tracker):
    """One MLflow run: spool first, a sender process second (:mod:`hvdsync.core.telemetry.sender`).

    Args:
        tracking_uri: the store ("" = MLflow's default).
        experiment: experiment name (created when missing).
        run_name: MLflow run name ("" lets MLflow choose).
        spool_dir: where the spool goes ("" = ``$HVDSYNC_CACHE/spool``).
        parent_run_id: makes this run a child of that one (``hvdsync sweep``).
        flush_seconds: how long :meth:`finish` waits for the sender before leaving the rest in the spool.
        retries: attempts per batch before the store counts as down (then it is probed every ``probe_seconds``).
    """

    def __init__(self, tracking_uri: str = "", experiment: str = "hvdsync", run_name: str = "", spool_dir: str = "",
                 parent_run_id: str = "", flush_seconds: float = 30.0, retries: int = 3,
                 probe_seconds: float = 2.0) -> None:
        self.active = True
        self._uri, self._experiment, self._run_name = tracking_uri, experiment, run_name
        self._spool_dir = Path(spool_dir) if spool_dir else default_spool_dir()
        self._parent, self._flush_seconds = parent_run_id, flush_seconds
        self._retries, self._probe_seconds = retries, probe_seconds
        self._sender: subprocess.Popen | None = None
        self._warned = False
        self._checked = 0.0
        self.messages: list[str] = []  # the warning, if any (the launcher shows it to the user)
        self.spool: Spool | None = None
        self._run_id: str | None = None
        self._continuing = False  # writing into a run another process created: params it has stay as they are
        self.pushed_from_earlier = 0
        self._summary = SummaryKeeper()  # the run's headline figures, logged once at the end
        self._facts: dict[str, str] = {}  # the run's facts as tags (hvdsync.core.telemetry.runlabel)

    # ---- the training process's side: write to the spool, never wait -----------------------------------------
    def _write(self, op: str, **fields: Any) -> None:
        if self.spool is None:
            return
        try:
            self.spool.append(op, **fields)
        except OSError as exc:  # a full disk must not stop training either
            self._warn(f"cannot write the tracking spool {self.spool.path} ({exc}); tracking is off")
            self.spool = None
            return
        now = time.monotonic()
        if now - self._checked > 1.0:  # at most once a second: has the sender found the store down?
            self._checked = now
            self._check_sender()

    def start(self, params: dict[str, Any], tags: dict[str, str] | None = None, run_id: str | None = None) -> None:
        """Start the run; with ``run_id`` (or ``HVDSYNC_RUN_ID``: the run the job's launcher created), go on writing
        to that existing run instead (the job's first rank 0, a new rank 0 after an elastic reset, a resumed job): no
        new run, and only the params the run does not have yet (MLflow refuses to change a logged param; the first
        rank 0's values stand, the launcher records the resets)."""
        run_id = run_id or os.environ.get(RUN_ID_ENV) or None
        job = os.environ.get(JOB_ENV, "")
        for key, value in HTTP_ENV.items():
            os.environ.setdefault(key, value)
        try:
            self._uri = resolve_uri(self._uri)
            self.spool = Spool.create(self._spool_dir)
        except Exception as exc:  # noqa: BLE001 - tracking must never stop training
            self._warn(f"MLflow tracking is off for this run: {exc}")
            self.active = False
            return
        self.spool.hold_lock()
        self.spool_path = self.spool.path
        tags = {**(tags or {}), **({"mlflow.parentRunId": self._parent} if self._parent else {})}
        # The framework the caller names (a user's own loop has no train.framework param) says what ran too.
        tags.update({**runlabel.source_tags(), **self._name_and_facts(
            {**({"train.framework": tags["framework"]} if tags.get("framework") else {}), **params})})
        # The spool's name as a tag makes creating the run idempotent: a create_run whose answer was lost (timed
        # out, server died) is found again instead of creating a second run.
        tags["hvdsync.spool"] = self.spool.path.stem
        if job:  # every rank 0 of one job spools under its key: `runs push` makes one run of them (spool.replay)
            tags["hvdsync.job"] = job
        self._continuing = bool(run_id or job)
        self._run_id = run_id  # known now, not once the store answers: an elastic commit records it at once
        self._write("start", uri=self._uri, experiment=self._experiment,
                    run_name=self._run_name or tags.get("mlflow.runName", ""), tags=tags,
                    time=_now_ms(), **({"run_id": run_id} if run_id else {}))
        self.log_params(runlabel.applicable(params))
        dataset = runlabel.dataset_input(params)
        if dataset:
            self._write("dataset", dataset=dataset)
        if self._parent and os.environ.get(runlabel.SWEEP_ENV):  # a sweep's child: its job and launcher
            self.set_tags({"hvdsync.job": os.environ[runlabel.SWEEP_ENV], "hvdsync.launcher": "sweep"})
        try:
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(
                [str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
                   sender.PARENT_ENV: str(os.getpid())}
            log = open(self.spool.path.with_suffix(".log"), "ab")
            self._sender = subprocess.Popen(sender.command(self.spool.path, self._uri, self._retries,
                                                           self._probe_seconds),
                                            stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env)
            log.close()
        except OSError as exc:
            self._warn(f"the MLflow sender did not start ({exc}); the run is kept in {self.spool.path}: "
                       f"`hvdsync runs push {self.spool.path}` sends it")

    def _name_and_facts(self, params: dict[str, Any]) -> dict[str, str]:
        """The facts tags of ``params`` and, unless the config names the run, the name that says them."""
        self._facts.update(runlabel.facts(params))
        name = "" if self._run_name else runlabel.run_name(self._facts)
        return {**self._facts, **({"mlflow.runName": name} if name else {})}

    def log_params(self, params: dict[str, Any]) -> None:
        if "hosts.count" in params and self.spool is not None:  # placement is known once every rank named its host
            self.set_tags(self._name_and_facts(params))
        self._write("params", params={k: mask_url_passwords(str(v)) for k, v in params.items()},
                    **({"only_new": True} if self._continuing else {}))

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        now = _now_ms()
        self._summary.add(metrics)
        self._write("metrics", metrics=[[k, float(v), now, int(step or 0)] for k, v in metrics.items()])

    def set_tags(self, tags: dict[str, Any]) -> None:
        self._write("tags", tags={k: str(v) for k, v in tags.items()})

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        if self.spool is None:
            return
        try:
            name = self.spool.add_file(path)
        except OSError as exc:
            self._warn(f"artifact {path} not recorded ({exc})")
            return
        self._write("artifact", file=name, artifact_path=artifact_path)

    def finish(self, status: str = "FINISHED") -> None:
        """End the run: the end record goes to the spool; wait up to ``flush_seconds`` for the sender."""
        if self.spool is None:
            return
        # Whole-run figures after warm-up (hvdsync.core.telemetry.runsummary), once: not the last epoch's swing.
        summary = self._summary.summary()
        if summary:
            self.log_metrics(summary, step=0)
        self._write("end", status=status, time=_now_ms())
        if self._sender is not None:
            # Wait for the sender to send the end record; once it has found the store down, give it one more probe
            # and stop: a dead store must not hold up the end of training for the whole flush time.
            deadline = time.monotonic() + self._flush_seconds
            while self._sender.poll() is None and time.monotonic() < deadline:
                if self._store_down():
                    deadline = min(deadline, time.monotonic() + self._probe_seconds + 2.0)
                time.sleep(0.1)
            if self._sender.poll() is None:
                self._sender.terminate()
                self._sender.wait()
        self._check_sender()
        left = len(self.spool.pending())
        if left:
            self._warn(f"{left} tracking records were not sent to {self._uri}; they are kept in "
                       f"{self.spool.path}: `hvdsync runs push {self.spool.path}` sends them (the next run to this "
                       f"store also does)")
        self.spool.close()
        self.spool.release_lock()
        if not left and self.run_id and self.spool.complete():
            self.spool.remove()  # everything is in the store now
            for suffix in (".status", ".log"):
                self.spool.path.with_suffix(suffix).unlink(missing_ok=True)

    @property
    def run_id(self) -> str | None:  # type: ignore[override]
        """The MLflow run id once the store has created the run (None while it has not answered)."""
        if self._run_id is None and self.spool is not None:
            self._run_id = self.spool.run_id()
        return self._run_id

    def _sender_state(self) -> dict:
        try:
            return json.loads(self.spool.path.with_suffix(".status").read_text())
        except (OSError, ValueError, AttributeError):
            return {}

    def _store_down(self) -> bool:
        return self._sender_state().get("state") == "down"

    def _check_sender(self) -> None:
        """Read the sender's state: warn (once) when it found the store down."""
        state = self._sender_state()
        self.pushed_from_earlier = state.get("earlier", 0)
        if state.get("state") == "down":
            self._warn(f"the MLflow store {self._uri} did not answer ({state.get('error', '')}); training goes on, "
                       f"every record is kept in {self.spool.path} and sent when the store answers again, or by "
                       f"`hvdsync runs push {self.spool.path}`")

    def _warn(self, message: str) -> None:
        if not self._warned:  # one warning per run: a flapping server must not flood the user's terminal
            self._warned = True
            self.messages.append(message)
            warn_line(message, TrackingWarning)


def _now_ms() -> int:
    return int(time.time() * 1000)


def make_tracker(tracking_cfg, rank: int) -> Tracker:
    """The tracker for this rank: MLflow on rank 0 when enabled, else the no-op one."""
    if rank != 0 or not tracking_cfg.enabled:
        return Tracker()
    return MLflowTracker(tracking_cfg.tracking_uri, tracking_cfg.experiment, tracking_cfg.run_name,
                         spool_dir=tracking_cfg.spool_dir,
                         parent_run_id=tracking_cfg.parent_run_id, flush_seconds=tracking_cfg.flush_seconds)
