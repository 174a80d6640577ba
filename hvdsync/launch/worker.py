"""The one entry point of every worker that hvdsync starts, and the jobs those workers run.

Every launcher (:func:`hvdsync.launch.run`, the elastic launcher, ``hvdsync sweep``) hands Horovod's runner
:func:`entry` with a cloudpickled ``(fn, args, kwargs)``. :func:`entry` quiets the framework's start-up lines before
anything can import it, registers the stack dump a launch asks for when it gives up on a worker, then calls ``fn``.
The jobs below are the ``fn`` of the built-in commands: :func:`fit` (``hvdsync train``), :func:`fit_many` (several
configs in one job: ``hvdsync sweep`` and :func:`hvdsync.launch.train_many`) and :func:`fit_elastic`.
"""
from __future__ import annotations

import importlib
import os
import traceback
from collections.abc import Sequence
from pathlib import Path

from hvdsync.config import Config
from hvdsync.core.elastic.loop import RUN_DIR_ENV
from hvdsync.core.train.callbacks import Callback
from hvdsync.fitting import with_ledger
from hvdsync.launch.workers import STACKS_SIGNAL

# The adapter module for each framework name (a registry, not a branch per framework).
ADAPTERS = {"torch": "hvdsync.torch", "tensorflow": "hvdsync.tensorflow"}


def adapter(cfg: Config):
    """The adapter module ``cfg.train.framework`` names."""
    return importlib.import_module(ADAPTERS[cfg.train.framework])


def entry(payload: bytes):
    """Runs in each worker: filter TensorFlow's start-up lines (:mod:`hvdsync.launch.quiet`) before anything can
    import it (unpickling the function may import the user's module, which may import TensorFlow), then call it."""
    import faulthandler

    import cloudpickle

    from hvdsync.launch.quiet import quiet_imports

    # A launch that gives up on this worker asks for its stacks first (hvdsync.launch.workers): the log says where.
    faulthandler.register(STACKS_SIGNAL, all_threads=True)
    quiet_imports()
    fn, args, kwargs = cloudpickle.loads(payload)
    return fn(*args, **kwargs)


def fit(cfg_dict: dict) -> dict:
    """Runs in each worker: build the config again (validated) and call the framework adapter's ``fit``."""
    cfg = Config.from_dict(cfg_dict)
    return adapter(cfg).fit(cfg).to_dict()


def fit_many(cfg_dicts: list[dict], callbacks: Sequence = ()) -> list[dict]:
    """Inside a worker: train every config in turn (one Horovod start-up for all), each with its own copy of
    ``callbacks`` (what each :meth:`~hvdsync.core.train.callbacks.Callback.report` returns joins that config's
    result); see :func:`hvdsync.launch.train_many`."""
    import copy

    from hvdsync import datasets
    from hvdsync.core.comm.codecs.registry import get_codec
    from hvdsync.fitting import fit_loop
    from hvdsync.registry import make_callbacks

    out = []
    for cfg_dict in cfg_dicts:
        cfg = Config.from_dict(cfg_dict)
        framework = adapter(cfg)
        framework.init(cfg)
        data = datasets.load(cfg.data, cfg.train.seed)
        backend = framework.build(cfg, data)
        own = copy.deepcopy(list(callbacks))   # a fresh one per config: no state carried from the last
        before = _link_counters()
        result = fit_loop(cfg, backend, data, callbacks=[*make_callbacks(cfg), *own]).to_dict()
        after = _link_counters()
        result["link_bytes"] = {k: after[k] - before[k] for k in after} if after else None
        codec = get_codec(cfg.sync.compression)
        params = backend.parameters()
        result["numel"] = int(sum(p.size for p in params))
        result["wire_bytes_per_step_formula"] = int(sum(codec.wire_bytes(p.shape, p.itemsize) for p in params))
        result["step_spread_max"] = None
        for c in own:
            result.update(c.report())
        precision = getattr(backend, "precision", None)
        result["skipped_steps"] = getattr(precision, "skipped_steps", 0)
        result["config"] = cfg.to_dict()
        out.append(result)
    return out


def _link_counters() -> dict[str, int]:
    """Bytes this host sent and received so far on the interface Horovod's Gloo uses (``HOROVOD_GLOO_IFACE``, set
    when the job names its network interfaces); {} where the job runs over loopback or names none."""
    import psutil

    iface = os.environ.get("HOROVOD_GLOO_IFACE", "")
    counters = psutil.net_io_counters(pernic=True).get(iface) if iface and iface != "lo" else None
    return {"sent": counters.bytes_sent, "received": counters.bytes_recv} if counters else {}


def fit_elastic_args(cfg: Config, callbacks: Sequence[Callback] = (), record_reads: bool = False,
                     call: str = "train") -> tuple[dict, tuple[Callback, ...]]:
    """The arguments the elastic launchers ship to every worker's :func:`fit_elastic`: the config as a dict and
    ``callbacks`` as given. They travel cloudpickled with the job (:func:`entry`), so each worker trains with its
    own copy of each callback, which must pickle (a :class:`~hvdsync.torch.SampleLedger` does).

    ``record_reads=True`` is the launchers' deprecated spelling of ``callbacks=[SampleLedger()]`` (until 0.3.0): it
    warns, naming ``call`` (the launcher), as :func:`hvdsync.fitting.with_ledger` says, and adds a ledger.

    Example:
        >>> fit_elastic_args(cfg, [SampleLedger()])  # doctest: +SKIP
        ({'sync': ..., ...}, (<SampleLedger>,))
    """
    # stacklevel 3: the warning points at the user's call of the launcher, which called this.
    return cfg.to_dict(), tuple(with_ledger(callbacks, record_reads, call, stacklevel=3))


def fit_elastic(cfg_dict: dict, callbacks: Sequence[Callback] = ()) -> dict:
    """Runs in each worker: the adapter's ``fit_elastic`` with the launcher's ``callbacks`` (this worker's copies,
    see :func:`fit_elastic_args`); a Python error becomes a traceback file and exit 0."""
    run_dir, host = Path(os.environ[RUN_DIR_ENV]), os.environ.get("HOROVOD_HOSTNAME", "localhost")
    (run_dir / "pids").mkdir(exist_ok=True)
    (run_dir / "pids" / f"{host}.pid").write_text(str(os.getpid()))
    try:
        cfg = Config.from_dict(cfg_dict)
        result = adapter(cfg).fit_elastic(cfg, callbacks=list(callbacks)).to_dict()
        # Horovod's run_task files the result under HOROVOD_RANK, the rank this process *started* with; after a
        # reset the ranks are reassigned, and the launcher reads rank 0's key: file it under the rank it has now.
        os.environ["HOROVOD_RANK"] = str(result["rank"])
        return result
    except Exception:  # noqa: BLE001 - reported to the launcher, which raises it with this traceback
        text = traceback.format_exc()
        (run_dir / "errors").mkdir(exist_ok=True)
        (run_dir / "errors" / f"{host}-{os.getpid()}.txt").write_text(text)
        return {"error": text}
