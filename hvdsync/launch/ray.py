"""Horovod jobs on a Ray cluster: Horovod's own Ray integration (``horovod.ray.RayExecutor``) running hvdsync's workers.

    hvdsync train --ray auto --np 4                 # the cluster `ray start` made on this machine (or RAY_ADDRESS)
    hvdsync train --ray 10.0.0.1:6379 --np 8 --framework tensorflow
    hvdsync train --ray auto --elastic --min-np 2 --max-np 8 --checkpoint-dir /shared/ckpt

    from hvdsync.launch import ray as ray_launch
    per_rank = ray_launch.run(my_function, np=4, address="auto")     # as hvdsync.launch.run, on Ray's nodes
    result = ray_launch.train(cfg, address="10.0.0.1:6379")          # as hvdsync.launch.train (elastic too)

Ray places the workers (one actor per rank, ``cpus_per_worker`` CPUs each, in a placement group) instead of ssh and
host lists; Horovod's rendezvous, Gloo and hvdsync's workers are the same as in every other launch. The driver (this
process) must be reachable from every node: run it on a node of the cluster (``ray job submit -- hvdsync train
--ray auto ...`` does that from elsewhere).

Checked before any worker starts, one line each: Ray not installed, an address where no Ray head answers, a cluster
with token authentication and no token here or the wrong one (:mod:`hvdsync.launch.ray_auth`: hvdsync connects with
the token where the cluster wants it, as Ray's own clients do), more workers (or an elastic job's ``min_np``) than the
cluster's CPUs or GPUs hold.

Horovod 0.28.1's integration was written against Ray 1.x-2.3. With today's Ray (2.60) its static and elastic paths
run as they are; two driver-side lines are fixed here at run time, so Horovod's source and build stay as they are
(:func:`_todays_ray`, :func:`run_elastic`): the elastic executor places its log queue with ``ray.state``, which Ray
now keeps only as a deprecated wrapper that warns in the user's terminal and is to be removed; and the elastic driver
tells the workers to reach its rendezvous at ``gethostbyname(gethostname())``, which is loopback where the host name
maps to ``127.0.1.1`` (Debian, Ubuntu): the workers on the other nodes then abort ("HTTP request failed").
"""
from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sys
import tempfile
import threading
import time
import types
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from hvdsync.config import Config, ConfigError
from hvdsync.core.elastic.loop import RUN_DIR_ENV
from hvdsync.core.train.callbacks import Callback
from hvdsync.core.telemetry.progress import PROGRESS_ENV
from hvdsync.core.train.runtime import ELASTIC_UNSAFE_KNOBS
from hvdsync.launch import worker
from hvdsync.launch.ray_cluster import (alive_nodes, check_capacity, connected, node_names, require_ray,
                                      resolve_address)
from hvdsync.launch import base
from hvdsync.launch.base import QUIET_ENV, DriverLog, Launcher, Start, WorkerError, follow_progress, raise_clear
from hvdsync.launch.elastic_job import GLOO_TIMEOUT_S, ElasticLauncher

# Set by Horovod's Ray adapters in each worker (rank, host, rendezvous): never forwarded from this process.
_PER_WORKER = {"HOROVOD_HOSTNAME", "HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE",
               "HOROVOD_CROSS_RANK", "HOROVOD_CROSS_SIZE", "HOROVOD_GLOO_RENDEZVOUS_ADDR",
               "HOROVOD_GLOO_RENDEZVOUS_PORT", "HOROVOD_CONTROLLER", "HOROVOD_CPU_OPERATIONS", "HOROVOD_GLOO_IFACE",
               "HOROVOD_ELASTIC"}


def _entry(payload: bytes, cwd: str, names: dict[str, str] | None):
    """Runs in each Ray actor: the driver's working directory (as horovodrun's `cd <cwd>` on every host: relative
    paths, ./mlruns), this node's short name for Horovod (before anything calls hvd.init), then the worker entry."""
    if os.path.isdir(cwd):
        os.chdir(cwd)
        if cwd not in sys.path:
            sys.path.insert(0, cwd)
    if names:
        import ray

        node = ray.get_runtime_context().get_node_id()
        # A bijective renaming of the node id Horovod's adapter set: the ranks' local/cross grouping is unchanged.
        os.environ["HOROVOD_HOSTNAME"] = names.get(node, node)
    return worker.entry(payload)


