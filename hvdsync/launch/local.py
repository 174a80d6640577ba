"""Start Horovod workers on this machine (Gloo over loopback) and bring their results back.

This is what the CLI, the notebooks and the tests use instead of hand-built ``horovodrun`` command strings: it calls
Horovod's own Python launcher (``horovod.runner.run``), which starts ``np`` worker processes, runs a picklable
function in each and returns the per-rank return values.

Quiet by default: worker output (with Horovod's ``[rank]<stdout>:`` prefixes and framework start-up lines) goes to
a log file, and a tqdm bar in this process follows rank 0's progress. When a worker fails, the error shows the last
lines of that log.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import tempfile
import threading
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from hvdsync.config import Config, ConfigError
from hvdsync.core.telemetry import jobrun
from hvdsync.core.telemetry.jobrun import JobRun
from hvdsync.core.train.callbacks import FitResult
from hvdsync.core.telemetry.progress import PROGRESS_ENV
from hvdsync.core.train.runtime import apply_horovod_env
from hvdsync.launch import worker
from hvdsync.launch.base import (Stopped, WorkerError, follow_progress, gloo_built, horovod_frameworks, mpi_built,
                                 signals_seen)
from hvdsync.launch.workers import Workers

# Environment every worker gets unless already set: no TensorFlow C++ INFO/WARNING screenfuls, unbuffered output.
QUIET_ENV = {"TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1"}

def preflight(cfg: Config) -> None:
    """Checks that need no worker: Horovod present, built for the framework, op supported by this build."""
    built = horovod_frameworks()
    if not built:
        raise ConfigError("horovod: not installed in this environment; run `make install` (scripts/install.sh)")
    if cfg.train.framework not in built:
        raise ConfigError(f"train.framework: {cfg.train.framework!r} is not allowed with this Horovod build; "
                          f"it was built for: {', '.join(built)} (rebuild with scripts/build_horovod.sh)")
    if cfg.sync.op == "adasum" and not mpi_built():
        raise ConfigError("sync.op: 'adasum' is not allowed with this Horovod build (Adasum needs MPI; this build "
                          "has Gloo only); choose one of: average, sum")


@contextlib.contextmanager
def _build_checks_from_binaries() -> Iterator[None]:
    """Answer the launcher's "built with Gloo / MPI?" questions from the binaries while Horovod starts a job.

    Horovod's own checks (``horovod.common.util.gloo_built``/``mpi_built``) fork a process that imports
    ``horovod.tensorflow`` first, so every launch, even of a PyTorch job, paid a TensorFlow import (seconds of CPU)
    and that child printed TensorFlow's absl start-up lines into this terminal (its fd 2 is ours).
    ``benchmarks/knobs.py launch`` measures the difference.
    """
    import horovod.runner.launch as horovod_launch

    answers = {"gloo_built": lambda verbose=False: gloo_built(), "mpi_built": lambda verbose=False: mpi_built()}
    saved = {name: getattr(horovod_launch, name) for name in answers}
    for name, answer in answers.items():
        setattr(horovod_launch, name, answer)
    try:
        yield
    finally:
        for name, original in saved.items():
            setattr(horovod_launch, name, original)


@contextlib.contextmanager
def environ(values: dict[str, str]) -> Iterator[None]:
    """Set environment variables for the workers (Horovod copies ``os.environ`` into each one), then restore."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no worker log)"


