"""Start Horovod workers on this machine (Gloo over loopback), or on a host list over ssh, and bring their results back.

This is what the CLI, the notebooks and the tests use instead of hand-built ``horovodrun`` command strings:
:func:`run` calls Horovod's own Python launcher (``horovod.runner.run``, driven by :mod:`hvdsync.launch.runner`), which
starts ``np`` worker processes, runs a picklable function in each and returns the per-rank return values;
:func:`train` trains as a config says, through :class:`LocalLauncher`, the template's subclass for a fixed set of
workers (:class:`hvdsync.launch.base.Launcher`).

Quiet by default: worker output (with Horovod's ``[rank]<stdout>:`` prefixes and framework start-up lines) goes to
a log file, and a tqdm bar in this process follows rank 0's progress. When a worker fails, the error shows the last
lines of that log.
"""
from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any, Sequence

from hvdsync.config import Config, ConfigError
from hvdsync.core.train._context import FitResult
from hvdsync.launch import base, worker
from hvdsync.launch.base import Launcher, Start, WorkerError, horovod_frameworks
from hvdsync.launch.moved import moved
from hvdsync.launch.runner import host_placement, run

__all__ = ["run", "train", "train_many", "LocalLauncher", "WorkerError", "horovod_frameworks"]

# Kept for callers of 0.2.0's private name (tests/unit/test_cli_errors.py): the host-list placement's home is the runner.
_where = host_placement
# Moved to hvdsync.launch.base (issue 50: what every launcher shares is the base's, not the local launcher's).
__getattr__ = moved(__name__, {"QUIET_ENV": "hvdsync.launch.base", "environ": "hvdsync.launch.base",
                               "job_run": "hvdsync.launch.base", "preflight": "hvdsync.launch.base"})


class LocalLauncher(Launcher):
    """A fixed set of ``cfg.train.np`` workers: on this machine, or on ``hosts`` over ssh (with ``ssh_port``,
    ``ssh_identity_file``, ``network_interfaces``: see :func:`run`)."""

    name = "local"

    def __init__(self, hosts=None, ssh_port: int | None = None, ssh_identity_file: str | None = None,
                 network_interfaces: list[str] | None = None) -> None:
        super().__init__(hosts=hosts, ssh_port=ssh_port, ssh_identity_file=ssh_identity_file,
                         network_interfaces=network_interfaces)

    def placement(self, cfg: Config) -> dict:
        w = self.where
        return host_placement(w["hosts"], cfg.train.np, w["ssh_port"], w["ssh_identity_file"],
                              w["network_interfaces"])

    def start(self, cfg: Config, placed: dict, how: Start) -> list:
        return run(worker.fit, args=(cfg.to_dict(),), np=cfg.train.np, sync=cfg.sync, quiet=how.quiet,
                   progress=how.progress, log_dir=how.log_dir, runner_options=placed)


def train(cfg: Config, quiet: bool = True, progress: bool = True, log_dir: str | Path | None = None,
          **where: Any) -> FitResult:
    """Train as ``cfg`` says on ``cfg.train.np`` workers (local, or on the ``hosts`` given: see :func:`run`'s
    ``hosts``, ``ssh_port``, ``ssh_identity_file`` and ``network_interfaces``); returns rank 0's
    :class:`FitResult`. ``LocalLauncher(**where).train(cfg, ...)`` is the same.

    Every config error, host-list error and Horovod build mismatch is raised here, before any worker starts.
    """
    known = ("hosts", "ssh_port", "ssh_identity_file", "network_interfaces")
    unknown = sorted(k for k in where if k not in known)
    if unknown:
        base.preflight(cfg)  # as before the template: the build's refusal comes first
        raise TypeError(f"train() got unexpected keyword arguments: {', '.join(unknown)}")
    return LocalLauncher(**where).train(cfg, quiet=quiet, progress=progress, log_dir=log_dir)


def train_many(cfgs: list[Config], check_every_step: bool = False, quiet: bool = True,
               log_dir: str | Path | None = None, callbacks: Sequence = (), **where: Any) -> list[dict]:
    """Train several configs one after the other in *one* job of workers (one Horovod start-up for all); returns
    rank 0's result of each, as :meth:`FitResult.to_dict` plus ``numel``, ``wire_bytes_per_step_formula`` (what
    the codec's formula says one rank hands to Horovod per step), ``skipped_steps`` (mixed precision) and
    ``step_spread_max`` (with ``callbacks=[StepSpread()]``, :class:`hvdsync.torch.StepSpread`: the
    largest difference between the ranks' parameter fingerprints after any step; 0.0 means identical after every
    step; None without it) and ``link_bytes`` (what rank 0's host sent
    and received on the job's network interface during that config's training, from the interface's counters, where
    ``network_interfaces`` names one). ``where``: the hosts, as :func:`train`.

    All configs must ask for the same ``train.np`` and the same Horovod knobs (the workers are started once).
    ``callbacks`` run in every config's training, a fresh copy each, and what their ``report()`` returns joins its
    result. ``check_every_step=True`` is deprecated (until 0.3.0): it adds a ``StepSpread``.

    Example:
        >>> base = Config.from_dict({"train": {"epochs": 3}, "tracking": {"enabled": False}})
        >>> results = train_many([base.replace(sync={"compression": c}) for c in ("none", "topk:0.01")])  # doctest: +SKIP
    """
    if not cfgs:
        return []
    for cfg in cfgs:
        base.preflight(cfg)
    first = cfgs[0]
    for cfg in cfgs[1:]:
        if cfg.train.np != first.train.np or cfg.sync.horovod_env() != first.sync.horovod_env():
            raise ConfigError("train_many: every config must use the same train.np and Horovod knobs "
                              "(sync.fusion_threshold_mb, sync.cycle_time_ms, sync.cache_capacity)")
    if check_every_step:
        from hvdsync.core.telemetry._spread import StepSpread

        warnings.warn("train_many(check_every_step=True) is deprecated since hvdsync 0.2.0 and goes in 0.3.0: pass "
                      "callbacks=[StepSpread()] (hvdsync.torch.StepSpread or hvdsync.tensorflow.StepSpread)", DeprecationWarning,
                      stacklevel=2)
        callbacks = [*callbacks, StepSpread()]
    results = run(worker.fit_many, args=([c.to_dict() for c in cfgs], tuple(callbacks)), np=first.train.np,
                  sync=first.sync, quiet=quiet, progress=False, log_dir=log_dir, **where)
    return results[0]
