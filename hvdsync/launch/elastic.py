"""Elastic Horovod jobs, on this machine or across hosts: a host-discovery script, fault injection, clear errors.

Horovod's elastic driver (``horovod.runner.run(..., host_discovery_script=...)``) asks a script every second which
hosts exist; workers come and go with the hosts it prints. On one machine hvdsync writes that script into the run
folder: ``discover_hosts.sh`` prints the file ``hosts`` next to it, one ``name:slots`` per line, and a test or a
person edits ``hosts`` to add or remove a "host" (:func:`set_hosts`). The names are different names of this machine
(``localhost``, ``127.0.0.1``, its host name, its other IPv4 addresses): Horovod starts a worker without ssh when a
name resolves to a local address, and it keys hosts by *name*, so each name is one more host. Each gets one slot,
because Horovod excludes (blacklists) a whole host when one of its workers fails; with ``elastic.cooldown_min_s``
the host may come back after a cooldown, and the job grows again. Traffic stays on the loopback interface
(``network_interfaces=["lo"]``), which also lifts Horovod's rule that an elastic job needs two hosts at the start.

Across hosts (``hosts="node1:2,node2:2"``, a list of :class:`~hvdsync.launch.hosts.Host`, or names of other
machines) the same script prints the given hosts with their slots, Horovod starts the workers over ssh
(``ssh_port``, ``ssh_identity_file``) and they talk over ``network_interfaces``; ``hosts`` stays editable, as a
cluster manager would change it (a lost node taken out, a repaired one put back). A lost host is blacklisted by
Horovod when its workers die; it is taken back after ``elastic.cooldown_min_s`` (never, with the default 0). The
run folder and ``elastic.checkpoint_dir`` must be on a file system every host sees: the workers write their pids,
errors and rank 0's progress there, and rank 0, which may move to another host after a reset, writes the
checkpoints. The driver (this process) must be reachable from every host, so launch it on one of them.

How a job ends, and what hvdsync makes of it:

* a worker raises a Python exception (not a collective failure): the worker writes its traceback to
  ``errors/`` and exits 0, which is how Horovod's driver ends an elastic job (any worker exiting 0 ends it; a
  non-zero exit would only blacklist its host and go on without it). The launcher raises :class:`WorkerError` with
  that traceback;
* fewer than ``elastic.min_np`` workers for ``elastic.timeout_s`` seconds: the driver gives up waiting; the
  launcher says so in one line instead of Horovod's "exited with non-zero status".

What runs in the workers beside the training is the user's: callbacks named in ``train.callbacks``
(:func:`hvdsync.registry.register_callback`) or handed to :func:`train` (``callbacks=[SampleLedger()]``, each worker
its own copy) live on across resets. The tests and notebook 10 inject their faults and count their reads that way
(``hvdlab.faults``, :class:`~hvdsync.torch.SampleLedger`); nothing here reads a test's variable or
takes a test's switch.
"""
from __future__ import annotations

import contextlib
import logging
import os
import socket
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from hvdsync.config import Config, ConfigError
from hvdsync.core.elastic.loop import RUN_DIR_ENV
from hvdsync.core.train.callbacks import Callback
from hvdsync.core.train.runtime import ELASTIC_UNSAFE_KNOBS
from hvdsync.launch import hosts as host_lists
from hvdsync.launch import reach, worker
from hvdsync.launch.base import DriverLog, Start, WorkerError, environ, lost_hosts, raise_clear
from hvdsync.launch.elastic_job import GLOO_TIMEOUT_S, ElasticLauncher
from hvdsync.launch.hosts import Host
from hvdsync.launch.moved import moved
from hvdsync.launch.runner import run

DISCOVERY = "discover_hosts.sh"
# The elastic bookkeeping every elastic launcher shares moved below the launchers (issue 50's launcher template).
__getattr__ = moved(__name__, {name: "hvdsync.launch.elastic_job"
                               for name in ("checkpoint_job", "job_env", "resumed_run", "reset_tags")})
# Added to the ssh command Horovod starts remote workers with (see _ssh_options): a host that vanishes without a word
# (power, cable, kernel panic: no FIN ever reaches the driver) leaves its workers' ssh clients waiting until TCP
# keepalive (two hours by default), and the driver re-forms the ring only once every slot of the old one has reported
# (its registry barrier counts the lost host's slots too). With a keepalive ssh gives up after 5 s x 3 unanswered
# probes, exits 255, and the host is blacklisted like one whose workers died. ConnectTimeout: a host put back in
# ``hosts`` while still down fails in seconds, not after the kernel's connect retries (71.5 s measured to a test host
# whose link was down, against 3.1 s with it; about two minutes where SYNs are dropped).
SSH_OPTIONS = "-o ServerAliveInterval=5 -o ServerAliveCountMax=3 -o ConnectTimeout=10"


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


