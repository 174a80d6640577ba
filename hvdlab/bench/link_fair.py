"""What keeps ``benchmarks/link.py``'s comparison from favouring either side: where every worker runs, the order the
contenders are timed in, and how repeated figures are summed up.

* Placement: every worker of every contender (hvdsync's Horovod workers, the one Horovod starts on node1 without ssh
  included, and DDP's ranks) reads its own CPU affinity and intra-op thread count (:func:`placement`);
  :func:`check_placement` refuses a contender, by name, whose workers do not run on their host's cores with the
  threads every contender gets. The sweep checks before it times anything, and again on what the timed workers
  reported.
* Order: :func:`schedule` interleaves the contenders, A B A B ..., ``repeats`` times at each rate, so a slow minute of
  a shared machine lands on all of them.
* Figures: each is the median of the repeats with its [min, max] (:func:`median_spread`); accuracy is the mean and
  standard deviation over the seeds (:func:`accuracy_stats`), every repeat at every rate training with a seed of its
  own (:func:`seed_for`).
* The link: an all-reduce's bus bandwidth over the link as a fraction of the link's measured TCP rate
  (:func:`bus_fraction`).
"""
from __future__ import annotations

import math
import os
import socket
import statistics
import time


class PlacementError(RuntimeError):
    """A contender's workers do not run where (or with the threads) the others' do: it is not timed."""


def placement(framework: str) -> dict:
    """Where this worker runs, read from inside it: its host name, the CPUs it may run on (its affinity) and the
    intra-op threads its framework uses now."""
    if framework == "torch":
        import torch

        threads = torch.get_num_threads()
    elif framework == "tensorflow":
        import tensorflow as tf

        # 0 is TensorFlow's "not set": then it uses one thread per core it sees.
        threads = tf.config.threading.get_intra_op_parallelism_threads() or os.cpu_count()
    else:
        raise ValueError(f"framework: {framework!r} is not allowed; choose one of: torch, tensorflow")
    return {"host": socket.gethostname(), "pid": os.getpid(), "cpus": sorted(os.sched_getaffinity(0)),
            "threads": int(threads)}


