"""The contenders of ``benchmarks/models.py`` (PyTorch), run inside their workers: hvdsync's adapter API, tuned DDP,
and the model's compute alone.

Every contender times the same step, the whole of it: the clock starts before the step's batch is made (the data
fetch: :func:`hvdlab.torch.real_models.batch`, a fresh synthetic batch per step and rank) and stops after the
optimizer's update, so everything either side does in a step is inside it (hvdsync's adapter API has no callbacks
of its own; whatever its optimizer runs at ``step()`` is timed). A step's time is the slowest rank's. Every worker
reads, from inside, where it runs and with how many threads (:func:`hvdlab.bench.link_fair.placement`).

* ``hvdsync``: ``hvdsync.torch.init``, ``distributed_optimizer`` (the codec under test) and ``broadcast_state`` in a
  loop of the user's, in Horovod workers from :func:`hvdsync.launch.run`: what hvdsync's users write.
* ``ddp``: ``DistributedDataParallel`` with ``gradient_as_bucket_view=True`` and ``static_graph=True`` (every
  parameter gets a gradient every step in both models, so the static graph is valid), ``bucket_cap_mb`` as asked
  (:func:`ddp_worker` times several in one job when the runner tunes it); ``fp16`` is DDP's
  ``fp16_compress_hook``. The same allocator setting as hvdsync's workers (``train.keep_freed_memory``) and the
  intra-op threads hvdsync's rule gives (:func:`hvdsync.core.train.seeding.threads_per_worker`).
* ``compute``: one process, no synchronisation: the step's compute, against which the ring time is set
  (:mod:`hvdlab.bench.sizing`).
"""
from __future__ import annotations

import time

CODECS = ("none", "fp16")   # DDP's matching hook for each: none (its own fp32 all-reduce), fp16_compress_hook


def _timed(step, spec: dict, rank: int, world: int) -> list[float]:
    """``warmup + steps`` steps, each with its data fetch inside the clock; the timed steps' seconds."""
    from hvdlab.torch import real_models

    name, size, batch = spec["model"], spec["size"], spec["batch"]
    times = []
    for i in range(spec["warmup"] + spec["steps"]):
        t0 = time.perf_counter()
        step(real_models.batch(name, size, batch, seed=spec["seed"] * 100_003 + i * world + rank))
        times.append(time.perf_counter() - t0)
    return times[spec["warmup"]:]


def _sgd(model, spec: dict):
    import torch

    return torch.optim.SGD(model.parameters(), lr=spec.get("lr", 0.01), momentum=0.9)


def _step(name: str, model, opt):
    from hvdlab.torch import real_models

    def step(b):
        opt.zero_grad()   # Horovod's optimizer takes no set_to_none; torch's default sets None too
        real_models.loss(name, model, b).backward()
        opt.step()

    return step


def _slowest(per_rank: list[list[float]]) -> list[float]:
    return [max(ts) for ts in zip(*per_rank)]


def hvdsync_worker(spec: dict) -> dict:
    """In each Horovod worker: hvdsync's adapter API on the model; every rank returns the slowest rank's step
    times and every rank's placement."""
    import horovod.torch as hvd
    import torch

    import hvdsync.torch as hs
    from hvdlab.bench.link_fair import placement
    from hvdlab.torch import real_models
    from hvdsync.config import Config

    cfg = Config.from_dict({"sync": {"compression": spec["codec"]}, "train": {"seed": spec["seed"], "device": "cpu"}})
    info = hs.init(cfg)
    torch.manual_seed(spec["seed"])
    model = real_models.build(spec["model"])
    opt = hs.distributed_optimizer(_sgd(model, spec), model, cfg.sync)
    hs.broadcast_state(model, opt)
    times = _timed(_step(spec["model"], model, opt), spec, info.rank, info.size)
    gathered = hvd.allgather_object({"times": times, "placement": placement("torch")})
    hvd.shutdown()
    return {"steps_s": _slowest([g["times"] for g in gathered]), "placement": [g["placement"] for g in gathered]}


def ddp_worker(rank: int, world: int, master: str, port: int, spec: dict, caps: list[float],
               threads: int) -> dict:
    """One rank of DDP: a fresh DDP model per entry of ``caps`` (bucket sizes, MB), each timed in turn; returns
    ``{"by_cap": {cap: slowest rank's step times, every pass of that size}, "placement": [...]}``."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from hvdlab.bench.link_fair import placement
    from hvdlab.torch import real_models
    from hvdsync.core.train.runtime import keep_freed_memory

    if spec["codec"] not in CODECS:
        raise ValueError(f"codec: {spec['codec']!r} is not allowed for DDP here; choose one of: {', '.join(CODECS)}")
    keep_freed_memory()   # as hvdsync's init does for its workers (train.keep_freed_memory's default)
    torch.set_num_threads(threads)
    dist.init_process_group("gloo", init_method=f"tcp://{master}:{port}", rank=rank, world_size=world)
    by_cap = {}
    try:
        for cap in caps:
            torch.manual_seed(spec["seed"])
            model = DistributedDataParallel(real_models.build(spec["model"]), bucket_cap_mb=cap,
                                            gradient_as_bucket_view=True, static_graph=True)
            if spec["codec"] == "fp16":
                from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

                model.register_comm_hook(None, default_hooks.fp16_compress_hook)
            opt = _sgd(model, spec)
            times = _timed(_step(spec["model"], model, opt), spec, rank, world)
            every: list = [None] * world
            dist.all_gather_object(every, times)
            by_cap[str(cap)] = by_cap.get(str(cap), []) + _slowest(every)   # a size listed twice: both passes
        where: list = [None] * world
        dist.all_gather_object(where, placement("torch"))
    finally:
        dist.destroy_process_group()
    return {"by_cap": by_cap, "placement": where}


def compute_worker(spec: dict, threads: int) -> dict:
    """One process, no synchronisation: the step's compute (data fetch, forward, backward, update)."""
    import torch

    from hvdlab.bench.link_fair import placement
    from hvdlab.torch import real_models

    torch.set_num_threads(threads)
    torch.manual_seed(spec["seed"])
    model = real_models.build(spec["model"])
    times = _timed(_step(spec["model"], model, _sgd(model, spec)), spec, 0, 1)
    params, tensors = real_models.gradient_tensors(model)
    return {"steps_s": times, "parameters": params, "tensors": tensors, "placement": [placement("torch")]}
