"""The ``hvdsync`` command.

    hvdsync train --framework torch --np 2 [--compression fp16] [--accumulate 4] [--config run.yaml] [--set k=v]
    hvdsync train --hosts a:2,b:2 --np 4 [--network-interface eth0] [--ssh-port 22] [--ssh-identity-file KEY]
    hvdsync train --hostfile hosts.txt --np 4           # or --hosts slurm inside a Slurm allocation
    srun --mpi=pmix hvdsync train [--np N]  # one rank per Slurm task, MPI, no ssh: hvdsync/launch/slurm.py
    hvdsync train --elastic --np 2 --min-np 1 --max-np 3 --checkpoint-dir DIR [--resume]
    hvdsync train --elastic --hosts a:2,b:2 --np 4 --min-np 2 --max-np 4 --network-interface eth0 --log-dir RUN
    hvdsync train --ray auto|HOST:PORT --np 4 [--elastic --min-np 2 --max-np 4]   # on a Ray cluster: launch/ray.py
    hvdsync doctor            # what Horovod was built with (controllers, MPI, check-build) and the versions in use
    hvdsync runs list|compare|push|ui|reproduce ...      # recorded runs (see hvdsync/launch/runs.py)
    hvdsync sweep --set sync.compression=none,fp16 --set sync.accumulate=1,4 [train options]

Exit status: 0 on success, 2 for a bad config, command line, path or store (nothing started), 1 when a worker
failed, 130/143 when the user stopped the job with Ctrl-C (SIGINT) / SIGTERM (docs/troubleshooting.md). Errors are
one line; ``--debug`` (before or after the command) shows the traceback too.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading

from hvdsync.launch import runs
from hvdsync.launch.options import SHORTCUTS, train_options
from hvdsync.config import Config, ConfigError

def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hvdsync", description="Synchronised data-parallel training on Horovod.")
    p.add_argument("--debug", action="store_true", help="show the traceback of an error, not only its line")
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="train on local Horovod workers (Gloo)")
    train_options(t)
    t.add_argument("--json", action="store_true", help="print the result as JSON")
    t.add_argument("--log-dir", help="folder for the workers' log (default: a temporary folder)")
    _host_options(t)
    sub.add_parser("doctor", help="show what Horovod was built with and the versions in use")
    runs.add_parsers(sub)
    # --debug after the command too (`hvdsync train ... --debug`); SUPPRESS keeps the one given before it.
    for parser in [*sub.choices.values(), *runs.subcommands(sub)]:
        parser.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    return p


def _host_options(t: argparse.ArgumentParser) -> None:
    """Where ``train`` starts its workers (default: this machine); Horovod's own option names and syntax."""
    where = t.add_mutually_exclusive_group()
    where.add_argument("--hosts", metavar="HOST:SLOTS,...", help="hosts to run on over ssh, as horovodrun's -H "
                       "(a:2,b:2); 'slurm' reads SLURM_JOB_NODELIST and SLURM_TASKS_PER_NODE")
    where.add_argument("--hostfile", metavar="FILE", help="a hostfile: '<host> slots=<N>' per line")
    where.add_argument("--ray", metavar="ADDRESS", help="run the workers on a Ray cluster: its head's HOST:PORT, or "
                       "'auto' (RAY_ADDRESS, else the cluster `ray start` joined here); needs pip install "
                       "'hvdsync[ray]'")
    t.add_argument("--network-interface", metavar="NAME[,NAME]", help="the interfaces the workers talk over")
    t.add_argument("--ssh-port", type=int, help="the port of sshd on the other hosts")
    t.add_argument("--ssh-identity-file", metavar="FILE", help="the ssh key for the other hosts")


def _where(ns: argparse.Namespace) -> dict:
    """The launcher's host arguments from the command line (checked by the launcher before any worker starts)."""
    from hvdsync.launch import hosts

    where: dict = {}
    if ns.hosts == "slurm":
        where["hosts"] = hosts.slurm_hosts()
    elif ns.hosts is not None:  # --hosts '' too: an empty list is refused, not read as "this machine"
        where["hosts"] = hosts.parse_hosts(ns.hosts)
    elif ns.hostfile is not None:
        where["hosts"] = hosts.read_hostfile(ns.hostfile)
    if ns.network_interface:
        where["network_interfaces"] = [name for name in ns.network_interface.split(",") if name]
    if ns.ssh_port is not None:
        if not 1 <= ns.ssh_port <= 65535:
            raise ConfigError(f"--ssh-port: {ns.ssh_port} is not allowed; expected a TCP port from 1 to 65535 "
                              "(sshd's, default 22)")
        where["ssh_port"] = ns.ssh_port
    if ns.ssh_identity_file:
        where["ssh_identity_file"] = ns.ssh_identity_file
    return where


