"""PyTorch DDP with its own communication hooks, on the same model, data and link as the hvdsync runs of
``benchmarks/link.py``: the peer an hvdsync codec is held to (step time ratio <= 1.0).

One process per test host joins a ``torch.distributed`` Gloo group over the limited link (``GLOO_SOCKET_IFNAME``)
and trains the wide MLP with :class:`torch.nn.parallel.DistributedDataParallel` under one of :data:`HOOKS`:
``ddp`` (DDP's own fp32 all-reduce), ``ddp-fp16`` (``default_hooks.fp16_compress_hook``) or ``ddp-powersgd:<rank>``
(``powerSGD_hook``, error feedback on, every matrix compressed). What hvdsync's runs get, DDP gets:

* the same samples in the same order: each rank reads its share of every global step of hvdsync's shuffled plan
  (:class:`hvdsync.torch.ShardPlan` from the same seed, :func:`order`), where it used to read every
  ``size``-th sample unshuffled;
* the same start: the model built as hvdsync's ``mlp`` after ``torch.manual_seed(seed)``, the data set from the same
  seed, the same lr and batch;
* the same allocator: hvdsync's workers keep what a step frees for the next (``train.keep_freed_memory``,
  :func:`hvdsync.core.train.runtime.keep_freed_memory`); DDP's ranks get the same setting from the same config, so
  neither side pays page faults the other does not;
* the same PowerSGD warm-up, none: hvdsync compresses from its first step. DDP's hook allows no fewer than 2
  uncompressed iterations with error feedback (``start_powerSGD_iter >= 2``: DDP rebuilds its buckets after the first
  one), so before training every hook is primed with :data:`PRIMING` forward and backward passes and no optimizer
  step: the parameters stay as they were, the hook's counter reaches ``start_powerSGD_iter``, and the first training
  step is compressed, as on hvdsync's side.

The step time is the slowest rank's mean over the epochs after the first. Every rank reports where it ran
(:func:`hvdlab.bench.link_fair.placement`).
"""
from __future__ import annotations

import statistics
import time

import numpy as np

from hvdlab.testhosts import own_link_bytes

HOOKS = ("ddp", "ddp-fp16", "ddp-powersgd:2", "ddp-powersgd:4")
START_POWERSGD_ITER = 2  # the least DDP allows with error feedback
PRIMING = START_POWERSGD_ITER  # untimed passes without an optimizer step: the hook then compresses from step one


def _sent(interface: str) -> int:
    return own_link_bytes(interface)["tx_bytes"]


def _hook(model, name: str):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    if name == "ddp":
        return
    if name == "ddp-fp16":
        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
        return
    if name.startswith("ddp-powersgd:"):
        rank = int(name.split(":", 1)[1])
        # DDP's default waits 1,000 steps, longer than this run; PRIMING passes use up the 2 it needs at least.
        # min_compression_rate=1 compresses every matrix, as hvdsync's PowerSGD does.
        state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=rank,
                                            start_powerSGD_iter=START_POWERSGD_ITER, min_compression_rate=1,
                                            use_error_feedback=True, warm_start=True)
        model.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
        return state
    raise ValueError(f"hook: {name!r} is not allowed; choose one of: {', '.join(HOOKS)} (any PowerSGD rank)")


def order(samples: int, size: int, batch: int, seed: int, epoch: int, rank: int) -> list[np.ndarray]:
    """The sample indices ``rank`` reads at each step of ``epoch``: its share of hvdsync's plan for the same seed."""
    from hvdsync.core.train._plan import ShardPlan

    return [s.indices for s in ShardPlan(samples, size, batch, seed=seed).epoch(epoch, rank)]


def prime(model, x, y) -> None:
    """:data:`PRIMING` forward and backward passes through ``model`` (DDP: its hook runs on each) with no optimizer
    step, the gradients dropped: the parameters do not change."""
    import torch

    for _ in range(PRIMING):
        model.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x), y).backward()
    model.zero_grad(set_to_none=True)


def fit(rank: int, size: int, master: str, port: int, hooks: list[str], data: dict, train: dict,
        threads: int, interface: str = "hv0", seed: int = 0, probe: bool = False) -> dict:
    """Train once per hook in ``hooks`` from the same start; returns ``{"runs": [...], "placement": [...]}``: per
    hook its step time (s, slowest rank), steps, test accuracy (rank 0's; identical on every rank) and the bytes
    this host sent on ``interface``; every rank's placement. ``probe``: only the placement, nothing trained."""
    import torch
    import torch.distributed as dist
    from torch import nn

    from hvdlab.bench.link_fair import placement
    from hvdsync.core.train.data import synthetic
    from hvdsync.core.train.runtime import keep_freed_memory
    from hvdsync.torch.models import mlp

    if train.get("keep_freed_memory", True):   # as hvdsync's init does for its workers, before anything is built
        keep_freed_memory()
    torch.set_num_threads(threads)
    dist.init_process_group("gloo", init_method=f"tcp://{master}:{port}", rank=rank, world_size=size)
    out: list[dict] = []
    try:
        where: list = [None] * size
        dist.all_gather_object(where, placement("torch"))
        if probe:
            return {"runs": out, "placement": where}
        ds = synthetic(data["synthetic_samples"], data["synthetic_features"], data["synthetic_classes"],
                       data["test_fraction"], seed, data["synthetic_spread"])
        x, y = torch.from_numpy(ds.x_train), torch.from_numpy(ds.y_train)
        batch = data["batch_size"]
        for name in hooks:
            torch.manual_seed(seed)   # as hvdsync's init does before it builds the model
            net = mlp(ds.n_features, train["hidden"], ds.n_classes)
            model = nn.parallel.DistributedDataParallel(net)   # broadcasts rank 0's parameters
            _hook(model, name)
            first = order(len(y), size, batch, seed, 0, rank)[0]
            prime(model, x[first], y[first])
            opt = torch.optim.SGD(model.parameters(), lr=train["lr"], momentum=train["momentum"])
            epochs, steps, sent = [], 0, _sent(interface)
            for epoch in range(train["epochs"]):
                times = []
                for idx in order(len(y), size, batch, seed, epoch, rank):
                    t0 = time.perf_counter()
                    opt.zero_grad()
                    nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
                    opt.step()
                    times.append(time.perf_counter() - t0)
                    steps += 1
                epochs.append(statistics.fmean(times))
            step = torch.tensor([statistics.fmean(epochs[1:] or epochs)])
            dist.all_reduce(step, op=dist.ReduceOp.MAX)
            with torch.no_grad():
                correct = (net(torch.from_numpy(ds.x_test)).argmax(1) == torch.from_numpy(ds.y_test)).float().mean()
            out.append({"compression": name, "step_s": float(step), "steps": steps, "accuracy": float(correct),
                        "link_bytes": _sent(interface) - sent, "seed": seed, "test_samples": len(ds.y_test),
                        "numel": sum(p.numel() for p in net.parameters())})
        dist.all_gather_object(where, placement("torch"))
    finally:
        dist.destroy_process_group()
    return {"runs": out, "placement": where}
