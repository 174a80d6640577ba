"""Starting workers: the CLI, the local launcher, the elastic launcher, the worker entry point, recorded runs.

    hvdsync.launch.run(fn, np=2)            a function on local Horovod workers (cli, notebooks, tests)
    hvdsync.launch.train(cfg)               the built-in training job, as the CLI's ``hvdsync train``
    hvdsync.launch.elastic.train(cfg)       the same, elastic (workers may come and go)

Every launcher starts workers through one entry point (:mod:`hvdsync.launch.worker`), which quiets the framework's
start-up lines before anything imports it, registers the stack dump a stalled job asks for, then calls the function.
"""
from hvdsync.launch.local import (
    QUIET_ENV,
    WorkerError,
    horovod_frameworks,
    preflight,
    run,
    train,
    train_many,
)
from hvdsync.launch.worker import ADAPTERS

__all__ = ["run", "train", "train_many", "preflight", "horovod_frameworks", "WorkerError", "ADAPTERS", "QUIET_ENV"]
