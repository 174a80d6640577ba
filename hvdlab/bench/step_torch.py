"""The PyTorch training-step contenders (run inside workers started by ``training.py``).

Each one trains :func:`model` of the given :class:`~step_common.Work` with plain SGD, cross-entropy, on the same
samples, for ``warmup + steps`` steps, and returns the seconds of the timed steps and a fingerprint of its final
parameters:

* ``single``: one process, no distribution, the whole global batch per step (the reference);
* ``raw``: a hand-written Horovod loop, ``hvd.DistributedOptimizer`` as Horovod's documentation writes it;
* ``ddp``: ``torch.nn.parallel.DistributedDataParallel`` on a Gloo process group;
* ``api``: hvdsync's plain adapter API (``hvdsync.torch.init``, ``distributed_optimizer``, ``broadcast_state``) in
  the same loop as ``raw``;
* ``fit``: ``hvdsync.torch.fit`` with the model, loss and data handed in (the shared loop drives the steps).
"""
from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import nn

from hvdlab.bench.step_common import (Spec, Work, data, fingerprint, fit_config, plan, start_values, step_clock,
                                      timed_steps, wrong)


def model(work: Work) -> nn.Module:
    # Biases keep PyTorch's own (random) initialisation: from the same seed in every process, so they start equal;
    # the weights are overwritten with the framework-free start values below.
    torch.manual_seed(0)
    if work.model == "mlp":
        m = nn.Sequential(nn.Linear(work.features, work.hidden), nn.ReLU(), nn.Linear(work.hidden, work.hidden),
                          nn.ReLU(), nn.Linear(work.hidden, work.classes))
    else:
        from hvdsync.torch.models import CNN

        m = CNN(3, work.classes, width=work.hidden, channels_last=True)
    with torch.no_grad():
        for p, v in zip(m.parameters(), start_values([tuple(p.shape) for p in m.parameters()], "first_out")):
            if v is not None:
                p.copy_(torch.from_numpy(v))
    return m


def _params(m: nn.Module) -> list:
    return [p.detach().numpy() for p in m.parameters()]


def _loop(spec: Spec, m: nn.Module, opt, rank: int, sync_step=True) -> list[float]:
    """The loop of ``single``, ``raw``, ``ddp`` and ``api``: each micro-batch's mean loss weighted by its share of
    this rank's samples, so that the gradient summed over the micro-batches is this rank's mean (Horovod and DDP
    then average the ranks: the global-batch mean, as one process computes it)."""
    work = Work(**spec.work)
    x, y = data(work)
    accumulate = (spec.sync or {}).get("accumulate", 1)
    steps = plan(work, spec.world, accumulate).epoch(0, rank)

    def step(s):
        opt.zero_grad()
        n = s.local_count
        for idx in s.micro:
            loss = F.cross_entropy(m(torch.from_numpy(x[idx])), torch.from_numpy(y[idx])) * (len(idx) / n)
            loss.backward()
        opt.step()

    return timed_steps(step, steps, work.warmup)


def _result(spec: Spec, times, m, extra=None) -> dict:
    return {"times": times, "fingerprint": fingerprint(_params(m)), "threads": torch.get_num_threads(),
            **(extra or {})}


def plain_worker(spec: dict, rank: int, world: int, port: int) -> dict:
    """``single`` (world 1) and ``ddp``: plain processes, no Horovod."""
    spec = Spec(**spec)
    torch.set_num_threads(spec.threads)  # what torchrun gives (OMP_NUM_THREADS=1), or the core count for single_2t
    m = model(Work(**spec.work))
    start = fingerprint(_params(m))
    if spec.kind == "ddp":
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
        m = DistributedDataParallel(m)
        opt = torch.optim.SGD(m.parameters(), lr=Work(**spec.work).lr)
        if wrong(spec.name):
            m.require_backward_grad_sync = False  # what no_sync() sets: no gradient all-reduce
        times = _loop(spec, m, opt, rank)
        dist.destroy_process_group()
        return _result(spec, times, m.module)
    opt = torch.optim.SGD(m.parameters(), lr=Work(**spec.work).lr)
    times = _loop(spec, m, opt, 0)
    return _result(spec, times, m, {"start": start})


def horovod_worker(spec: dict) -> dict:
    """``raw``, ``api`` and ``fit``: inside Horovod workers from :func:`hvdsync.launch.local.run`."""
    import horovod.torch as hvd

    spec = Spec(**spec)
    work = Work(**spec.work)
    knobs = {k: v for k, v in os.environ.items() if k.startswith("HOROVOD_") and k in (
        "HOROVOD_FUSION_THRESHOLD", "HOROVOD_CYCLE_TIME", "HOROVOD_CACHE_CAPACITY", "HOROVOD_AUTOTUNE")}
    if spec.kind == "raw":
        hvd.init()
        torch.set_num_threads(spec.threads)
        m = model(work)
        opt = torch.optim.SGD(m.parameters(), lr=work.lr)
        if not wrong(spec.name):
            opt = hvd.DistributedOptimizer(opt, named_parameters=m.named_parameters())
        hvd.broadcast_parameters(m.state_dict(), root_rank=0)
        times = _loop(spec, m, opt, hvd.rank())
        out = _result(spec, times, m, {"knobs": knobs})
    elif spec.kind == "api":
        out = _api(spec, work, knobs)
    else:
        out = _fit(spec, work, knobs)
    hvd.shutdown()
    return out


def _api(spec: Spec, work: Work, knobs: dict) -> dict:
    import horovod.torch as hvd

    import hvdsync.torch as hs
    from hvdsync.config import Config, SyncConfig
    from hvdsync.core.comm.codecs import WireCounter

    sync = SyncConfig(**(spec.sync or {}))
    hs.init(Config(sync=sync))
    m = model(work)
    counter = WireCounter()
    opt = hs.distributed_optimizer(torch.optim.SGD(m.parameters(), lr=work.lr), m, sync, counter=counter)
    hs.broadcast_state(m, opt)
    counter.reset()
    times = _loop(spec, m, opt, hvd.rank())
    steps = work.warmup + work.steps
    n_tensors = sum(1 for _ in m.parameters())
    return _result(spec, times, m, {"knobs": knobs, "bytes_per_step": counter.bytes / steps,
                                    "allreduce_rounds_per_step": counter.tensors / n_tensors / steps})


def _fit(spec: Spec, work: Work, knobs: dict) -> dict:
    import hvdsync.torch as hs
    from hvdsync.core.train.data import Dataset

    x, y = data(work)
    cfg = fit_config(spec, work)
    times, params = [], []
    m = model(work)
    hs.fit(cfg, data=Dataset(x, y, x[:8], y[:8], work.classes), model=m, loss=F.cross_entropy,
           callbacks=[step_clock(work.warmup, times, params)])
    return {"times": times, "fingerprint": fingerprint(params), "threads": torch.get_num_threads(), "knobs": knobs}