def _config(ns: argparse.Namespace) -> Config:
    overrides = list(ns.overrides)
    for flag, field in SHORTCUTS.items():
        value = getattr(ns, flag)
        if value is not None:
            overrides.append(f"{field}={value}")
    if ns.no_track:
        overrides.append("tracking.enabled=false")
    if ns.timeline:
        overrides.append("tracking.timeline=true")
    if ns.elastic:
        overrides.append("elastic.enabled=true")
    if ns.resume:
        overrides.append("elastic.resume=true")
    return Config.load(ns.config, overrides)


def _train(ns: argparse.Namespace) -> int:
    from hvdsync import launch

    cfg = _config(ns)  # every config error surfaces here, before any worker starts
    # One question to the launch package: Ray, elastic, this machine or --hosts, or a task of an srun step.
    where = _where(ns)
    job = launch.choose(cfg, ray=ns.ray, np_given=_np_given(ns, cfg), **where)
    if job.starts_workers:  # (an srun step's tasks are the workers: Slurm placed them, each checks its own)
        before_start(cfg, ns.log_dir, local=not ns.ray and not _remote(where.get("hosts")),
                     ssh_port=None if "hosts" in where else ns.ssh_port)
        # the workers record the command that started them (a step's task records its own)
        os.environ.setdefault("HVDSYNC_COMMAND_LINE", json.dumps(["hvdsync", *sys.argv[1:]]))
    try:
        result = job.train(cfg, quiet=not ns.verbose, log_dir=ns.log_dir)
    except ConfigError:
        if not job.speaks:
            return 2  # every task of an srun step checks; task 0 alone says why, so the job's log has the line once
        raise
    if getattr(result, "rank", 0) == 0:  # a launcher returns rank 0's result; an srun step's task its own
        for message in getattr(result, "warnings", []):  # monitor alarms, a store that did not answer: once each
            print(f"hvdsync: warning: {message}", file=sys.stderr)
        print(json.dumps(result.to_dict(), indent=2) if ns.json else result.summary())
    return 0


def _np_given(ns: argparse.Namespace, cfg: Config) -> int | None:
    """The worker count the command line gave (``--np`` or ``--set train.np=``), else None (the config's default)."""
    given = [o.split("=", 1)[1] for o in ns.overrides if o.split("=", 1)[0].strip() == "train.np"]
    return cfg.train.np if ns.np is not None or given else None


