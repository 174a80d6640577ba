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

Exit status: 0 on success, 2 for a bad config or command line (nothing started), 1 when a worker failed.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from hvdsync.launch import runs
from hvdsync.launch.options import SHORTCUTS, train_options
from hvdsync.config import Config, ConfigError

def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hvdsync", description="Synchronised data-parallel training on Horovod.")
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="train on local Horovod workers (Gloo)")
    train_options(t)
    t.add_argument("--json", action="store_true", help="print the result as JSON")
    t.add_argument("--log-dir", help="folder for the workers' log (default: a temporary folder)")
    _host_options(t)
    sub.add_parser("doctor", help="show what Horovod was built with and the versions in use")
    runs.add_parsers(sub)
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
    elif ns.hosts:
        where["hosts"] = hosts.parse_hosts(ns.hosts)
    elif ns.hostfile:
        where["hosts"] = hosts.read_hostfile(ns.hostfile)
    if ns.network_interface:
        where["network_interfaces"] = [name for name in ns.network_interface.split(",") if name]
    if ns.ssh_port is not None:
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
    job = launch.choose(cfg, ray=ns.ray, np_given=_np_given(ns, cfg), **_where(ns))
    if job.starts_workers:  # the workers record the command that started them (a step's task records its own)
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


def main(argv: list[str] | None = None) -> int:
    ns = _parser().parse_args(argv)
    try:
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
            return runs.main(ns, _config(ns))
        if ns.command == "runs":
            return runs.main(ns)
        return _doctor()
    except ConfigError as exc:
        print(f"hvdsync: error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # a worker failure: say what happened, without a launcher traceback
        from hvdsync.launch.base import WorkerError

        if isinstance(exc, WorkerError):
            print(f"hvdsync: {exc}", file=sys.stderr)
            return 1
        raise


if __name__ == "__main__":
    sys.exit(main())
