"""Elastic Horovod jobs on this machine: a host-discovery script over loopback names, fault injection, clear errors.

Horovod's elastic driver (``horovod.runner.run(..., host_discovery_script=...)``) asks a script every second which
hosts exist; workers come and go with the hosts it prints. On one machine hvdsync writes that script into the run
folder: ``discover_hosts.sh`` prints the file ``hosts`` next to it, one ``name:slots`` per line, and a test or a
person edits ``hosts`` to add or remove a "host" (:func:`set_hosts`). The names are different names of this machine
(``localhost``, ``127.0.0.1``, its host name, its other IPv4 addresses): Horovod starts a worker without ssh when a
name resolves to a local address, and it keys hosts by *name*, so each name is one more host. Each gets one slot,
because Horovod excludes (blacklists) a whole host when one of its workers fails; with ``elastic.cooldown_min_s``
the host may come back after a cooldown, and the job grows again. Traffic stays on the loopback interface
(``network_interfaces=["lo"]``), which also lifts Horovod's rule that an elastic job needs two hosts at the start.

How a job ends, and what hvdsync makes of it:

* a worker raises a Python exception (not a collective failure): the worker writes its traceback to
  ``errors/`` and exits 0, which is how Horovod's driver ends an elastic job (any worker exiting 0 ends it; a
  non-zero exit would only blacklist its host and go on without it). The launcher raises :class:`WorkerError` with
  that traceback;
* fewer than ``elastic.min_np`` workers for ``elastic.timeout_s`` seconds: the driver gives up waiting; the
  launcher says so in one line instead of Horovod's "exited with non-zero status".

Fault injection for tests and notebook 10 (``faults=``, or the ``HVDSYNC_FAULTS`` environment variable), comma
separated: ``kill@7:127.0.0.1`` makes the worker on host ``127.0.0.1`` send itself SIGKILL before step 8;
``raise@5:localhost`` raises a ``RuntimeError`` there (each fires once per run folder); ``slow@30`` makes every
worker sleep 30 ms per step (a job slow enough to watch and to change while it runs).
"""
from __future__ import annotations

import contextlib
import logging
import os
import shutil
import socket
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path

from hvdsync.config import Config, ConfigError
from hvdsync.core.elastic.loop import FAULTS_ENV, RUN_DIR_ENV
from hvdsync.core.train.runtime import ELASTIC_UNSAFE_KNOBS
from hvdsync.launch import worker
from hvdsync.launch.local import WorkerError, environ, preflight, run

DISCOVERY = "discover_hosts.sh"
GLOO_TIMEOUT_S = 180  # see run_elastic


def local_hosts() -> list[str]:
    """Names of this machine that Horovod starts workers on without ssh, each counted as one host."""
    import psutil

    local = {a.address for addrs in psutil.net_if_addrs().values() for a in addrs if a.family == socket.AF_INET}
    names = ["localhost", "127.0.0.1", socket.gethostname(), *sorted(local - {"127.0.0.1"})]
    found = []
    for name in names:
        with contextlib.suppress(OSError):
            if name not in found and socket.gethostbyname(name) in local:
                found.append(name)
    return found


def set_hosts(run_dir: str | Path, hosts: list[str]) -> None:
    """Replace the hosts the discovery script reports (atomically: the driver never reads half a file)."""
    path = Path(run_dir) / "hosts"
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(f"{h}:1\n" for h in hosts))
    os.replace(tmp, path)


def write_discovery(run_dir: str | Path, hosts: list[str]) -> Path:
    """Write ``discover_hosts.sh`` (prints ``hosts``) and the first host list; returns the script's path."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    set_hosts(run_dir, hosts)
    script = run_dir / DISCOVERY
    script.write_text('#!/bin/sh\n# Horovod runs this every second; edit the file "hosts" to add or remove hosts.\n'
                      'cat "$(dirname "$0")/hosts"\n')
    script.chmod(0o755)
    return script


def worker_pids(run_dir: str | Path) -> dict[str, int]:
    """``{host: pid}`` of the workers started in ``run_dir`` (each writes its pid when it starts)."""
    return {p.stem: int(p.read_text()) for p in (Path(run_dir) / "pids").glob("*.pid") if p.read_text().strip()}


class _DriverLog(logging.Handler):
    """Keeps the elastic driver's messages (it logs to the root logger in this process)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if record.exc_info:
            text += " " + "".join(traceback.format_exception_only(record.exc_info[1]))
        self.messages.append(text)