def host_list(hosts, source: str = "hosts") -> list[Host]:
    """``hosts`` as :class:`Host` objects: ``"a:2,b:2"``, or a list of names (1 slot each), ``name:slots`` strings
    and :class:`Host` objects. Syntax errors and a host listed twice are one :class:`ConfigError` line."""
    items = [hosts] if isinstance(hosts, str) else list(hosts)
    listed: list[Host] = []
    for item in items:
        listed += [item] if isinstance(item, Host) else host_lists.parse_hosts(str(item), source)
    return host_lists.check_duplicates(listed, source)


def set_hosts(run_dir: str | Path, hosts) -> None:
    """Replace the hosts the discovery script reports (atomically: the driver never reads half a file). ``hosts``:
    names (one slot each: the one-machine case), ``name:slots`` strings or :class:`Host` objects
    (see :func:`host_list`)."""
    path = Path(run_dir) / "hosts"
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(f"{h}\n" for h in host_list(hosts)))
    os.replace(tmp, path)


def write_discovery(run_dir: str | Path, hosts) -> Path:
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


def placement(elastic, np: int, hosts=None, ssh_port: int | None = None, ssh_identity_file: str | None = None,
              network_interfaces: list[str] | None = None) -> tuple[list[Host], dict]:
    """The first hosts and ``horovod.runner.run``'s placement arguments, checked before anything starts.

    On one machine (no ``hosts``, or only names of this machine with one slot each, and no interfaces): the names
    of :func:`local_hosts`, Gloo over ``lo``, ``elastic.max_np`` at most the number of those names (each is one
    host a test or a person can add). Across hosts: the given hosts with their slots; ``elastic.min_np``,
    ``train.np`` and ``elastic.max_np`` must fit their slots, and the checks of a multi-host job apply
    (:mod:`hvdsync.launch.hosts`, and one ssh per remote host: :mod:`hvdsync.launch.reach`). Each problem is one
    :class:`ConfigError` line.
    """
    names = local_hosts()
    listed = None if hosts is None else host_list(hosts)
    ssh = {k: v for k, v in (("ssh_port", ssh_port), ("ssh_identity_file", ssh_identity_file)) if v is not None}
    if listed is None and (ssh or network_interfaces):
        raise ConfigError("--network-interface/--ssh-port/--ssh-identity-file: only with --hosts or --hostfile in an "
                          "elastic job; without them its workers run on this machine and talk over lo")
    one_machine = listed is None or (not network_interfaces and all(h.name in names and h.slots == 1 for h in listed))
    if one_machine and elastic.max_np > len(names):
        raise ConfigError(f"elastic.max_np: {elastic.max_np} is not allowed on this machine; it has "
                          f"{len(names)} local host names ({', '.join(names)})")
    first = listed if listed is not None else [Host(name) for name in names[:np]]
    slots, shown = sum(h.slots for h in first), host_lists.to_horovod(first)
    # Fewer slots than min_np or np: Horovod's driver would wait for them for elastic.timeout_s, then fail.
    if elastic.min_np > slots:
        raise ConfigError(f"elastic.min_np: {elastic.min_np} workers needed but the hosts have {slots} slots "
                          f"({shown}); lower elastic.min_np (--min-np) or give the hosts more slots")
    host_lists.check_slots(first, np)
    if one_machine:
        return first, {**ssh, "network_interfaces": ["lo"]}
    if elastic.max_np > slots:
        raise ConfigError(f"elastic.max_np: {elastic.max_np} is not allowed with these hosts; they have {slots} "
                          f"slots ({shown}); lower elastic.max_np (--max-np) to {slots} or give the hosts more slots")
    if not network_interfaces:
        if all(h.name in names for h in first):
            network_interfaces = ["lo"]  # one machine after all (e.g. localhost:2): lo, as above
        elif len(first) < 2:
            # Horovod finds the interfaces common to all hosts only between two or more of them; with one it waits
            # for a second until elastic.timeout_s and fails with "Timed out waiting for ... two hosts".
            raise ConfigError(f"--network-interface: needed for an elastic job that starts on one host ({shown}); "
                              "name the interface its workers talk over, e.g. --network-interface eth0")
    problem = host_lists.loopback_problem(first, local_names=names)
    if problem:
        raise ConfigError(f"hosts: {problem}")
    # One short ssh per remote host, as a fixed-host job does: an unreachable host, a refused key or a missing
    # interface is one line now, not Horovod's elastic timeout later. Hosts added to ``hosts`` later are not checked
    # here: a bad one only fails its own workers, and Horovod blacklists it.
    reach.check_hosts(first, ssh_port, ssh_identity_file, network_interfaces)
    options: dict = dict(ssh)
    if network_interfaces:
        options["network_interfaces"] = list(network_interfaces)
    return first, options