def _doctor() -> int:
    from importlib import metadata

    from hvdsync.launch.base import horovod_frameworks
    from hvdsync.launch.mpi import controllers

    for name in ("hvdsync", "horovod", "torch", "tensorflow-cpu", "tensorflow", "keras", "mlflow", "numpy"):
        try:
            print(f"{name:>15} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            pass
    print(f"{'built for':>15} {', '.join(horovod_frameworks()) or 'nothing (Horovod missing)'}")
    for name, value in controllers().items():
        print(f"{name:>15} {value}")
    # The environment's own horovodrun (beside this interpreter): a venv used without activating it has no
    # horovodrun on PATH, or another environment's.
    beside = os.path.join(os.path.dirname(sys.executable), "horovodrun")
    return subprocess.call([beside if os.path.exists(beside) else "horovodrun", "--check-build"])


def before_start(cfg: Config, log_dir: str | None, local: bool, ssh_port: int | None = None) -> None:
    """What the launcher checks and notes before any worker starts: every path the job writes (one
    :class:`ConfigError` line), ``train.device=cuda`` on a machine without a GPU, and one-line warnings for what
    runs but is likely not what the user meant."""
    from hvdsync.core.train.gpus import present_gpus
    from hvdsync.launch.base import check_outputs

    check_outputs(cfg, log_dir, local)
    if local and cfg.train.device == "cuda" and present_gpus() == 0:
        raise ConfigError("train.device: 'cuda' is not allowed on this machine: it has no NVIDIA GPU (no /dev/nvidia* "
                          "device); run on a machine with a GPU, or set train.device=cpu (or auto)")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if local and cfg.train.np > cores:
        _warn(f"train.np: {cfg.train.np} workers on {cores} CPU core(s) of this machine: they share cores "
              "(oversubscribed), so each step is slower than with fewer workers")
    if local and ssh_port is not None and not cfg.elastic.enabled:  # (an elastic job refuses it in one line)
        _warn("--ssh-port: not used without --hosts or --hostfile; the workers run on this machine, without ssh")
    samples = _training_samples(cfg)
    if samples is not None and cfg.data.batch_size * cfg.train.np > samples:
        _warn(f"data.batch_size: {cfg.data.batch_size} per worker x {cfg.train.np} workers is more than the "
              f"{samples} training samples of {cfg.data.dataset!r}: each epoch is one step of {samples} samples")


def _remote(listed) -> bool:
    """Whether a host list names a machine other than this one (by address, as Horovod decides on ssh)."""
    if not listed:
        return False
    import socket

    from hvdsync.launch.reach import local_addresses

    mine = local_addresses()
    for host in listed:
        try:
            if socket.gethostbyname(host.name) not in mine:
                return True
        except OSError:
            return True
    return False


def _training_samples(cfg: Config) -> int | None:
    """The training set's size, for hvdsync's own data sets (cheap to build here); None for a user's."""
    from hvdsync.core.train import data

    loaders = {"digits": data.load_digits, "digits_images": data.load_digits_images,
               "synthetic": data.load_synthetic, "synthetic_images": data.load_synthetic_images}
    from hvdsync.registry import DATASETS

    loader = loaders.get(cfg.data.dataset)
    if loader is None or DATASETS.get(cfg.data.dataset) is not loader:
        return None
    return len(loader(cfg.data, cfg.train.seed).x_train)


def _note_repeats(argv: list[str]) -> None:
    """A warning for an option that takes one value and was given more than once (argparse keeps the last)."""
    seen: dict[str, list[str]] = {}
    for i, arg in enumerate(argv):
        if arg == "--":
            break
        flag, eq, value = arg.partition("=")
        if flag.startswith("--") and flag not in _REPEATABLE:
            if not eq:
                value = argv[i + 1] if i + 1 < len(argv) and not argv[i + 1].startswith("--") else ""
            seen.setdefault(flag, []).append(value)
    for flag, values in seen.items():
        if len(values) > 1 and len(set(values)) > 1:
            _warn(f"{flag} given {len(values)} times ({', '.join(map(repr, values))}); the last, {values[-1]!r}, is "
                  "used")


# Options that may be given several times (each adds a value) or take no value.
_REPEATABLE = {"--set", "--runs"}


def _warn(message: str) -> None:
    print(f"hvdsync: warning: {message}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def _stops_on_signals():
    """SIGINT and SIGTERM raise :class:`Stopped` while the command runs (the launcher stops its workers and ends
    the run KILLED); Horovod's launcher takes them over while it runs (hvdsync.launch.base.signals_seen)."""
    from hvdsync.launch.base import Stopped

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame):
        raise Stopped(signum)

    saved = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler)


def _dispatch(ns: argparse.Namespace) -> int:
    if ns.command == "train":
        return _train(ns)
    if ns.command == "sweep":
        # A --set listing several values is an axis of the grid; the others configure every run.
        axes = [o for o in ns.overrides if "," in o.split("=", 1)[-1]]
        ns.overrides = [o for o in ns.overrides if o not in axes]
        if not axes:
            raise ConfigError("--set: a sweep needs at least one field with several values, e.g. "
                              "--set sync.accumulate=1,4")
        ns.sweeps = axes
        base = _config(ns)
        before_start(base, None, local=True)
        return runs.main(ns, base)
    if ns.command == "runs":
        return runs.main(ns)
    return _doctor()


def main(argv: list[str] | None = None) -> int:
    from hvdsync.launch.base import Stopped, WorkerError

    ns = _parser().parse_args(argv)
    debug = getattr(ns, "debug", False)
    _note_repeats(sys.argv[1:] if argv is None else argv)
    try:
        with _stops_on_signals():
            return _dispatch(ns)
    except ConfigError as exc:
        if debug:
            import traceback

            traceback.print_exc()
        print(f"hvdsync: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM: the workers are stopped, the run ended KILLED
        signum = exc.signum if isinstance(exc, Stopped) else signal.SIGINT
        workers = "; the workers were stopped" if ns.command in ("train", "sweep") else ""
        print(f"hvdsync: stopped by the user ({signal.Signals(signum).name}){workers}", file=sys.stderr)
        return 128 + signum
    except WorkerError as exc:  # a worker failed: say what happened, without a launcher traceback
        print(f"hvdsync: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # noqa: BLE001 - anything else: one line, the traceback with --debug
        if debug:
            raise
        text = str(exc).strip().splitlines()
        print(f"hvdsync: error: {type(exc).__name__}: {text[0] if text else ''} (run with --debug for the "
              "traceback)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
