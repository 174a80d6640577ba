"""The ``hvdsync`` command.

    hvdsync train --framework torch --np 2 [--compression fp16] [--accumulate 4] [--config run.yaml] [--set k=v]
    hvdsync doctor            # what Horovod was built with (horovodrun --check-build) and the versions in use

Exit status: 0 on success, 2 for a bad config or command line (nothing started), 1 when a worker failed.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys

from hvdsync.config import Config, ConfigError

# CLI flags that are shortcuts for config fields (so `--compression fp16` == `--set sync.compression=fp16`).
SHORTCUTS = {
    "framework": "train.framework", "np": "train.np", "epochs": "train.epochs", "lr": "train.lr",
    "seed": "train.seed", "compression": "sync.compression", "accumulate": "sync.accumulate", "op": "sync.op",
    "batch_size": "data.batch_size", "dataset": "data.dataset", "experiment": "tracking.experiment",
    "tracking_uri": "tracking.tracking_uri",
}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="hvdsync", description="Synchronised data-parallel training on Horovod.")
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="train on local Horovod workers (Gloo)")
    t.add_argument("--config", help="YAML config file (sections: sync, data, train, tracking)")
    t.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                   help="override one config field; repeatable")
    for flag, field in SHORTCUTS.items():
        t.add_argument("--" + flag.replace("_", "-"), dest=flag, help=f"shortcut for --set {field}=...")
    t.add_argument("--no-track", action="store_true", help="do not record the run in MLflow")
    t.add_argument("--verbose", action="store_true", help="show worker output instead of a log file")
    t.add_argument("--json", action="store_true", help="print the result as JSON")
    t.add_argument("--log-dir", help="folder for the workers' log (default: a temporary folder)")
    sub.add_parser("doctor", help="show what Horovod was built with and the versions in use")
    return p


def _config(ns: argparse.Namespace) -> Config:
    overrides = list(ns.overrides)
    for flag, field in SHORTCUTS.items():
        value = getattr(ns, flag)
        if value is not None:
            overrides.append(f"{field}={value}")
    if ns.no_track:
        overrides.append("tracking.enabled=false")
    return Config.load(ns.config, overrides)


def _train(ns: argparse.Namespace) -> int:
    from hvdsync import launch

    cfg = _config(ns)  # every config error surfaces here, before any worker starts
    result = launch.train(cfg, quiet=not ns.verbose, log_dir=ns.log_dir)
    print(json.dumps(result.to_dict(), indent=2) if ns.json else result.summary())
    return 0


def _doctor() -> int:
    from importlib import metadata

    from hvdsync.launch import horovod_frameworks

    for name in ("hvdsync", "horovod", "torch", "tensorflow-cpu", "tensorflow", "keras", "mlflow", "numpy"):
        try:
            print(f"{name:>15} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            pass
    print(f"{'built for':>15} {', '.join(horovod_frameworks()) or 'nothing (Horovod missing)'}")
    return subprocess.call(["horovodrun", "--check-build"])


def main(argv: list[str] | None = None) -> int:
    ns = _parser().parse_args(argv)
    try:
        if ns.command == "train":
            return _train(ns)
        return _doctor()
    except ConfigError as exc:
        print(f"hvdsync: error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # a worker failure: say what happened, without a launcher traceback
        from hvdsync.launch import WorkerError

        if isinstance(exc, WorkerError):
            print(f"hvdsync: {exc}", file=sys.stderr)
            return 1
        raise


if __name__ == "__main__":
    sys.exit(main())
