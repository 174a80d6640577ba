"""The options of ``hvdsync train`` that name config fields, shared by the commands that take a config (``train``,
``sweep``): :func:`train_options` adds them to a parser. A module of its own so that :mod:`hvdsync.launch.cli` and
:mod:`hvdsync.launch.runs` both use it without importing each other.
"""
from __future__ import annotations

import argparse

# CLI flags that are shortcuts for config fields (so `--compression fp16` == `--set sync.compression=fp16`).
SHORTCUTS = {
    "framework": "train.framework", "np": "train.np", "epochs": "train.epochs", "lr": "train.lr",
    "seed": "train.seed", "compression": "sync.compression", "accumulate": "sync.accumulate", "op": "sync.op",
    "model": "train.model", "batch_size": "data.batch_size", "dataset": "data.dataset",
    "experiment": "tracking.experiment", "tracking_uri": "tracking.tracking_uri", "min_np": "elastic.min_np",
    "max_np": "elastic.max_np", "checkpoint_dir": "elastic.checkpoint_dir", "device": "train.device",
}


def train_options(t: argparse.ArgumentParser) -> None:
    """The config options of ``train`` (and ``sweep``, whose ``--set`` may list values: ``sync.accumulate=1,4``)."""
    t.add_argument("--config", help="YAML config file (sections: sync, data, train, tracking, monitor, elastic)")
    t.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                   help="override one config field; repeatable")
    for flag, field in SHORTCUTS.items():
        t.add_argument("--" + flag.replace("_", "-"), dest=flag, help=f"shortcut for --set {field}=...")
    t.add_argument("--elastic", action="store_true", help="elastic job: survives lost workers, grows back "
                   "(hosts from a discovery script that prints the file 'hosts' in --log-dir: this machine's "
                   "names, or --hosts/--hostfile; see hvdsync.launch.elastic)")
    t.add_argument("--resume", action="store_true", help="elastic: start from the newest valid checkpoint")
    t.add_argument("--no-track", action="store_true", help="do not record the run in MLflow")
    t.add_argument("--timeline", action="store_true", help="record Horovod's timeline and its per-tensor chart")
    t.add_argument("--verbose", action="store_true", help="show worker output instead of a log file")