def _where(hosts, np: int, ssh_port: int | None, ssh_identity_file: str | None,
           network_interfaces: list[str] | None) -> dict:
    """``horovod.runner.run``'s arguments for where the workers run, checked before anything starts."""
    from hvdsync.launch import hosts as host_lists, reach

    listed = host_lists.parse_hosts(hosts) if isinstance(hosts, str) else list(hosts or [])
    if not listed:
        listed = [host_lists.Host("localhost", np)]
    host_lists.check_duplicates(listed)
    host_lists.check_slots(listed, np)
    problem = host_lists.loopback_problem(listed)
    if problem:
        raise ConfigError(f"hosts: {problem}")
    reach.check_hosts(listed, ssh_port, ssh_identity_file, network_interfaces)
    note = host_lists.same_host_twice(listed, reach.local_addresses())
    if note:
        print(f"hvdsync: warning: {note}", file=sys.stderr)
    where: dict[str, Any] = {"hosts": host_lists.to_horovod(listed)}
    if ssh_port is not None:
        where["ssh_port"] = ssh_port
    if ssh_identity_file is not None:
        where["ssh_identity_file"] = ssh_identity_file
    if network_interfaces:
        where["network_interfaces"] = list(network_interfaces)
    return where


def run(fn: Callable, args: tuple = (), kwargs: dict | None = None, np: int = 2, sync=None,
        env: dict[str, str] | None = None, quiet: bool = True, progress: bool = True,
        log_dir: str | Path | None = None, start_timeout: int = 120, runner_options: dict | None = None,
        timeout: float | None = None, hosts: str | list | None = None, ssh_port: int | None = None,
        ssh_identity_file: str | None = None, network_interfaces: list[str] | None = None) -> list:
    """Run ``fn(*args, **kwargs)`` on ``np`` local Horovod workers (Gloo) and return their results by rank.

    Args:
        fn: a picklable function (module-level, or defined in a notebook: cloudpickle sends it by value).
        np: number of worker processes.
        sync: a :class:`~hvdsync.config.SyncConfig` whose Horovod knobs (fusion threshold, cycle time, cache)
            the workers get as environment variables (a variable already set in this environment wins).
        env: extra environment variables for the workers.
        quiet: keep worker output in ``<log_dir>/workers.log`` instead of this terminal.
        progress: show rank 0's progress (from :class:`hvdsync.core.telemetry.progress.Progress`) as a bar here.
        log_dir: where the workers' log goes (default: a temporary folder, removed after a success, kept on failure).
        runner_options: more arguments for ``horovod.runner.run`` (an elastic job's discovery script, min/max
            workers: :mod:`hvdsync.launch.elastic`); they replace the fixed ``localhost:np`` hosts.
        hosts: the hosts to start the workers on, over ssh where a host is not this machine: ``"a:2,b:2"``
            (Horovod's ``-H``) or a list of :class:`hvdsync.launch.hosts.Host` (from a hostfile or Slurm). Default:
            ``localhost:np``. Checked before anything starts: enough slots for ``np``, no host listed twice, and
            no multi-host job from a machine whose host name resolves to loopback
            (:func:`hvdsync.launch.hosts.loopback_problem`).
        ssh_port, ssh_identity_file: how Horovod's launcher reaches the other hosts.
        network_interfaces: the interfaces the workers talk over (e.g. ``["eth0"]``; default: Horovod finds the
            ones common to every host).
        timeout: seconds after which the workers are stopped and :class:`WorkerError` is raised with their Python
            stacks (default: no limit). Whatever else ends the call early (Ctrl-C, a test framework's time limit)
            stops the workers too, so no hung worker outlives it.

    Example:
        >>> def hello():
        ...     import horovod.torch as hvd; hvd.init(); return hvd.rank()
        >>> run(hello, np=2)  # doctest: +SKIP
        [0, 1]
    """
    import cloudpickle
    import horovod.runner as horovod_runner

    if not isinstance(np, int) or isinstance(np, bool) or np < 1:
        raise ConfigError(f"np: {np!r} is not allowed; expected an integer >= 1")
    if timeout is not None and not (isinstance(timeout, (int, float)) and not isinstance(timeout, bool)
                                    and timeout > 0):
        raise ConfigError(f"timeout: {timeout!r} is not allowed; expected a number of seconds > 0, or None")
    where = runner_options or _where(hosts, np, ssh_port, ssh_identity_file, network_interfaces)
    own_dir = log_dir is None  # a temporary folder of ours: removed after a success, kept (and named) on failure
    log_dir = Path(log_dir or tempfile.mkdtemp(prefix="hvdsync-run-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path, progress_path = log_dir / "workers.log", log_dir / "progress.jsonl"
    # Quiet defaults and the config's knobs only where the user's environment has not set the variable (the rule
    # of hvdsync.core.train.runtime.apply_horovod_env, which a worker's init applies again); then ``env``.
    defaults = {k: v for k, v in QUIET_ENV.items() if k not in os.environ}
    knobs = {d.name: d.applied for d in apply_horovod_env(sync, dict(os.environ)) if d.source == "config"} \
        if sync is not None else {}
    worker_env = {**defaults, **knobs, **(env or {})}
    if progress:
        progress_path.write_text("")
        worker_env[PROGRESS_ENV] = str(progress_path)
    terminal = sys.stderr
    stop = threading.Event()
    follower = threading.Thread(target=follow_progress, args=(progress_path, stop, terminal), daemon=True)
    with contextlib.ExitStack() as stack:
        stack.enter_context(environ(worker_env))
        log = stack.enter_context(open(log_path, "w", buffering=1))
        if quiet:
            # Horovod's launcher threads write worker lines to sys.stdout/sys.stderr: send them to the log.
            stack.enter_context(contextlib.redirect_stdout(log))
            stack.enter_context(contextlib.redirect_stderr(log))
        if progress:
            follower.start()
        workers, expired = Workers(), threading.Event()
        # Horovod's launcher points SIGINT/SIGTERM at its own shutdown event and never points them back: without
        # restoring them, a notebook cell could not be interrupted after the first launch.
        handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)} \
            if threading.current_thread() is threading.main_thread() else {}
        timer = threading.Timer(timeout, lambda: (expired.set(), workers.stop())) if timeout else None
        signals: list[int] = []
        try:
            stack.enter_context(_build_checks_from_binaries())
            # What stopped Horovod's launcher, if a signal; an elastic driver is stopped by raising (signals_seen).
            signals = stack.enter_context(signals_seen(interrupt="host_discovery_script" in where))
            payload = cloudpickle.dumps((fn, args, kwargs or {}))
            if timer is not None:
                timer.daemon = True
                timer.start()
            results = horovod_runner.run(worker.entry, args=(payload,), num_proc=np, use_gloo=True,
                                         start_timeout=start_timeout, **where)
        except Exception as exc:
            log.flush()
            if signals:  # the user stopped the job: Horovod stopped the workers and called that a failure
                workers.stop()
                raise Stopped(signals[0]) from None
            if expired.is_set():
                raise WorkerError(f"Horovod workers did not finish within timeout={timeout} s and were stopped; "
                                  f"their Python stacks and last lines of {log_path}:\n"
                                  f"{_tail(log_path, 120)}") from None
            raise WorkerError(f"Horovod workers failed ({exc}).\nLast lines of {log_path}:\n"
                              f"{_tail(log_path)}") from None
        except BaseException as exc:
            # Interrupted from outside (a time limit, Ctrl-C outside Horovod's handler): the launcher's non-daemon
            # threads would otherwise keep this interpreter alive for as long as the workers run.
            workers.stop()
            log.flush()
            if isinstance(exc, Stopped):  # the user's own stop: one line from the CLI, not the workers' stacks
                raise
            print(f"hvdsync.launch.local: interrupted; workers stopped. Their stacks and last lines of {log_path}:\n"
                  f"{_tail(log_path, 120)}", file=terminal, flush=True)
            raise
        finally:
            if timer is not None:
                timer.cancel()
            for signum, handler in handlers.items():
                signal.signal(signum, handler)
            stop.set()
            if progress:
                follower.join(timeout=5)
    if own_dir:
        shutil.rmtree(log_dir, ignore_errors=True)
    return results


