"""What an elastic job's launch adds to the template, once for every path (this machine, a host list, Ray): whose
checkpoints the job writes, its run folder, its MLflow run (continued when it resumes a job), the hosts Horovod lost,
the reset tags, FAILED/FINISHED with them, and the clean-up.

:class:`ElasticLauncher` is the :class:`~hvdsync.launch.base.Launcher` that :mod:`hvdsync.launch.elastic` (Horovod's
elastic driver over a discovery script) and :mod:`hvdsync.launch.ray` (Horovod's elastic Ray executor) subclass; it
sits below both, so neither launcher imports the other.
"""
from __future__ import annotations

import shutil
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

from hvdsync.config import Config, ConfigError
from hvdsync.launch import hosts as host_lists
from hvdsync.launch.base import Launcher, Start, WorkerError, lost_hosts
from hvdsync.launch.hosts import Host

# Gloo's timeout for an elastic job's workers, at least (hvdsync.launch.elastic.run_elastic says why).
GLOO_TIMEOUT_S = 180


class ElasticLauncher(Launcher):
    """The reset bookkeeping of an elastic job around the subclass's :meth:`start`.

    Before any worker starts: which job writes into ``elastic.checkpoint_dir`` (another job's folder, or nothing to
    resume, is one line), and the line that says which job a resumed one continues. Then the run folder
    (``log_dir``, or a temporary one removed afterwards), the job's MLflow run (the resumed job's, where the
    checkpoint names one), the hosts Horovod excludes while the job runs, and the run ended ``FAILED`` or
    ``FINISHED`` with the reset tags (:func:`reset_tags`). The start hook gets ``how.run_dir`` and ``how.env`` (the
    workers' checkpoint-job variables, :func:`job_env`).
    """

    run_dir_prefix = "hvdsync-elastic-"
    # Whether a failed job's temporary run folder stays (its pids, errors and worker log), named in the error.
    keep_failed_run_dir = True

    def job(self, cfg: Config, placed: Any, how: Start):
        own = how.log_dir is None
        run_dir = None
        lost: list[dict] = []
        try:
            chosen = checkpoint_job(cfg)  # whose checkpoints: refused here, in one line, before any worker starts
            resumed = chosen.resumed if chosen is not None else None
            if resumed is not None:
                print(f"hvdsync: {chosen.line()}", file=sys.stderr, flush=True)
            run_dir = Path(how.log_dir or tempfile.mkdtemp(prefix=self.run_dir_prefix))
            how = replace(how, run_dir=run_dir, env={**(how.env or {}), **job_env(chosen)})
            first = self.first_hosts(placed)
            with self.job_run(cfg, resumed.run_id if resumed is not None and cfg.tracking.enabled else None) as job:
                try:
                    with lost_hosts(lost):
                        results = self.start(cfg, placed, how)
                except WorkerError:
                    if job is not None:
                        job.end("FAILED", reset_tags(self.world_at_start(cfg, None), [], lost, first))
                    raise
                rank0 = self.rank0(results)
                if job is not None:
                    job.end("FINISHED", reset_tags(self.world_at_start(cfg, rank0), rank0.get("resets", []), lost,
                                                   first))
        except ConfigError:  # stopped before anything started: nothing in our folder worth keeping
            if own and run_dir is not None:
                shutil.rmtree(run_dir, ignore_errors=True)
            raise
        except BaseException:
            if own and run_dir is not None and not self.keep_failed_run_dir:
                shutil.rmtree(run_dir, ignore_errors=True)
            raise
        if own:
            shutil.rmtree(run_dir, ignore_errors=True)
        return self.result([rank0])

    def takes_callbacks(self, cfg: Config) -> bool:
        return True

    def result(self, results: list):
        from hvdsync.core.elastic.loop import ElasticResult

        return ElasticResult(**results[0])

    # -- what the paths record differently -------------------------------------------------------------------------
    def first_hosts(self, placed: Any) -> list[Host] | None:
        """The hosts the job started on, for the run's tags (None where the launcher does not pick them)."""
        return None

    def world_at_start(self, cfg: Config, rank0: dict | None) -> int:
        """The world size the job started with, for the tags; ``rank0`` is None when the job failed."""
        return cfg.train.np

    def rank0(self, results: list) -> dict:
        """Rank 0's result among the workers' results."""
        return results[0]


def checkpoint_job(cfg: Config):
    """Which job writes into ``elastic.checkpoint_dir`` (:func:`hvdsync.core.elastic.jobs.claim`): a
    :class:`~hvdsync.core.elastic.jobs.Claim`, or None without a checkpoint folder. A folder that holds another job's
    checkpoints (for a new job), or no job this one may continue (for ``--resume``), is one :class:`ConfigError`
    line, raised before any worker starts."""
    if not cfg.elastic.checkpoint_dir:
        return None
    from hvdsync.core.elastic._store import CheckpointStore
    from hvdsync.core.elastic.checkpoint import CheckpointError
    from hvdsync.core.elastic.jobs import claim, job_config

    try:
        return claim(CheckpointStore(cfg.elastic.checkpoint_dir, report=lambda line: None),
                     job_config(cfg.flat()), cfg.elastic.resume)
    except CheckpointError as exc:
        raise ConfigError(str(exc)) from None


def job_env(chosen) -> dict[str, str]:
    """The workers' environment for a :func:`checkpoint_job` decision: the job they write as and, when resuming,
    the job whose checkpoint rank 0 loads."""
    from hvdsync.core.elastic.jobs import JOB_ID_ENV, RESUME_JOB_ENV

    if chosen is None:
        return {}
    env = {JOB_ID_ENV: chosen.job_id}
    if chosen.resumed is not None:
        env[RESUME_JOB_ENV] = chosen.resumed.id
    return env


def resumed_run(cfg: Config) -> str | None:
    """The MLflow run a resumed job goes on with: the one the checkpoint of the job it continues names (the workers
    load that job's checkpoint); None for a fresh job or a checkpoint without one. One run per job, however often it
    resumes: its metrics go on by step, and its tags count the resumes (:func:`hvdsync.core.telemetry.jobrun.begin`)."""
    if not (cfg.elastic.resume and cfg.elastic.checkpoint_dir and cfg.tracking.enabled):
        return None
    try:
        chosen = checkpoint_job(cfg)
    except ConfigError:
        return None
    return chosen.resumed.run_id if chosen is not None and chosen.resumed is not None else None


def reset_tags(np: int, resets: list[dict], lost: list[dict], hosts: list[Host] | None) -> dict[str, str]:
    """The tags that record an elastic job's resets in its run: the world sizes in order, each reset (when, why,
    the sizes, the recovery time) and each host Horovod excluded after its workers failed, with when."""
    import time

    def when(t: float) -> str:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))

    tags = {"hvdsync.world_sizes": ",".join(str(n) for n in [np, *(e["size_after"] for e in resets)]),
            "hvdsync.resets": str(len(resets))}
    for i, e in enumerate(resets, 1):
        tags[f"hvdsync.reset.{i}"] = (f"{when(e['time'])}: {e['reason']}, {e['size_before']} -> {e['size_after']} "
                                      f"workers, recovered in {e['recovery_seconds']:.2f}s (step {e['step']})")
    if lost:
        tags["hvdsync.lost_hosts"] = ", ".join(f"{x['host']} at {when(x['time'])}" for x in lost)
    if hosts:
        tags["hvdsync.first_hosts"] = host_lists.to_horovod(hosts)
    return tags