@contextlib.contextmanager
def _ssh_options() -> Iterator[None]:
    """Add :data:`SSH_OPTIONS` to the ssh command Horovod starts remote workers with, while a job runs (Horovod
    0.28.1 builds it from a module constant and takes no ssh options)."""
    from horovod.runner.util import remote

    saved = remote.SSH_COMMAND_PREFIX
    remote.SSH_COMMAND_PREFIX = f"{saved} {SSH_OPTIONS}"
    try:
        yield
    finally:
        remote.SSH_COMMAND_PREFIX = saved


def run_elastic(fn: Callable, args: tuple, elastic, np: int, run_dir: str | Path, hosts=None,
                sync=None, env: dict[str, str] | None = None, quiet: bool = True,
                progress: bool = True, ssh_port: int | None = None, ssh_identity_file: str | None = None,
                network_interfaces: list[str] | None = None, lost: list[dict] | None = None,
                placed: tuple[list[Host], dict] | None = None) -> list:
    """Run ``fn(*args)`` as an elastic job (see the module docstring); returns the results.

    Args:
        elastic: the :class:`~hvdsync.config.ElasticConfig` (min/max workers, timeout, cooldown).
        np: workers at the start.
        run_dir: the run folder (discovery script, ``hosts``, worker log, pids, errors).
        hosts: the first hosts. Default: the first ``np`` of :func:`local_hosts`, one slot each. Across hosts:
            ``"node1:2,node2:2"`` or a list of :class:`~hvdsync.launch.hosts.Host` (``--hosts``, ``--hostfile``).
        ssh_port, ssh_identity_file: how Horovod's driver reaches the other hosts.
        network_interfaces: the interfaces the workers talk over (default: ``lo`` on one machine; across hosts,
            the ones Horovod finds common to the first hosts).
        lost: a list to which each host Horovod excluded after its workers failed is appended (``{"host", "time"}``).
        placed: what :func:`placement` returned for these arguments, when the caller has checked them already.
    """
    import horovod.runner as horovod_runner  # noqa: F401 - fails early and clearly when Horovod is missing

    run_dir = Path(run_dir)
    first, where = placed or placement(elastic, np, hosts, ssh_port, ssh_identity_file, network_interfaces)
    script = write_discovery(run_dir, first)
    options = {"min_num_proc": elastic.min_np, "max_num_proc": elastic.max_np, "host_discovery_script": str(script),
               **where}
    if elastic.cooldown_min_s:
        options["cooldown_range"] = (elastic.cooldown_min_s, elastic.cooldown_max_s)
    # Horovod 0.28.1 corrupts its heap when it re-initialises (every elastic reset) after HOROVOD_FUSION_THRESHOLD
    # and HOROVOD_CYCLE_TIME were both given: fixing a knob removes it from the autotuner's vector
    # (parameter_manager.cc, BayesianParameter::SetValue), and the next init writes the defaults back by their old
    # indices into the shorter vector; with both fixed the survivor segfaults in hvd.init(). Fixing only one writes
    # out of bounds too. So an elastic job keeps Horovod's own fusion (128 MiB) and cycle time (1 ms), which
    # measure alike to hvdsync's (docs/measurements/allreduce.md), and passes the cache capacity only.
    knobs = {k: v for k, v in (sync.horovod_env() if sync is not None else {}).items() if k not in ELASTIC_UNSAFE_KNOBS}
    worker_env = {**knobs, RUN_DIR_ENV: str(run_dir), **(env or {})}
    handler = DriverLog()
    logging.getLogger().addHandler(handler)
    try:
        # The driver reads its timeout from the environment of this process. Gloo's own timeout bounds how long the
        # ranks of a new ring wait for each other in hvd.init(): a joining worker must start (import TensorFlow,
        # seconds on a busy machine) within it, or the waiting survivor aborts in C++ (gloo::IoException, not a
        # Python error). Horovod's 30 s default is too short there. Across hosts it is also how long the survivors
        # wait in a collective for a host that vanished without closing its connections (tests/hosts/test_elastic.py
        # measures it): lower it in the environment for faster recovery where workers start fast.
        gloo_timeout = os.environ.get("HOROVOD_GLOO_TIMEOUT_SECONDS", str(max(elastic.timeout_s, GLOO_TIMEOUT_S)))
        timeouts = {"HOROVOD_ELASTIC_TIMEOUT": str(elastic.timeout_s), "HOROVOD_GLOO_TIMEOUT_SECONDS": gloo_timeout}
        with environ(timeouts), _ssh_options(), lost_hosts(lost):
            results = run(fn, args=args, np=np, env=worker_env, quiet=quiet, progress=progress,
                          log_dir=run_dir, runner_options=options)
    except WorkerError as exc:
        raise_clear(run_dir, handler.messages, elastic, exc)
        raise
    finally:
        logging.getLogger().removeHandler(handler)
        if quiet:
            _echo_reports(run_dir / "workers.log")
    raise_clear(run_dir, handler.messages, elastic, None)
    return results


