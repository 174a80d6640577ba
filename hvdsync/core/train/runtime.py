"""What a worker knows about itself, and Horovod's knobs applied the same way by every entry point, framework-free.

Horovod reads its knobs (``HOROVOD_FUSION_THRESHOLD``, ``HOROVOD_CYCLE_TIME``, ``HOROVOD_CACHE_CAPACITY``) from the
environment once, in ``hvd.init()``. hvdsync's launcher puts them in the workers' environment; a plain
``horovodrun ... train.py --set sync.fusion_threshold_mb=8`` script has no launcher, so each adapter's ``init(cfg)``
calls :func:`apply_horovod_env` just before ``hvd.init()``. The rule, the same in both paths: a variable that the
user's environment already sets wins (an explicit ``export`` is a deliberate choice; hvdsync never overrides it), and
the run's record shows the value that applied (:func:`applied_params`), never one that did not.
"""
from __future__ import annotations

import ctypes
import math
import os
import sys
from dataclasses import dataclass
from typing import Any, Callable, MutableMapping, Sequence

REDUCE_OP_NAMES = {"average": "Average", "sum": "Sum", "adasum": "Adasum"}

# Each knob: the config field it comes from, and how to turn the environment's string back into that field's value.
KNOB_FIELDS = {
    "HOROVOD_FUSION_THRESHOLD": ("sync.fusion_threshold_mb", lambda v: int(v) / (1024 * 1024)),
    "HOROVOD_CYCLE_TIME": ("sync.cycle_time_ms", float),
    "HOROVOD_CACHE_CAPACITY": ("sync.cache_capacity", int),
}


# Horovod 0.28.1 corrupts its heap when an elastic job re-initialises with these fixed (hvdsync/launch/elastic.py
# says why): in an elastic worker (Horovod sets HOROVOD_ELASTIC=1) they keep Horovod's defaults.
ELASTIC_UNSAFE_KNOBS = ("HOROVOD_FUSION_THRESHOLD", "HOROVOD_CYCLE_TIME")


@dataclass(frozen=True)
class WorkerInfo:
    rank: int
    size: int
    local_rank: int
    local_size: int


@dataclass(frozen=True)
class KnobDecision:
    """One Horovod knob: the config's value, the value that applies, and where it came from."""

    name: str
    configured: str
    applied: str
    source: str  # "config" (hvdsync set it) or "environment" (the user's environment had it)


def apply_horovod_env(sync: Any, environ: MutableMapping[str, str] | None = None,
                      initialized: bool = False) -> list[KnobDecision]:
    """Put ``sync.horovod_env()`` into ``environ`` (default ``os.environ``) where it is not set yet; call it before
    ``hvd.init()``. A variable already set keeps its value. Returns one :class:`KnobDecision` per knob.
    ``initialized``: Horovod already read its environment (an earlier ``hvd.init()``), so nothing is set: a value
    written now would be recorded without having applied.

    Example:
        >>> env = {"HOROVOD_CYCLE_TIME": "5"}
        >>> [d.source for d in apply_horovod_env(SyncConfig(), env)]  # doctest: +SKIP
        ['config', 'environment', 'config']
    """
    environ = os.environ if environ is None else environ
    decisions = []
    for name, value in sync.horovod_env().items():
        if initialized:
            decisions.append(KnobDecision(name, value, environ.get(name, "Horovod's default"), "already initialized"))
        elif name in environ:
            decisions.append(KnobDecision(name, value, environ[name], "environment"))
        elif environ.get("HOROVOD_ELASTIC") == "1" and name in ELASTIC_UNSAFE_KNOBS:
            decisions.append(KnobDecision(name, value, "Horovod's default", "elastic"))
        else:
            environ[name] = value
            decisions.append(KnobDecision(name, value, value, "config"))
    return decisions


_REPORTED: set[str] = set()

# glibc's mallopt parameters (malloc.h) and what keep_freed_memory sets them to.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
KEEP_FREED_BYTES = 1 << 30       # free memory at the heap's top kept before any is handed back to the system
MMAP_THRESHOLD_BYTES = 32 << 20  # blocks up to this come from the heap: glibc's largest (HEAP_MAX_SIZE / 2, 64-bit)
# An allocator chosen in the environment: glibc's own tunables, or another allocator preloaded in its place.
ALLOCATOR_ENV = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_", "GLIBC_TUNABLES")
OTHER_ALLOCATORS = ("jemalloc", "tcmalloc", "mimalloc")