@contextlib.contextmanager
def _todays_ray(ray) -> Iterator[None]:
    """Horovod 0.28.1's Ray integration on today's Ray, while a job runs (undone after).

    ``horovod/ray/elastic_v2.py`` (``ElasticAdapter._run_remote``) places its log queue actor on this node with
    ``ray.state.current_node_id()``. Ray 2.x moved that module to ``ray._private.state`` and keeps ``ray.state`` as
    a wrapper that logs "DeprecationWarning: `ray.state.current_node_id` is a private attribute and access will be
    removed" into the user's terminal at every elastic start. The resource it names, ``node:<this node's IP>``, is
    one Ray gives every node, so the same answer comes from public API, without the warning, and keeps working once
    the wrapper is gone.
    """
    saved = ray.__dict__.get("state")
    ray.state = types.SimpleNamespace(current_node_id=lambda: f"node:{ray.util.get_node_ip_address()}")
    try:
        yield
    finally:
        if saved is None:
            del ray.state
        else:
            ray.state = saved


def _worker_env(sync, env: dict[str, str] | None, elastic: bool = False) -> dict[str, str]:
    """What every worker gets: Ray's actors start with the raylet's environment, not this process's, so the
    variables a horovodrun worker would inherit from here are passed on (Horovod's knobs, hvdsync's, MLflow's)."""
    passed = {k: v for k, v in os.environ.items()
              if k.startswith(("HOROVOD_", "HVDSYNC_", "MLFLOW_")) and k not in _PER_WORKER}
    knobs = sync.horovod_env() if sync is not None else {}
    if elastic:  # see hvdsync.launch.elastic.run_elastic: Horovod 0.28.1 crashes re-initialising with both set
        knobs = {k: v for k, v in knobs.items() if k not in ELASTIC_UNSAFE_KNOBS}
    return {**QUIET_ENV, **{k: v for k, v in knobs.items() if k not in passed}, **passed, **(env or {})}


@contextlib.contextmanager
def _progress(progress: bool, env: dict[str, str], log_dir: Path) -> Iterator[None]:
    """Rank 0's progress as a bar here (:func:`hvdsync.launch.local.run`'s file protocol; where rank 0's node does
    not see ``log_dir``, it prints plain lines into its own log instead)."""
    if not progress:
        yield
        return
    path = log_dir / "progress.jsonl"
    path.write_text("")
    env[PROGRESS_ENV] = str(path)
    stop = threading.Event()
    follower = threading.Thread(target=follow_progress, args=(path, stop, sys.stderr), daemon=True)
    follower.start()
    try:
        yield
    finally:
        stop.set()
        follower.join(timeout=5)


def _gather(ray, refs: list, timeout: float | None) -> list:
    """The ranks' results in rank order; the first rank that fails (or the deadline) stops the wait at once,
    where ``ray.get(refs)`` would wait on rank 0 while the others hang in a collective with the dead one."""
    deadline = None if timeout is None else time.monotonic() + timeout
    pending = list(refs)
    while pending:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        ready, pending = ray.wait(pending, num_returns=1, timeout=left)
        if not ready:
            raise WorkerError(f"Ray workers did not finish within timeout={timeout} s and were stopped")
        try:
            ray.get(ready[0])
        except ray.exceptions.RayError as exc:
            raise WorkerError(f"Ray worker of rank {refs.index(ready[0])} failed; the job was stopped:\n{exc}") from None
    return ray.get(refs)


