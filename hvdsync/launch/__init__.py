"""Starting workers: the CLI, the local launcher, the elastic launcher, the worker entry point, recorded runs.

    hvdsync.launch.run(fn, np=2)            a function on local Horovod workers (cli, notebooks, tests)
    hvdsync.launch.train(cfg)               the built-in training job, as the CLI's ``hvdsync train``
    hvdsync.launch.elastic.train(cfg)       the same, elastic (workers may come and go)
    hvdsync.launch.choose(cfg, ...).train(cfg)   the launcher that ``hvdsync train``'s options pick, run

Every launcher starts workers through one entry point (:mod:`hvdsync.launch.worker`), which quiets the framework's
start-up lines before anything imports it, registers the stack dump a stalled job asks for, then calls the function.
What the launchers share (progress, the driver's log, error mapping) is :mod:`hvdsync.launch.base`; which one a job
goes to is :func:`choose`, here rather than in the base so that the base imports no launcher.
"""
from __future__ import annotations

import importlib
import os
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Mapping

from hvdsync.config import Config, ConfigError
from hvdsync.launch.base import QUIET_ENV, Launcher, WorkerError, horovod_frameworks, preflight
from hvdsync.launch.local import run, train, train_many
from hvdsync.launch.worker import ADAPTERS

__all__ = ["run", "train", "train_many", "preflight", "horovod_frameworks", "WorkerError", "ADAPTERS", "QUIET_ENV",
           "choose", "Launch", "Launcher"]

# The launchers by module name in this package; each has ``train(cfg, quiet=, log_dir=, **where)``, which builds its
# subclass of :class:`hvdsync.launch.base.Launcher` from ``where`` and calls the template's ``train``.
LAUNCHERS = ("local", "elastic", "ray")
IN_STEP = "slurm"  # a task of an srun step: no launcher, it trains as its own rank (hvdsync.launch.slurm)


@dataclass(frozen=True)
class Launch:
    """The launcher a job goes to and where it places the workers: what :func:`choose` returns.

    Attributes:
        launcher: ``"local"`` (this machine, or the ``hosts`` in ``where`` over ssh), ``"elastic"``, ``"ray"``, or
            ``"slurm"`` (this process is one task of an ``srun`` step and trains as its rank).
        where: the launcher's keyword arguments besides the config (``hosts``, ``ssh_port``, ``address``, ...).
        starts_workers: False in an srun step, whose tasks are the workers (each records its own command line).
        speaks: whether this process reports the job's errors: every launcher does; of an srun step's tasks only
            task 0, so that the job's log has each line once.
    """

    launcher: str
    where: dict[str, Any] = field(default_factory=dict)
    starts_workers: bool = True
    speaks: bool = True

    def module(self) -> ModuleType:
        """The launcher's module, imported by name now: Ray's (and Ray, which is optional) only for a Ray job."""
        return importlib.import_module(f"{__name__}.{self.launcher}")

    def train(self, cfg: Config, quiet: bool = True, log_dir=None):
        """Train as ``cfg`` says with this launcher; returns rank 0's result (in an srun step: this task's)."""
        if self.launcher == IN_STEP:
            # No launcher, so no log folder and no quiet log: the task's output is srun's (hvdsync.launch.slurm).
            return self.module().train_in_step(cfg, **self.where)
        return self.module().train(cfg, quiet=quiet, log_dir=log_dir, **self.where)


def choose(cfg: Config, ray: str | None = None, np_given: int | None = None,
           environ: Mapping[str, str] = os.environ, **where: Any) -> Launch:
    """The launcher for ``cfg`` and the ``hvdsync train`` options of where to run; starts nothing.

    Args:
        cfg: the checked config (``elastic.enabled`` picks the elastic launcher).
        ray: a Ray head's ``HOST:PORT`` or ``"auto"``: the Ray launcher (elastic too); with ``hosts`` or ssh options
            the Ray launcher refuses them in one line, as before.
        np_given: the worker count given on the command line, if any (checked against an srun step's tasks).
        environ: where to look for an srun step (:func:`hvdsync.launch.slurm.in_step`).
        where: ``hosts``, ``ssh_port``, ``ssh_identity_file``, ``network_interfaces`` for the launcher.

    Raises:
        ConfigError: an elastic job inside an srun step (elastic jobs need Horovod's launcher).

    Example:
        >>> choose(cfg, hosts="a:2,b:2").launcher           # doctest: +SKIP
        'local'
        >>> choose(cfg, ray="auto").train(cfg)               # doctest: +SKIP
    """
    from hvdsync.launch import slurm

    if cfg.elastic.resume and not cfg.elastic.enabled:
        # Only an elastic job writes and loads checkpoints: without --elastic, --resume would train from scratch.
        raise ConfigError("--resume: needs --elastic (elastic.enabled): only an elastic job writes and resumes "
                          "checkpoints; add --elastic, or leave out --resume to train from scratch")
    if cfg.elastic.checkpoint_dir and not cfg.elastic.enabled:
        # The same for the folder: a job that never writes it must not let the user believe it is checkpointed.
        raise ConfigError(f"--checkpoint-dir: needs --elastic (elastic.enabled): only an elastic job writes "
                          f"checkpoints, so {cfg.elastic.checkpoint_dir} would stay empty; add --elastic, or leave out "
                          f"--checkpoint-dir")
    if ray:
        return Launch("ray", {"address": ray, **where})
    if "hosts" not in where and slurm.in_step(environ):
        if cfg.elastic.enabled:
            raise ConfigError("--elastic is not allowed under srun: elastic jobs need Horovod's launcher (Gloo); run "
                              "one `hvdsync train --elastic --hosts slurm` in the batch script instead")
        # The other options of where are a launcher's; the step has none (Slurm placed its tasks).
        return Launch(IN_STEP, {"np_given": np_given}, starts_workers=False,
                      speaks=environ.get("SLURM_PROCID", "0") == "0")
    # With hosts the discovery script of an elastic job starts from them and their slots; its `hosts` file in the
    # log folder stays editable while the job runs (hvdsync.launch.elastic).
    return Launch("elastic" if cfg.elastic.enabled else "local", dict(where))
