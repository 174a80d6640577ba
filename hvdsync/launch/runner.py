"""Horovod's own Python launcher (``horovod.runner.run``) driven for hvdsync: ``np`` workers on this machine (Gloo over
loopback) or on a host list over ssh, or an elastic job's driver, each running a picklable function; the per-rank
results come back.

Shared by the local and the elastic launchers (:mod:`hvdsync.launch.local`, :mod:`hvdsync.launch.elastic`), below both
so that neither imports the other. Quiet by default: worker output (with Horovod's ``[rank]<stdout>:`` prefixes and
framework start-up lines) goes to a log file, and a tqdm bar in this process follows rank 0's progress. When a worker
fails, the error shows the last lines of that log.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any, Callable, Iterator

from hvdsync.config import ConfigError
from hvdsync.core.telemetry.progress import PROGRESS_ENV
from hvdsync.core.train.runtime import apply_horovod_env
from hvdsync.launch import worker
from hvdsync.launch.base import (QUIET_ENV, Stopped, WorkerError, environ, follow_progress, gloo_built, mpi_built,
                                 signals_seen)
from hvdsync.launch.workers import Workers


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


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no worker log)"


def host_placement(hosts, np: int, ssh_port: int | None, ssh_identity_file: str | None,
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
    where = runner_options or host_placement(hosts, np, ssh_port, ssh_identity_file, network_interfaces)
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