def run(fn: Callable, args: tuple = (), kwargs: dict | None = None, np: int = 2, address: str | None = "auto",
        cpus_per_worker: float = 1, gpus_per_worker: float = 0, sync=None, env: dict[str, str] | None = None,
        quiet: bool = True, progress: bool = True, log_dir: str | Path | None = None, start_timeout: int = 120,
        timeout: float | None = None, network_interfaces: list[str] | None = None) -> list:
    """Run ``fn(*args, **kwargs)`` on ``np`` Horovod workers placed by Ray; returns their results by rank.

    Args:
        fn: a picklable function (module-level, or defined in a notebook: cloudpickle sends it by value).
        address: the Ray head's ``HOST:PORT``, or ``auto`` (``RAY_ADDRESS``, else the cluster ``ray start`` joined
            on this machine). Ignored where this process is already connected (``ray.init`` done by the caller).
        cpus_per_worker, gpus_per_worker: Ray resources reserved for each worker (a placement group, packed).
        network_interfaces: the interfaces Gloo uses (default: Horovod probes the ones common to all nodes).
        start_timeout: seconds to wait for the placement group (resources held by other jobs) and Horovod's probe.
        sync, env, quiet, progress, log_dir, timeout: as :func:`hvdsync.launch.run`.

    Example:
        >>> run(lambda: __import__("horovod.torch").torch.init() or 0, np=4, address="auto")  # doctest: +SKIP
    """
    ray = require_ray()
    if not isinstance(np, int) or isinstance(np, bool) or np < 1:
        raise ConfigError(f"np: {np!r} is not allowed; expected an integer >= 1")
    if timeout is not None and not (isinstance(timeout, (int, float)) and timeout > 0):
        raise ConfigError(f"timeout: {timeout!r} is not allowed; expected a number of seconds > 0, or None")
    address = resolve_address(address)
    import cloudpickle
    from horovod.ray import RayExecutor

    own_dir = log_dir is None
    log_dir = Path(log_dir or tempfile.mkdtemp(prefix="hvdsync-ray-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    worker_env = _worker_env(sync, env)
    with contextlib.ExitStack() as stack:
        if own_dir:  # nothing of the workers' is kept here (their output is in Ray's logs): removed in any case
            stack.callback(shutil.rmtree, log_dir, ignore_errors=True)
        stack.enter_context(connected(ray, address, quiet))
        stack.enter_context(_progress(progress, worker_env, log_dir))
        check_capacity(ray, address, np, cpus_per_worker, gpus_per_worker)
        names = node_names(ray)
        settings = RayExecutor.create_settings(timeout_s=start_timeout, placement_group_timeout_s=start_timeout,
                                               nics=set(network_interfaces) if network_interfaces else None)
        executor = RayExecutor(settings, num_workers=np, cpus_per_worker=cpus_per_worker,
                               use_gpu=bool(gpus_per_worker), gpus_per_worker=gpus_per_worker or None)
        try:
            with _todays_ray(ray):
                try:
                    executor.start(extra_env_vars=worker_env)
                except TimeoutError:  # the placement group: the CPUs exist (checked) but other jobs hold them
                    busy = f"{np} x {cpus_per_worker:g} CPUs were not free within start_timeout={start_timeout} s"
                    raise WorkerError(f"np: {busy} on the Ray cluster at {address} (`ray status` shows who holds "
                                      "them)") from None
                payload = cloudpickle.dumps((fn, args, kwargs or {}))
                results = _gather(ray, executor.run_remote(_entry, args=[payload, os.getcwd(), names]), timeout)
        finally:
            with contextlib.suppress(Exception):
                executor.shutdown()  # removes the placement group, which ends its actors
    return results


def run_elastic(fn: Callable, args: tuple, elastic, run_dir: str | Path, address: str | None = "auto",
                cpus_per_worker: float = 1, gpus_per_worker: float = 0, sync=None, env: dict[str, str] | None = None,
                quiet: bool = True, progress: bool = True, start_timeout: int = 120,
                network_interfaces: list[str] | None = None) -> list:
    """Run ``fn(*args)`` as an elastic job on Ray (Horovod's ``RayExecutor(min_workers=...)``); returns the results.

    Horovod's Ray discovery is the cluster itself: each live node offers ``CPUs // cpus_per_worker`` slots; a node
    that dies (its raylet gone) takes its workers with it and the job goes on from the last commit on the others; a
    node that joins is used at the next commit, up to ``elastic.max_np``. A lost node's address is excluded from the
    job; it comes back only after ``elastic.cooldown_min_s`` (0: never). ``run_dir`` must be on a file system every
    node sees (pids, errors, progress), as ``elastic.checkpoint_dir``. Other arguments: :func:`run` and
    :func:`hvdsync.launch.elastic.run_elastic`.
    """
    ray = require_ray()
    address = resolve_address(address)
    import cloudpickle
    from horovod.ray import RayExecutor

    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    gloo_timeout = os.environ.get("HOROVOD_GLOO_TIMEOUT_SECONDS", str(max(elastic.timeout_s, GLOO_TIMEOUT_S)))
    worker_env = _worker_env(sync, {RUN_DIR_ENV: str(run_dir), "HOROVOD_GLOO_TIMEOUT_SECONDS": gloo_timeout,
                                    **(env or {})}, elastic=True)
    handler = DriverLog()  # Horovod's elastic driver logs to the root logger in this process
    with connected(ray, address, quiet), _progress(progress, worker_env, run_dir):
        check_capacity(ray, address, elastic.min_np, cpus_per_worker, gpus_per_worker, field="elastic.min_np")
        if not network_interfaces and len(alive_nodes(ray)) < 2:
            # Horovod finds the common interfaces only between two or more hosts; with one it waits for a second.
            raise ConfigError("--network-interface: needed for an elastic Ray job on a one-node cluster; name the "
                              "interface the workers talk over (lo where every node is this machine), e.g. "
                              "--network-interface eth0")
        settings = RayExecutor.create_settings(timeout_s=start_timeout,
                                               nics=set(network_interfaces) if network_interfaces else None)
        cooldown = (elastic.cooldown_min_s, elastic.cooldown_max_s) if elastic.cooldown_min_s else None
        executor = RayExecutor(settings, min_workers=elastic.min_np, max_workers=elastic.max_np,
                               cpus_per_worker=cpus_per_worker, use_gpu=bool(gpus_per_worker),
                               gpus_per_worker=gpus_per_worker or None, cooldown_range=cooldown,
                               elastic_timeout=elastic.timeout_s)
        payload = cloudpickle.dumps((fn, args, {}))
        logging.getLogger().addHandler(handler)
        try:
            with _todays_ray(ray):
                executor.start(extra_env_vars=worker_env)
                # elastic_v2.ElasticAdapter.start: server_ip = gethostbyname(gethostname()), loopback where the host
                # name maps to 127.0.1.1; the address Ray knows this node by is the one every node can reach.
                executor.adapter.run_env_vars["HOROVOD_GLOO_RENDEZVOUS_ADDR"] = ray.util.get_node_ip_address()
                results = executor.run(_entry, args=[payload, os.getcwd(), None])
        except RuntimeError as exc:  # the elastic driver's own end: too few workers for too long, a reset limit
            raise_clear(run_dir, handler.messages, elastic, exc)
            raise WorkerError(f"elastic Ray job ended: {exc}") from None
        finally:
            logging.getLogger().removeHandler(handler)
            driver = getattr(getattr(executor, "adapter", None), "driver", None)
            if driver is not None and not driver.finished():
                driver.stop()
    raise_clear(run_dir, handler.messages, elastic, None)
    return results


def train(cfg: Config, address: str | None = "auto", quiet: bool = True, progress: bool = True,
          log_dir: str | Path | None = None, cpus_per_worker: float = 1, gpus_per_worker: float = 0,
          network_interfaces: list[str] | None = None, record_reads: bool = False,
          env: dict[str, str] | None = None, callbacks: Sequence[Callback] = (), **where: Any):
    """Train as ``cfg`` says on a Ray cluster: :class:`FitResult` of rank 0, or with ``elastic.enabled``
    an :class:`~hvdsync.core.elastic.loop.ElasticResult` (``elastic.min_np`` to ``elastic.max_np`` workers,
    ``train.np`` unused: the job takes the slots the cluster has). Every error of the config, the address and the
    cluster's size is raised before any worker starts.

    ``env``: more environment variables for the workers. Ray's actors start with the raylet's environment, not this
    process's: only Horovod's, hvdsync's and MLflow's variables are passed on by themselves, so a plugin named in
    ``train.plugins`` that reads a variable of its own gets it here.

    ``callbacks``: for an elastic job, :class:`~hvdsync.core.train.callbacks.Callback` instances for every worker's
    loop, as :func:`hvdsync.launch.elastic.train` takes them (each worker its own pickled copy;
    ``callbacks=[SampleLedger()]`` fills the result's ``reads`` and ``timeline``; ``record_reads=True`` is its
    deprecated spelling, until 0.3.0). A job that is not elastic runs the callbacks named in ``train.callbacks``."""
    if where:
        raise ConfigError(f"{'/'.join('--' + k.replace('_', '-') for k in where)}: not used with --ray; Ray places "
                          "the workers on its nodes")
    launcher = (RayElastic if cfg.elastic.enabled else RayLauncher)(
        address=address, cpus_per_worker=cpus_per_worker, gpus_per_worker=gpus_per_worker,
        network_interfaces=network_interfaces, env=env)
    launcher.check_callbacks(cfg, callbacks)  # before record_reads' warning: a refused call warns about nothing
    _, shipped = worker.fit_elastic_args(cfg, callbacks, record_reads, "hvdsync.launch.ray.train")
    return launcher.train(cfg, quiet=quiet, progress=progress, log_dir=log_dir,
                          callbacks=shipped if cfg.elastic.enabled else ())


class _OnRay:
    """Where both Ray launchers place the workers: Ray checked and the address resolved before anything else (one
    line where Ray is missing), then one connection, made before the job's MLflow run, held for the job: an address
    where no head answers, a cluster that refuses this process's token and a cluster too small for the job are each
    one line, not a FAILED run; :func:`run` and :func:`run_elastic` go on with that connection."""

    def __init__(self, address: str | None = "auto", cpus_per_worker: float = 1, gpus_per_worker: float = 0,
                 network_interfaces: list[str] | None = None, env: dict[str, str] | None = None) -> None:
        super().__init__(address=address, cpus_per_worker=cpus_per_worker, gpus_per_worker=gpus_per_worker,
                         network_interfaces=network_interfaces, env=env)

    def preflight(self, cfg: Config) -> None:
        base.preflight(cfg)
        self.ray = require_ray()
        self.where["address"] = resolve_address(self.where["address"])

    def connection(self, cfg: Config, how: Start):
        return connected(self.ray, self.where["address"], how.quiet)

    def _where(self) -> dict:
        return {k: self.where[k] for k in ("address", "cpus_per_worker", "gpus_per_worker", "network_interfaces")}


class RayLauncher(_OnRay, Launcher):
    """A fixed job of ``cfg.train.np`` workers on a Ray cluster (Horovod's ``RayExecutor``)."""

    name = "ray"

    def placement(self, cfg: Config) -> None:
        w = self.where
        check_capacity(self.ray, w["address"], cfg.train.np, w["cpus_per_worker"], w["gpus_per_worker"])

    def start(self, cfg: Config, placed: None, how: Start) -> list:
        # The job's MLflow run id reaches the workers with the other HVDSYNC_ variables (_worker_env).
        return run(worker.fit, args=(cfg.to_dict(),), np=cfg.train.np, sync=cfg.sync, quiet=how.quiet,
                   progress=how.progress, log_dir=how.log_dir, env=self.where["env"], **self._where())


class RayElastic(_OnRay, ElasticLauncher):
    """An elastic job on a Ray cluster (Horovod's elastic ``RayExecutor``): ``elastic.min_np`` to ``elastic.max_np``
    workers, ``train.np`` unused. Its temporary run folder goes in any case (the workers' output is in Ray's logs)."""

    name = "ray"
    run_dir_prefix = "hvdsync-ray-elastic-"
    keep_failed_run_dir = False

    def placement(self, cfg: Config) -> None:
        w = self.where
        check_capacity(self.ray, w["address"], cfg.elastic.min_np, w["cpus_per_worker"], w["gpus_per_worker"],
                       field="elastic.min_np")

    def start(self, cfg: Config, placed: None, how: Start) -> list:
        return run_elastic(worker.fit_elastic, (cfg.to_dict(), how.callbacks), cfg.elastic, how.run_dir,
                           sync=cfg.sync, quiet=how.quiet, progress=how.progress,
                           env={**(self.where["env"] or {}), **how.env}, **self._where())

    def rank0(self, results: list) -> dict:
        # Results come back by the rank each worker started with; after resets rank 0 is the one that says so.
        return next(r for r in results if r.get("rank") == 0)

    def world_at_start(self, cfg: Config, rank0: dict | None) -> int:
        if rank0 is None:
            return cfg.elastic.min_np
        # The world it started with: the first reset's size before it (else the size it ended with).
        return rank0["resets"][0]["size_before"] if rank0.get("resets") else rank0["world_size"]