def train(cfg: Config, quiet: bool = True, progress: bool = True, log_dir: str | Path | None = None,
          **where: Any) -> FitResult:
    """Train as ``cfg`` says on ``cfg.train.np`` workers (local, or on the ``hosts`` given: see :func:`run`'s
    ``hosts``, ``ssh_port``, ``ssh_identity_file`` and ``network_interfaces``); returns rank 0's
    :class:`FitResult`.

    Every config error, host-list error and Horovod build mismatch is raised here, before any worker starts.
    """
    preflight(cfg)
    # The hosts are checked before the job's run is made: a bad host list is one line, not a FAILED run.
    placed = _where(where.pop("hosts", None), cfg.train.np, where.pop("ssh_port", None),
                    where.pop("ssh_identity_file", None), where.pop("network_interfaces", None))
    if where:
        raise TypeError(f"train() got unexpected keyword arguments: {', '.join(sorted(where))}")
    with job_run(cfg, "local"):
        results = run(worker.fit, args=(cfg.to_dict(),), np=cfg.train.np, sync=cfg.sync, quiet=quiet,
                      progress=progress, log_dir=log_dir, runner_options=placed)
    return FitResult(**results[0])


@contextlib.contextmanager
def job_run(cfg: Config, launcher: str, continue_run: str | None = None) -> Iterator[JobRun | None]:
    """The job's MLflow run, created here before any worker starts and handed to them in the environment
    (:mod:`hvdsync.core.telemetry.jobrun`); ended with how the block ended (``FINISHED``, ``FAILED``, ``KILLED``),
    unless the block ended it itself with more to say (the elastic launcher's resets)."""
    tags = {"framework": cfg.train.framework, "hvdsync.launcher": launcher}
    if cfg.elastic.enabled:
        tags["elastic"] = "true"
    job = jobrun.begin(cfg.tracking, tags, continue_run)
    try:
        with environ(job.env() if job is not None else {}):
            yield job
    except BaseException as exc:
        if job is not None:
            job.end(jobrun.status_for(exc))
        raise
    if job is not None:
        job.end("FINISHED")