def same_allocator() -> dict[str, str]:
    """glibc's environment for what ``train.keep_freed_memory`` sets in hvdsync's workers
    (:func:`hvdsync.core.train.runtime.keep_freed_memory`): given to every contender of a comparison, hvdsync's
    included (its workers then leave the allocator as the environment set it), so none pays page faults another
    does not."""
    from hvdsync.core.train.runtime import KEEP_FREED_BYTES, MMAP_THRESHOLD_BYTES

    return {"MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD_BYTES), "MALLOC_TRIM_THRESHOLD_": str(KEEP_FREED_BYTES)}


def expected_threads(host_cpus: dict[str, list[int]], per_host: int) -> int:
    """The intra-op threads every worker should use: its host's cores over the workers on the host (hvdsync's own
    rule, :func:`hvdsync.core.train.seeding.threads_per_worker`), the same for every contender."""
    return max(1, min(len(c) for c in host_cpus.values()) // max(1, per_host))


def check_placement(host_cpus: dict[str, list[int]], threads: int, contenders: dict[str, list[dict]]) -> None:
    """Raise :class:`PlacementError` naming the first contender (in ``contenders``' order) one of whose workers runs
    on other cores than its host's (``host_cpus``: host name -> cores), with other than ``threads`` intra-op threads,
    or on no listed host; or that reported no workers at all."""
    for name, workers in contenders.items():
        if not workers:
            raise PlacementError(f"contender {name!r} refused: its workers reported no placement")
        for w in workers:
            want = host_cpus.get(w["host"])
            if want is None:
                raise PlacementError(f"contender {name!r} refused: a worker runs on host {w['host']!r}, which is not "
                                     f"one of {', '.join(sorted(host_cpus))}")
            if sorted(w["cpus"]) != sorted(want) or w["threads"] != threads:
                raise PlacementError(
                    f"contender {name!r} refused: its worker on {w['host']} (pid {w.get('pid', '?')}) runs on "
                    f"cores {_cores(w['cpus'])} with {w['threads']} thread(s); every contender's workers must run on "
                    f"their host's cores ({_cores(want)} on {w['host']}) with {threads} thread(s)")


def _cores(cpus) -> str:
    return ",".join(str(c) for c in sorted(cpus)) or "none"


def schedule(contenders: list[str], repeats: int) -> list[tuple[int, str]]:
    """``(repeat, contender)`` in the order they run: A B A B ... (every contender once per repeat, in the same
    order), so neither side always runs on a fresher or a more tired machine than the other within a repeat."""
    if not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats: {repeats!r} is not allowed; expected an integer >= 1")
    return [(r, c) for r in range(repeats) for c in contenders]


def seed_for(rate_index: int, repeat: int, repeats: int) -> int:
    """The training seed of one repeat at one rate: every (rate, repeat) its own, the same for every contender.
    The link's rate does not change what is computed, so accuracy is summed up over all of them."""
    return rate_index * repeats + repeat


def median_spread(values: list[float]) -> tuple[float, list[float]]:
    """The median of ``values`` and their ``[min, max]``."""
    if not values:
        raise ValueError("median_spread: no values")
    return statistics.median(values), [min(values), max(values)]


def accuracy_stats(accuracies: list[float], test_samples: int) -> dict:
    """Mean and standard deviation over seeds, how many, and the standard error of one run's accuracy on
    ``test_samples`` samples at that mean (sqrt(p (1 - p) / n)): a difference below it is noise."""
    mean = statistics.fmean(accuracies)
    return {"mean": mean, "sd": statistics.stdev(accuracies) if len(accuracies) > 1 else None,
            "seeds": len(accuracies), "test_samples": test_samples,
            "standard_error": math.sqrt(max(mean * (1 - mean), 0.0) / test_samples) if test_samples else None}


def bus_fraction(nbytes: int, ranks: int, seconds: float, link_bytes_per_second: float) -> float:
    """An all-reduce's bus bandwidth (NCCL's busbw: 2 (n - 1) / n of the buffer over the time, what each rank's link
    carries in a ring) over the link's measured rate."""
    return 2 * (ranks - 1) / ranks * nbytes / seconds / link_bytes_per_second


def allreduce_seconds(hvd, nbytes: int, repeats: int = 5) -> float:
    """Median seconds of one Horovod all-reduce of ``nbytes`` of float32 on every rank (after one untimed),
    checked: a wrong sum raises."""
    import numpy as np

    n = nbytes // 4
    framework = hvd.__name__.split(".")[-1]
    if framework == "torch":
        import torch

        tensor = torch.ones(n)
        total = lambda out: float(out[0]) + float(out[-1])  # noqa: E731
    else:
        import tensorflow as tf

        tensor = tf.ones([n])
        total = lambda out: float(out[0].numpy()) + float(out[-1].numpy())  # noqa: E731
    runs = []
    for i in range(repeats + 1):
        t0 = time.perf_counter()
        out = hvd.allreduce(tensor, op=hvd.Sum, name=f"link_fair.bus.{i}")
        got = total(out)   # reading the result waits for it
        runs.append(time.perf_counter() - t0)
        if not np.isclose(got, 2.0 * hvd.size()):
            raise RuntimeError(f"all-reduce of {nbytes} bytes returned {got / 2} at its ends, not {hvd.size()}")
    return statistics.median(runs[1:])


# ---- run inside hvdsync's Horovod workers (hvdsync.launch.run) --------------------------------------------------
def probe_workers(cfg_dict: dict, specs: list[str], shapes: list[tuple[int, ...]], bus_bytes: int,
                  fit_bytes: tuple[int, ...] = ()) -> dict:
    """Before anything is timed, on every worker of hvdsync's job, started as its training is: hvdsync's own
    ``init`` (Horovod, the intra-op threads per worker), then each codec's encoding and one Horovod call
    (:func:`hvdlab.bench.link_encode.on_workers`), then a ``bus_bytes`` all-reduce (0: none), an all-reduce of each
    of ``fit_bytes`` (``allreduce_s``, by size: the cost model's alpha and beta are fitted to them) and this core's
    float32 add (``gamma``, seconds per byte: the reduction's term), then where this worker ran
    (:func:`placement`)."""
    import importlib

    from hvdlab.bench import link_encode
    from hvdsync.config import Config
    from hvdsync.launch.worker import adapter

    cfg = Config.from_dict(cfg_dict)
    framework = cfg.train.framework
    adapter(cfg).init(cfg)
    out = link_encode.on_workers(framework, specs, [tuple(s) for s in shapes])
    hvd = importlib.import_module(f"horovod.{framework}")
    out["bus_s"] = allreduce_seconds(hvd, bus_bytes) if bus_bytes else None
    out["allreduce_s"] = {str(b): allreduce_seconds(hvd, b) for b in fit_bytes}
    if fit_bytes:
        from hvdlab import hardware

        out["gamma"] = hardware.memory_bandwidth(max(fit_bytes), repeats=3)["gamma"]
    out["placement"] = placement(framework)
    return out


def fit_placed(cfg_dicts: list[dict]) -> dict:
    """On every worker: train every config as :func:`hvdsync.launch.train_many` does, then say where this worker
    ran; rank 0 also returns the results."""
    from hvdsync.launch.worker import fit_many

    results = fit_many(cfg_dicts)
    framework = cfg_dicts[0]["train"]["framework"]
    rank = int(os.environ.get("HOROVOD_RANK", "0"))
    return {"results": results if rank == 0 else None, "placement": placement(framework)}
