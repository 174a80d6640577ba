"""Faults injected into hvdsync's training loop, for the tests and notebook 10: a plugin that registers the callback
``faults`` (:func:`hvdsync.registry.register_callback`), so the product itself reads no test variable.

The faults are read, in each worker, from the environment variable ``HVDLAB_FAULTS`` (forwarded to every worker by
Horovod's launcher, over ssh too): comma separated, ``kill@7:127.0.0.1`` makes the worker on host ``127.0.0.1``
send itself SIGKILL before the job's step 8 (``TrainContext.job_step`` 7: elastic resets included);
``raise@5:localhost`` raises a ``RuntimeError`` there (each fires once per run folder, ``HVDSYNC_RUN_DIR``);
``slow@30`` makes every worker sleep 30 ms per step (a job slow enough to watch and to change while it runs).

    cfg = faults.enable(cfg)                   # train.plugins += hvdlab.faults, train.callbacks += faults
    with faults.armed("slow@30,kill@6:127.0.0.2"):
        elastic.train(cfg, log_dir=run_dir)
"""
from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

from hvdsync.core.elastic.loop import RUN_DIR_ENV
from hvdsync.core.train._context import TrainContext
from hvdsync.core.train.callbacks import Callback
from hvdsync.registry import register_callback

ENV = "HVDLAB_FAULTS"
NAME = "faults"


def fire(step: int) -> None:
    """Fire this host's fault if one is due before ``step`` (once per run folder); sleep for ``slow@MS``."""
    spec, run_dir = os.environ.get(ENV), os.environ.get(RUN_DIR_ENV)
    if not spec or not run_dir:
        return
    host = os.environ.get("HOROVOD_HOSTNAME", "")
    for i, fault in enumerate(spec.split(",")):
        action, _, rest = fault.partition("@")
        at, _, where = rest.partition(":")
        if action == "slow":
            time.sleep(int(at) / 1000)
            continue
        if int(at) != step or where != host:
            continue
        marker = Path(run_dir) / f"fault-{i}.fired"
        if marker.exists():
            continue
        marker.write_text(fault)
        if action == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        raise RuntimeError(f"injected fault: {fault}")


@register_callback(NAME)
class Faults(Callback):
    """Before each step: :func:`fire` at the job's step."""

    def __init__(self, cfg=None) -> None:
        pass

    def on_step_begin(self, ctx: TrainContext) -> None:
        fire(ctx.job_step)


def enable(cfg):
    """``cfg`` with this plugin imported in every worker and its callback in the loop."""
    plugins = [*cfg.train.plugins, *([] if __name__ in cfg.train.plugins else [__name__])]
    callbacks = [*cfg.train.callbacks, *([] if NAME in cfg.train.callbacks else [NAME])]
    return cfg.replace(train={"plugins": plugins, "callbacks": callbacks})


@contextlib.contextmanager
def armed(spec: str) -> Iterator[None]:
    """``HVDLAB_FAULTS=spec`` in this process (and so in the workers it launches) for the block; put back after."""
    before = os.environ.get(ENV)
    os.environ[ENV] = spec
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = before