def train_many(cfgs: list[Config], check_every_step: bool = False, quiet: bool = True,
               log_dir: str | Path | None = None, callbacks: Sequence = (), **where: Any) -> list[dict]:
    """Train several configs one after the other in *one* job of workers (one Horovod start-up for all); returns
    rank 0's result of each, as :meth:`FitResult.to_dict` plus ``numel``, ``wire_bytes_per_step_formula`` (what
    the codec's formula says one rank hands to Horovod per step), ``skipped_steps`` (mixed precision) and
    ``step_spread_max`` (with ``callbacks=[StepSpread()]``, :class:`hvdsync.core.telemetry.monitor.StepSpread`: the
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
        preflight(cfg)
    first = cfgs[0]
    for cfg in cfgs[1:]:
        if cfg.train.np != first.train.np or cfg.sync.horovod_env() != first.sync.horovod_env():
            raise ConfigError("train_many: every config must use the same train.np and Horovod knobs "
                              "(sync.fusion_threshold_mb, sync.cycle_time_ms, sync.cache_capacity)")
    if check_every_step:
        from hvdsync.core.telemetry.monitor import StepSpread

        warnings.warn("train_many(check_every_step=True) is deprecated since hvdsync 0.2.0 and goes in 0.3.0: pass "
                      "callbacks=[StepSpread()] (hvdsync.core.telemetry.monitor.StepSpread)", DeprecationWarning,
                      stacklevel=2)
        callbacks = [*callbacks, StepSpread()]
    results = run(worker.fit_many, args=([c.to_dict() for c in cfgs], tuple(callbacks)), np=first.train.np,
                  sync=first.sync, quiet=quiet, progress=False, log_dir=log_dir, **where)
    return results[0]
