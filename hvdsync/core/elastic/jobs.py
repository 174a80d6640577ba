"""Which job a checkpoint folder belongs to, and which job ``resume`` continues: decided before any worker starts.

A job is one training run however often it is reset or resumed: its id is made when it first starts
(:func:`new_job_id`), handed to every worker (:data:`JOB_ID_ENV`) and recorded in every manifest it writes, with the
settings a job that continues it must share (:func:`job_config`). :func:`claim` applies the rules:

* a new job writes only into a folder that holds no checkpoint: another job's would be mixed with its own, and the
  other job's ``resume`` would continue this one (or this one's the other). Refused in one line naming the folder
  and the ways out (a new folder, or ``resume`` to continue that job);
* ``resume`` continues the newest job in the folder whose settings match this job's (:data:`JOB_FIELDS`), keeping its
  id, and says which job, step and run in one line; when no job there matches, it is refused in one line naming the
  settings that differ. The model itself is checked by its fingerprint when rank 0 loads the checkpoint.

Checkpoints written before jobs were recorded (no ``job`` in the manifest) belong to no known job: a ``resume`` may
continue them (under a new job id: they are then another job's, never pruned), a new job may not write beside them.
"""
from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hvdsync.core.elastic._store import CheckpointStore
from hvdsync.core.elastic.checkpoint import CheckpointError

JOB_ID_ENV = "HVDSYNC_JOB_ID"            # the job the workers write as
RESUME_JOB_ENV = "HVDSYNC_RESUME_JOB"    # the job whose checkpoint rank 0 loads ("" = one without a job record)

# The settings a resumed job must share with the job it continues (flat config names). They fix the model and its
# optimizer (architecture, optimizer and its hyper-parameters, precision, the codec whose state is in the
# checkpoint), the data and its order (the committed position counts samples of that order) and the update rule.
# train.lr is one of them: the same command with another --lr is another experiment, and continuing a job with it
# would mix two trajectories under one job id and one MLflow run. Not among them, so they may change on resume:
# how the work is placed (train.np, data.batch_size, which is per worker and follows the world size, elastic.*,
# sync.mode and sync.ps_servers: the committed optimizer state is whole and is cut anew for another world or
# sharding), train.epochs (a finished job can be trained further), the device, tracking, monitoring, callbacks,
# and Horovod's performance knobs.
JOB_FIELDS = (
    "train.framework", "train.model", "train.hidden", "train.optimizer", "train.momentum", "train.lr",
    "train.lr_scaling", "train.growth_lr", "train.seed", "train.precision", "train.plugins",
    "data.dataset", "data.test_fraction", "data.shuffle", "data.synthetic_samples", "data.synthetic_features",
    "data.synthetic_classes", "data.synthetic_spread", "data.image_size", "data.image_channels", "data.shares",
    "data.batch_growth",
    "sync.compression", "sync.error_feedback", "sync.momentum_correction", "sync.accumulate", "sync.op",
    "sync.period", "sync.warmup_steps", "sync.sparse",
)


def job_config(flat: Mapping[str, Any]) -> dict[str, Any]:
    """The :data:`JOB_FIELDS` of a flat config (``Config.flat()``), as recorded in each manifest."""
    return {k: flat[k] for k in JOB_FIELDS if k in flat}


def new_job_id() -> str:
    return uuid.uuid4().hex[:12]


@dataclass
class JobRecord:
    """A job found in a checkpoint folder, by its newest checkpoint (the manifest as written, not yet verified)."""

    id: str                         # "" for checkpoints written without a job record
    config: dict[str, Any] | None   # None when not recorded
    step: int
    path: Path
    run_id: str | None
    written: float                  # when its newest checkpoint was written (its manifest's mtime)

    def describe(self) -> str:
        return f"job {self.id}, step {self.step}" if self.id else f"no job recorded, step {self.step}"


def jobs_in(store: CheckpointStore) -> list[JobRecord]:
    """Each job with a readable manifest in the store's folder, by its newest checkpoint, newest first."""
    found: dict[str, JobRecord] = {}
    for path in store.candidates():  # newest step first: the first one of a job is its newest
        manifest = store.manifest(path)
        if manifest is None:
            continue
        job = manifest.get("job") if isinstance(manifest.get("job"), dict) else {}
        job_id = str(job.get("id", ""))
        if job_id in found:
            continue
        meta = manifest.get("meta") if isinstance(manifest.get("meta"), dict) else {}
        try:
            step, written = int(manifest.get("step", -1)), (path / "manifest.json").stat().st_mtime
        except (OSError, TypeError, ValueError):
            continue
        config = job.get("config") if isinstance(job.get("config"), dict) else None
        found[job_id] = JobRecord(job_id, config, step, path, meta.get("run_id"), written)
    return sorted(found.values(), key=lambda j: j.written, reverse=True)


def differences(recorded: Mapping[str, Any] | None, config: Mapping[str, Any]) -> list[str]:
    """``"train.lr was 0.1, now 0.05"`` for each recorded setting that differs (none when nothing was recorded)."""
    if recorded is None:
        return []
    return [f"{k} was {recorded.get(k)!r}, now {config.get(k)!r}" for k in sorted(set(recorded) | set(config))
            if k in JOB_FIELDS and recorded.get(k) != config.get(k)]


@dataclass
class Claim:
    """What :func:`claim` decided: the id this job writes as, and the job it resumes (None: it starts fresh)."""

    job_id: str
    resumed: JobRecord | None = None

    def line(self) -> str:
        """The one line a resumed job prints ("" when it starts fresh: the workers say that)."""
        if self.resumed is None:
            return ""
        r = self.resumed
        who = f"job {r.id}" if r.id else f"checkpoints without a job record (now job {self.job_id})"
        run = f", MLflow run {r.run_id}" if r.run_id else ""
        return f"resuming {who} from step {r.step} ({r.path}{run})"


def claim(store: CheckpointStore, config: Mapping[str, Any], resume: bool) -> Claim:
    """Decide which job writes into ``store``'s folder (see the module docstring); raises
    :class:`~hvdsync.core.elastic.checkpoint.CheckpointError` with one line when it may not."""
    where = store.directory
    if not resume:
        if not store.candidates():
            return Claim(new_job_id())
        jobs = jobs_in(store)
        held = jobs[0].describe() if jobs else "their manifests unreadable"
        raise CheckpointError(f"elastic.checkpoint_dir: {where} holds checkpoints of another job ({held}); give "
                              "this job a new directory, or add --resume to continue that job")
    jobs = jobs_in(store)
    if not jobs:
        return Claim(new_job_id())  # the workers say "no checkpoint ...; starting fresh"
    # Jobs with a record first (their settings were compared), newest first; a folder of one job has one.
    fitting = [j for j in jobs if not differences(j.config, config)]
    fitting.sort(key=lambda j: j.config is None)
    if not fitting:
        newest = jobs[0]
        diff = "; ".join(differences(newest.config, config)[:4])
        raise CheckpointError(f"elastic.resume: {where} holds checkpoints of another job ({newest.describe()}; "
                              f"{diff}); resume with the settings that job was started with, or start this job in a "
                              "new directory")
    chosen = fitting[0]
    return Claim(chosen.id or new_job_id(), chosen)
