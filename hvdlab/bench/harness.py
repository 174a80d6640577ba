"""The measuring machinery shared by ``benchmarks/allreduce.py`` (the side-by-side table) and ``benchmarks/knobs.py``
(the knob sweep).

A *variant* is one way of all-reducing a float32 tensor on 2 local processes: Horovod Gloo in workers started by
:func:`hvdsync.launch.local.run` (with some knobs and some way of calling Horovod), or ``torch.distributed`` Gloo in
plain subprocesses on 127.0.0.1. Every variant runs the same loop (:func:`measure`):

    for each size: warm-up iterations, then timed ones; each iteration refills the tensor, meets the other rank at a
                   barrier, times one allreduce, and compares the result element by element with the exact expected
                   sum or average. A wrong result raises, so the run fails: a fast-but-wrong variant cannot win.

An iteration's time is the slowest rank's (the collective is done only when both are). The 2-core machine is shared
and noisy, so :func:`run_rounds` alternates: each round starts every variant once (its own pair of worker
processes), in an order rotated by the round number, and each start times ``iters / rounds`` iterations per size.
Noise then lands on all variants alike, and a ratio taken inside one round compares measurements made a minute or
so apart.

Why a fresh pair of processes per variant, and not ``hvd.shutdown()`` / ``hvd.init()`` with other knobs in one
pair: Horovod's static Gloo rendezvous keeps the previous ``init``'s addresses under the same keys, so a second
``init`` can read the other rank's stale address and abort with "Connect timeout" (seen here).
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

MB = 1024 * 1024
# Horovod tuning variables a variant may set. Any of them in the caller's environment is removed while the benchmark
# launches workers, so "Horovod's defaults" are Horovod's and not whatever the shell exported.
TUNING_VARS = ("HOROVOD_FUSION_THRESHOLD", "HOROVOD_CYCLE_TIME", "HOROVOD_CACHE_CAPACITY", "HOROVOD_THREAD_AFFINITY",
               "HOROVOD_TIMELINE", "HOROVOD_AUTOTUNE", "HOROVOD_STALL_CHECK_DISABLE", "HOROVOD_DISABLE_GROUP_FUSION",
               "HOROVOD_IDLE_WAIT_MS")
# Horovod's background loop as upstream has it: with scripts/horovod-patches/0007 an idle loop waits for work; this
# switches that off, so a run can compare the two (a Horovod without 0007 ignores the variable).
UPSTREAM_LOOP = {"HOROVOD_IDLE_WAIT_MS": "0"}
# Set by the benchmark's own self-test (``--inject-error``): perturb one element after the reduce.
INJECT_ENV = "HVDSYNC_BENCH_INJECT_ERROR"


@dataclass
class Variant:
    """One way to all-reduce.

    Args:
        name: key in JSON; ``label`` is what tables print.
        backend: ``horovod`` (workers from :func:`hvdsync.launch.local.run`) or ``torch`` (torch.distributed Gloo).
        sync: Horovod only: ``None`` hands the launcher no :class:`~hvdsync.config.SyncConfig`; a dict hands it
            ``SyncConfig(**sync)`` (``{}``: hvdsync's defaults), whose ``horovod_env()`` the launcher exports.
        worker_env: set (``None``: unset) inside the worker just before ``hvd.init()``, after the launcher and
            ``horovod.runner`` have built the worker's environment; how the sweep sets knobs.
        init: ``horovod`` (plain ``hvd.init()``) or ``hvdsync`` (:func:`hvdsync.torch.runtime.init`: ``hvd.init()``
            and hvdsync's intra-op threads per worker, which is 1 for 2 workers on 2 cores).
        threads: torch intra-op threads where ``init`` does not set them (torch.distributed, plain Horovod); 1 is
            what ``torchrun`` sets (``OMP_NUM_THREADS=1``) and what hvdsync picks on 2 cores. With torch's default
            (one per core) each process's OpenMP threads spin after every parallel op and 2 processes fight over
            2 cores, which adds noise that has nothing to do with the collective.
        call: ``allreduce`` (out of place: Horovod allocates a new output tensor every call), ``allreduce_`` (in
            place, what ``hvd.DistributedOptimizer`` does), ``grouped_`` (``hvd.grouped_allreduce_`` of ``pieces``
            views: one fused response) or ``split_`` (``pieces`` separate ``allreduce_async_`` calls, then wait for
            all: how ``DistributedOptimizer`` hands over one gradient per parameter; fusion and cycle time act here).
        pieces: how many tensors ``grouped_`` / ``split_`` cut the buffer into.
        wait: ``spin`` (``hvd.synchronize``: Horovod's C++ wait loop, which spins on ``sched_yield``) or
            ``sleep`` (poll, ``time.sleep(poll_us)`` between polls, then ``synchronize``).
        compute: matmuls before the allreduce inside the timed region (a training-like step; see :func:`measure`).
        dtype: ``float32`` or ``float16`` (what fp16 compression hands over: the same elements, half the bytes).
    """

    name: str
    label: str = ""
    backend: str = "horovod"
    sync: dict | None = None
    env: dict = field(default_factory=dict)
    worker_env: dict = field(default_factory=dict)
    init: str = "horovod"
    threads: int | None = 1
    call: str = "allreduce"
    pieces: int = 1
    wait: str = "spin"
    poll_us: float = 50.0
    compute: int = 0
    dtype: str = "float32"

    def __post_init__(self) -> None:
        self.label = self.label or self.name

    def knobs(self) -> dict:
        """The knobs this variant asks for: launcher environment, then what the worker sets before ``init``."""
        base = {}
        if self.backend == "horovod" and self.sync is not None:
            from hvdsync.config import SyncConfig

            base = SyncConfig(**self.sync).horovod_env()
        return {**base, **self.env, **self.worker_env}


# ---- the loop every rank runs ------------------------------------------------------------------------------------
def measure(allreduce: Callable, barrier: Callable, rank: int, world: int, sizes_mb: list[float], iters: int,
            warmup: int, op: str, compute: int = 0, dtype: str = "float32") -> dict:
    """Time ``allreduce(buf)`` (returns the reduced tensor) per size.

    With ``compute`` > 0 the timed region is a training-like step instead: ``compute`` 256x256 matmuls (about half a
    millisecond each on one core here), then the allreduce. A Horovod background loop that burns CPU between
    allreduces then shows as a slower step, which an allreduce-only timing cannot see.

    Returns ``{"times": {size: [seconds, ...]}, "cpu": {size: [CPU seconds of this process, ...]},
    "checked": {size: iterations whose result was verified}}``. The CPU time counts every thread of the process
    (Horovod's background thread, Gloo's, a waiting thread that spins), so it shows what a wait costs the cores.

    Rank r holds ``(i % 7) + r + 1`` at element i: small integers, so the sum and the average (halves, for 2
    ranks) are exact in float32 (and float16) and the check can ask for equality; a reduction that mixes up positions
    or ranks, forgets the average, or leaves a piece unreduced is caught. A size is always ``size`` MiB of float32
    *elements*, so float16 moves half the bytes of the same gradient.
    """
    import torch

    inject = os.environ.get(INJECT_ENV) == "1"
    gen = torch.Generator().manual_seed(rank)
    a, b = torch.rand(256, 256, generator=gen), torch.rand(256, 256, generator=gen)
    times: dict[str, list[float]] = {}
    cpu: dict[str, list[float]] = {}
    faults: dict[str, list[int]] = {}
    checked: dict[str, int] = {}
    for size in sizes_mb:
        key = f"{size:g}"
        n = max(world, int(size * MB) // 4)
        pattern = (torch.arange(n, dtype=torch.int64) % 7).to(getattr(torch, dtype))
        src = pattern + float(rank + 1)
        expected = pattern * world + float(world * (world + 1) // 2)
        if op == "average":
            expected /= world
        buf = torch.empty_like(src)
        times[key], cpu[key], faults[key], checked[key] = [], [], [], 0
        for i in range(warmup + iters):
            buf.copy_(src)
            barrier()
            f0, c0, t0 = _minor_faults(), time.process_time(), time.perf_counter()
            for _ in range(compute):
                torch.mm(a, b)
            result = allreduce(buf)
            dt, dc, df = time.perf_counter() - t0, time.process_time() - c0, _minor_faults() - f0
            if inject:
                result[n // 2] += 1.0
            if result.shape != expected.shape or not torch.equal(result, expected):
                where = (result.flatten() != expected.flatten()).nonzero() if result.shape == expected.shape else None
                at = int(where[0, 0]) if where is not None and len(where) else -1
                raise AssertionError(
                    f"rank {rank}: {key} MB {op} allreduce is wrong: "
                    + (f"element {at} is {result.flatten()[at].item()}, expected {expected[at].item()}"
                       if at >= 0 else f"shape {tuple(result.shape)}, expected {tuple(expected.shape)}"))
            checked[key] += 1
            if i >= warmup:
                times[key].append(dt)
                cpu[key].append(dc)
                faults[key].append(df)
        del pattern, src, expected, buf, result
    return {"times": times, "cpu": cpu, "faults": faults, "checked": checked}


def _minor_faults() -> int:
    """Minor page faults of this process so far, all threads: a fresh buffer's pages fault in on first write, so a
    call that allocates (or whose library allocates) its output or scratch above glibc's mmap threshold shows here."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def idle_cpu(seconds: float) -> float | None:
    """Share of one core this process burns while the caller sleeps (a background loop that spins shows here)."""
    if seconds <= 0:
        return None
    c0 = time.process_time()
    time.sleep(seconds)
    return (time.process_time() - c0) / seconds


# ---- Horovod workers (started by hvdsync.launch.local.run) --------------------------------------------------------
def _horovod_worker(spec: dict, sizes_mb, iters, warmup, op, idle_s=0.0) -> dict:
    """Runs in each Horovod worker: set the variant's environment, ``init``, measure, ``shutdown``."""
    import horovod.torch as hvd
    import torch

    v = Variant(**spec)
    for k, val in v.worker_env.items():
        if val is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = str(val)
    seen = {k: os.environ[k] for k in ("HOROVOD_GLOO_IFACE", *TUNING_VARS) if k in os.environ}
    if v.init == "hvdsync":
        from hvdsync.torch.runtime import init

        init()
    else:
        hvd.init()
        if v.threads:
            torch.set_num_threads(v.threads)
    seen["torch_threads"] = torch.get_num_threads()
    hvd_op = hvd.Average if op == "average" else hvd.Sum

    def wait(handle):
        if v.wait == "sleep":
            while not hvd.poll(handle):
                time.sleep(v.poll_us * 1e-6)
        return hvd.synchronize(handle)

    def allreduce(buf):
        if v.call == "allreduce":
            return wait(hvd.allreduce_async(buf, op=hvd_op, name="bench"))
        if v.call == "allreduce_":
            return wait(hvd.allreduce_async_(buf, op=hvd_op, name="bench"))
        parts = list(buf.chunk(v.pieces))
        if v.call == "grouped_":
            wait(hvd.grouped_allreduce_async_(parts, op=hvd_op, name="bench"))
        elif v.call == "split_":
            for h in [hvd.allreduce_async_(p, op=hvd_op, name=f"bench.{i}") for i, p in enumerate(parts)]:
                wait(h)
        else:
            raise ValueError(f"call: {v.call!r}")
        return buf

    hvd.barrier()
    idle = idle_cpu(idle_s)
    got = measure(allreduce, hvd.barrier, hvd.rank(), hvd.size(), sizes_mb, iters, warmup, op, v.compute, v.dtype)
    hvd.shutdown()
    return {**got, "seen": seen, "idle_cpu": idle}


@contextlib.contextmanager
def _without_tuning_vars():
    saved = {k: os.environ.pop(k) for k in TUNING_VARS if k in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


def _run_horovod(v: Variant, sizes_mb, iters, warmup, op, np, env, idle_s) -> list[dict]:
    from hvdsync.config import SyncConfig
    from hvdsync.launch.local import run

    sync = SyncConfig(**v.sync) if v.sync is not None else None
    # The workers' log only matters when they fail, and then WorkerError carries its tail.
    with _without_tuning_vars(), tempfile.TemporaryDirectory(prefix="hvdsync-bench-") as logs:
        return run(_horovod_worker, args=(asdict(v), sizes_mb, iters, warmup, op, idle_s), np=np, sync=sync,
                   env={**v.env, **env}, progress=False, log_dir=logs)


# ---- torch.distributed workers (plain subprocesses) ------------------------------------------------------------------
def _torch_worker(rank: int, world: int, port: int, spec: dict, sizes_mb, iters, warmup, op, idle_s=0.0) -> dict:
    import torch
    import torch.distributed as dist

    v = Variant(**spec)
    if v.threads:
        torch.set_num_threads(v.threads)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)

    def allreduce(buf):
        dist.all_reduce(buf)  # SUM: Gloo has no AVG, so average the way DDP users do, by dividing
        if op == "average":
            buf.div_(world)
        return buf

    dist.barrier()
    idle = idle_cpu(idle_s)
    got = measure(allreduce, dist.barrier, rank, world, sizes_mb, iters, warmup, op, v.compute, v.dtype)
    dist.destroy_process_group()
    seen = {"GLOO_SOCKET_IFNAME": os.environ.get("GLOO_SOCKET_IFNAME"), "torch_threads": torch.get_num_threads()}
    return {**got, "seen": seen, "idle_cpu": idle}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_processes(commands: list[list[str]], env: dict, timeout: float, what: str) -> list[str]:
    """Start one process per command, wait for all (``timeout`` seconds in all), return their output; raise with
    the output's tail if any failed. On a timeout or an error, kills the ones still running (ours only)."""
    procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for cmd in commands]
    deadline, logs = time.monotonic() + timeout, []
    try:
        for p in procs:
            logs.append(p.communicate(timeout=max(1.0, deadline - time.monotonic()))[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    if any(p.returncode for p in procs):
        raise RuntimeError(f"{what} workers failed:\n" + "\n".join(logs)[-4000:])
    return logs


def _run_torch(v: Variant, sizes_mb, iters, warmup, op, np, env, idle_s, timeout: float = 1800) -> list[dict]:
    port = _free_port()
    with tempfile.TemporaryDirectory(prefix="hvdsync-bench-") as tmp:
        # Gloo picks its interface from the hostname unless told; Horovod's launcher gives its workers lo.
        child_env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", **v.env, **env}
        outs = [Path(tmp) / f"rank{rank}.json" for rank in range(np)]
        jobs = [json.dumps({"rank": rank, "world": np, "port": port, "spec": asdict(v), "sizes_mb": sizes_mb,
                            "iters": iters, "warmup": warmup, "op": op, "idle_s": idle_s}) for rank in range(np)]
        run_processes([[sys.executable, "-m", __name__, "torch-worker", job, str(out)] for job, out in zip(jobs, outs)],
                      child_env, timeout, "torch.distributed")
        return [json.loads(o.read_text()) for o in outs]


# ---- rounds, statistics ----------------------------------------------------------------------------------------------
def run_rounds(variants: list[Variant], sizes_mb: list[float], iters: int, rounds: int, warmup: int, op: str,
               np: int = 2, env: dict | None = None, idle_s: float = 0.0, log=print) -> dict:
    """Alternate the variants over ``rounds`` rounds (one worker launch per variant per round).

    Returns ``{name: {"variant", "knobs", "seen", "checked", "rounds", "cpu_rounds", "idle_cpu"}}``: ``rounds`` is
    ``[{size: [seconds, ...]}, ...]`` with each iteration's slowest rank; ``cpu_rounds`` the same for CPU seconds
    summed over the ranks (what the collective cost the machine's cores); ``fault_rounds`` the minor page faults,
    summed over the ranks (4 KiB each: fresh memory the call wrote); ``idle_cpu`` one figure per round, summed
    over the ranks, when ``idle_s`` > 0.
    """
    per_round = max(1, math.ceil(iters / rounds))
    results = {v.name: {"variant": asdict(v), "knobs": v.knobs(), "rounds": [], "cpu_rounds": [], "fault_rounds": [],
                        "idle_cpu": [], "checked": {}} for v in variants}
    for r in range(rounds):
        for v in variants[r % len(variants):] + variants[:r % len(variants)]:
            t0 = time.perf_counter()
            runner = _run_horovod if v.backend == "horovod" else _run_torch
            ranks = runner(v, sizes_mb, per_round, warmup, op, np, env or {}, idle_s)
            res = results[v.name]
            res["rounds"].append({s: [max(rk["times"][s][i] for rk in ranks) for i in range(per_round)]
                                  for s in ranks[0]["times"]})
            res["cpu_rounds"].append({s: [sum(rk["cpu"][s][i] for rk in ranks) for i in range(per_round)]
                                      for s in ranks[0]["cpu"]})
            res["fault_rounds"].append({s: [sum(rk["faults"][s][i] for rk in ranks) for i in range(per_round)]
                                        for s in ranks[0]["faults"]})
            if idle_s > 0:
                res["idle_cpu"].append(sum(rk["idle_cpu"] for rk in ranks))
            res["seen"] = ranks[0]["seen"]
            for s in ranks[0]["checked"]:
                res["checked"][s] = res["checked"].get(s, 0) + min(rk["checked"][s] for rk in ranks)
            log(f"  round {r + 1}/{rounds}: {v.name} ({time.perf_counter() - t0:.0f} s)")
    return results


if __name__ == "__main__" and len(sys.argv) == 4 and sys.argv[1] == "torch-worker":
    job = json.loads(sys.argv[2])
    result = _torch_worker(**job)
    Path(sys.argv[3]).write_text(json.dumps(result))