def run_elastic(fn: Callable, args: tuple, elastic, np: int, run_dir: str | Path, hosts: list[str] | None = None,
                sync=None, env: dict[str, str] | None = None, faults: str = "", quiet: bool = True,
                progress: bool = True) -> list:
    """Run ``fn(*args)`` as an elastic job on local "hosts" (see the module docstring); returns the results.

    Args:
        elastic: the :class:`~hvdsync.config.ElasticConfig` (min/max workers, timeout, cooldown).
        np: workers at the start.
        run_dir: the run folder (discovery script, ``hosts``, worker log, pids, errors).
        hosts: the first hosts (default: the first ``np`` of :func:`local_hosts`).
        faults: fault injection, e.g. ``"kill@7:127.0.0.1"``.
    """
    import horovod.runner as horovod_runner  # noqa: F401 - fails early and clearly when Horovod is missing

    run_dir = Path(run_dir)
    names = local_hosts()
    if elastic.max_np > len(names):
        raise ConfigError(f"elastic.max_np: {elastic.max_np} is not allowed on this machine; it has "
                          f"{len(names)} local host names ({', '.join(names)})")
    script = write_discovery(run_dir, hosts if hosts is not None else names[:np])
    options = {"min_num_proc": elastic.min_np, "max_num_proc": elastic.max_np, "host_discovery_script": str(script),
               "network_interfaces": ["lo"]}
    if elastic.cooldown_min_s:
        options["cooldown_range"] = (elastic.cooldown_min_s, elastic.cooldown_max_s)
    # Horovod 0.28.1 corrupts its heap when it re-initialises (every elastic reset) after HOROVOD_FUSION_THRESHOLD
    # and HOROVOD_CYCLE_TIME were both given: fixing a knob removes it from the autotuner's vector
    # (parameter_manager.cc, BayesianParameter::SetValue), and the next init writes the defaults back by their old
    # indices into the shorter vector; with both fixed the survivor segfaults in hvd.init(). Fixing only one writes
    # out of bounds too. So an elastic job keeps Horovod's own fusion (128 MiB) and cycle time (1 ms), which
    # measure alike to hvdsync's (docs/measurements/allreduce.md), and passes the cache capacity only.
    knobs = {k: v for k, v in (sync.horovod_env() if sync is not None else {}).items() if k not in ELASTIC_UNSAFE_KNOBS}
    worker_env = {**knobs, RUN_DIR_ENV: str(run_dir), FAULTS_ENV: faults or os.environ.get(FAULTS_ENV, ""),
                  **(env or {})}
    handler = _DriverLog()
    logging.getLogger().addHandler(handler)
    try:
        # The driver reads its timeout from the environment of this process. Gloo's own timeout bounds how long the
        # ranks of a new ring wait for each other in hvd.init(): a joining worker must start (import TensorFlow,
        # seconds on a busy machine) within it, or the waiting survivor aborts in C++ (gloo::IoException, not a
        # Python error). Horovod's 30 s default is too short there.
        gloo_timeout = os.environ.get("HOROVOD_GLOO_TIMEOUT_SECONDS", str(max(elastic.timeout_s, GLOO_TIMEOUT_S)))
        with environ({"HOROVOD_ELASTIC_TIMEOUT": str(elastic.timeout_s), "HOROVOD_GLOO_TIMEOUT_SECONDS": gloo_timeout}):
            results = run(fn, args=args, np=np, env=worker_env, quiet=quiet, progress=progress,
                          log_dir=run_dir, runner_options=options)
    except WorkerError as exc:
        _raise_clear(run_dir, handler.messages, elastic, exc)
        raise
    finally:
        logging.getLogger().removeHandler(handler)
        if quiet:
            _echo_reports(run_dir / "workers.log")
    _raise_clear(run_dir, handler.messages, elastic, None)
    return results


def _echo_reports(log: Path) -> None:
    """Show the workers' one-line reports (resets, skipped checkpoints, a fresh start) in this terminal: in quiet
    mode the rest of their output stays in the log."""
    import sys

    seen = set()
    with contextlib.suppress(OSError):
        for line in log.read_text(errors="replace").splitlines():
            _, sep, text = line.partition(">:hvdsync: ")
            if sep and text not in seen:
                seen.add(text)
                print(f"hvdsync: {text}", file=sys.stderr, flush=True)


def _raise_clear(run_dir: Path, driver_log: list[str], elastic, exc: Exception | None) -> None:
    errors = sorted((run_dir / "errors").glob("*.txt"))
    if errors:
        first = errors[0]
        raise WorkerError(f"worker on {first.stem.rsplit('-', 1)[0]} failed; the job was stopped. Its traceback:\n"
                          f"{first.read_text()}") from None
    if exc is not None and any("Timed out waiting for" in m or "minimum number of slots" in m for m in driver_log):
        raise WorkerError(f"elastic job ended: fewer than elastic.min_np={elastic.min_np} workers were available for "
                          f"elastic.timeout_s={elastic.timeout_s}s after a reset (log: {run_dir})") from None


def train(cfg: Config, quiet: bool = True, progress: bool = True, log_dir: str | Path | None = None,
          faults: str = "", record_reads: bool = False, hosts: list[str] | None = None):
    """Train elastically as ``cfg`` says (``cfg.elastic``); returns rank 0's :class:`ElasticResult`.

    Example:
        >>> cfg = Config.from_dict({"elastic": {"enabled": True, "checkpoint_dir": "ckpt"}})   # doctest: +SKIP
        >>> print(train(cfg).summary())                                                        # doctest: +SKIP
    """
    from hvdsync.core.elastic.loop import ElasticResult

    preflight(cfg)
    own = log_dir is None
    run_dir = Path(log_dir or tempfile.mkdtemp(prefix="hvdsync-elastic-"))
    results = run_elastic(worker.fit_elastic, (cfg.to_dict(), record_reads), cfg.elastic, cfg.train.np, run_dir,
                          hosts=hosts, sync=cfg.sync, faults=faults, quiet=quiet, progress=progress)
    if own:
        shutil.rmtree(run_dir, ignore_errors=True)
    return ElasticResult(**results[0])