def keep_freed_memory(environ: MutableMapping[str, str] | None = None, libc: Any = None) -> str:
    """Make glibc's malloc keep what a training step frees for the next step (``train.keep_freed_memory``).

    Why: a CPU training step allocates and frees gradient-sized buffers (a 4096 x 1024 layer's gradient is 16.8 MB)
    every step. glibc serves a block that large with a fresh ``mmap`` until one is freed, then from the heap, and it
    hands the heap's top back to the system whenever more than twice that block is free there. Which of these
    happens depends on what the process allocated before, so the same step ran with 0 or with 2,000-6,000 page
    faults (8-24 MB faulted in, 4-5 ms of a 30 ms step) depending on the run before it in one job (a PowerSGD rank-2
    run after an fp32 one). Fixing both thresholds (blocks up to 32 MB from the heap, the heap's top kept up to
    1 GiB) makes the steady state the same every time: no faults after the first step. PyTorch and TensorFlow
    allocate their CPU tensors with ``malloc``, so both adapters get it. The price is memory the process keeps
    after a peak, as a caching allocator does.

    Nothing changes where the environment chose the allocator (:data:`ALLOCATOR_ENV`, or ``LD_PRELOAD`` naming
    jemalloc, tcmalloc or mimalloc) or where the C library is not glibc. Returns what happened: ``"applied"``,
    ``"environment"`` or ``"not glibc"``.
    """
    environ = os.environ if environ is None else environ
    preload = environ.get("LD_PRELOAD", "")
    if any(name in environ for name in ALLOCATOR_ENV) or any(a in preload for a in OTHER_ALLOCATORS):
        return "environment"
    try:
        libc = libc if libc is not None else ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return "not glibc"
    if not hasattr(libc, "gnu_get_libc_version"):   # only glibc has it; musl's mallopt does nothing
        return "not glibc"
    ok = mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1 and mallopt(_M_TRIM_THRESHOLD, KEEP_FREED_BYTES) == 1
    return "applied" if ok else "not glibc"


def report_knobs(decisions: list[KnobDecision], rank: int, stream: Any = None) -> str | None:
    """On rank 0, say once per process which knobs the environment overrode (nothing when the config's applied)."""
    overridden = [d for d in decisions if d.source in ("environment", "already initialized")
                  and d.applied != d.configured]
    if rank != 0 or not overridden:
        return None
    why = {"environment": "from the environment wins", "already initialized": "stays (Horovod was initialised "
           "before), not"}
    parts = [f"{d.name}={d.applied} {why[d.source]} over {KNOB_FIELDS[d.name][0]} (config: {d.configured})"
             for d in overridden]
    message = "hvdsync: " + "; ".join(parts) + "; the run records the values that applied"
    if message in _REPORTED:
        return None
    _REPORTED.add(message)
    print(message, file=stream or sys.stderr, flush=True)
    return message


def applied_params(cfg: Any, environ: MutableMapping[str, str] | None = None) -> dict[str, Any]:
    """``cfg.flat()`` with each Horovod knob replaced by the value the worker's environment holds (what Horovod
    read at ``hvd.init()``), plus ``horovod.<VARIABLE>`` with the raw strings: what a run record should claim.
    A variable that is not set is recorded as Horovod's default, not as the config's value."""
    environ = os.environ if environ is None else environ
    params = dict(cfg.flat())
    for name, (field, parse) in KNOB_FIELDS.items():
        if name not in environ:
            params[field] = f"Horovod's default ({name} not set)"
        else:
            params[f"horovod.{name}"] = environ[name]
            try:
                value = parse(environ[name])
                if value != params.get(field):  # equal: keep the config's spelling (64, not 64.0)
                    params[field] = value
            except ValueError:  # a value Horovod itself would misread: record the raw string, claim nothing else
                params[field] = f"unparsable environment value {environ[name]!r}"
    return params


def check_same_model(shapes: Sequence[tuple[int, ...]], allgather: Callable[[list[int]], list[list[int]]]) -> None:
    """Fail on every rank, before any training, when the ranks built models with different parameters: ``shapes``
    are this rank's parameter shapes, ``allgather(row)`` returns every rank's row (the adapter's Horovod call).

    Horovod pairs the ranks' tensors by name or position and shape; a model that differs between ranks (a size read
    from a rank-local file, a layer built only on rank 0) would otherwise hang in the first collective or fail deep
    inside Horovod. Both adapters' ``check_same_model`` hand their model's shapes here.
    """
    shapes = [tuple(int(d) for d in s) for s in shapes]
    every = allgather([len(shapes), sum(math.prod(s) for s in shapes), hash(tuple(shapes)) % (2 ** 31)])
    if any(list(row) != list(every[0]) for row in every):
        per_rank = "; ".join(f"rank {r}: {row[0]} tensors, {row[1]:,} numbers" for r, row in enumerate(every))
        raise ValueError(f"model: the parameters differ between ranks ({per_rank}); every rank must build the same "
                         "model (same layers and sizes) before training")