def _echo_reports(log: Path) -> None:
    """Show the workers' one-line reports (resets, skipped checkpoints, a fresh start) in this terminal: in quiet
    mode the rest of their output stays in the log."""

    seen = set()
    with contextlib.suppress(OSError):
        for line in log.read_text(errors="replace").splitlines():
            _, sep, text = line.partition(">:hvdsync: ")
            if sep and text not in seen:
                seen.add(text)
                print(f"hvdsync: {text}", file=sys.stderr, flush=True)


def train(cfg: Config, quiet: bool = True, progress: bool = True, log_dir: str | Path | None = None,
          record_reads: bool = False, hosts=None, ssh_port: int | None = None,
          ssh_identity_file: str | None = None, network_interfaces: list[str] | None = None,
          callbacks: Sequence[Callback] = ()):
    """Train elastically as ``cfg`` says (``cfg.elastic``); returns rank 0's :class:`ElasticResult`.

    ``hosts``, ``ssh_port``, ``ssh_identity_file``, ``network_interfaces``: where, as :func:`run_elastic` says
    (default: this machine). Every config and host-list error is raised before any worker starts.

    ``callbacks``: :class:`~hvdsync.core.train.callbacks.Callback` instances for every worker's loop, beside those
    named in ``train.callbacks``; each worker gets its own copy (they travel pickled, so they must pickle), which
    lives on across resets. ``callbacks=[SampleLedger()]`` fills the result's ``reads`` and ``timeline``
    (:class:`~hvdsync.torch.SampleLedger`); ``record_reads=True`` is its deprecated spelling (until
    0.3.0).

    Example:
        >>> cfg = Config.from_dict({"elastic": {"enabled": True, "checkpoint_dir": "ckpt"}})   # doctest: +SKIP
        >>> print(train(cfg).summary())                                                        # doctest: +SKIP
        >>> train(cfg, hosts="node1:2,node2:2", ssh_identity_file="~/.ssh/id_ed25519",        # doctest: +SKIP
        ...       network_interfaces=["eth0"])
        >>> train(cfg, callbacks=[SampleLedger()]).reads                                       # doctest: +SKIP
    """
    _, callbacks = worker.fit_elastic_args(cfg, callbacks, record_reads, "hvdsync.launch.elastic.train")
    launcher = ElasticHosts(hosts=hosts, ssh_port=ssh_port, ssh_identity_file=ssh_identity_file,
                            network_interfaces=network_interfaces)
    return launcher.train(cfg, quiet=quiet, progress=progress, log_dir=log_dir, callbacks=callbacks)


class ElasticHosts(ElasticLauncher):
    """An elastic job under Horovod's elastic driver and the discovery script of :func:`write_discovery`: on this
    machine, or on ``hosts`` over ssh (``ssh_port``, ``ssh_identity_file``, ``network_interfaces``: see
    :func:`run_elastic`). Its run folder is ``log_dir`` or a temporary one, kept when the job fails."""

    name = "elastic"

    def __init__(self, hosts=None, ssh_port: int | None = None, ssh_identity_file: str | None = None,
                 network_interfaces: list[str] | None = None) -> None:
        super().__init__(hosts=hosts, ssh_port=ssh_port, ssh_identity_file=ssh_identity_file,
                         network_interfaces=network_interfaces)

    def placement(self, cfg: Config) -> tuple[list[Host], dict]:
        # Checked before the job's run is made: a bad host list is one line, not a FAILED run.
        return placement(cfg.elastic, cfg.train.np, **self.where)

    def start(self, cfg: Config, placed: tuple[list[Host], dict], how: Start) -> list:
        return run_elastic(worker.fit_elastic, (cfg.to_dict(), how.callbacks), cfg.elastic, cfg.train.np,
                           how.run_dir, sync=cfg.sync, quiet=how.quiet, env=how.env, progress=how.progress,
                           placed=placed, **self.where)

    def first_hosts(self, placed: tuple[list[Host], dict]) -> list[Host]:
        return placed[0]
